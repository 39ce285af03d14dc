"""Training a cache fuser: frozen Receiver and Sharer, next-token loss on the Receiver's response tokens.

One example, shapes per layer::

    context ids  (T,)  both models read the system + user messages, each with its own template
    receiver cache     [1, H_r, T, D_r]     Receiver prefill, no grad
    sharer entries     [1, H_s, T, D_s]     precomputed, aligned to the Receiver's tokens (fp16 on disk)
    fused cache        [1, H_r, T, D_r]     fuser(receiver, sharer), Gumbel-sigmoid gates at temperature tau
    tail ids     (P+R,) the Receiver's generation prompt (P) and the response (R)
    logits       (P+R, V)  Receiver forward of the tail after the fused cache, with grad
    loss               cross-entropy of logits[P-1 : P+R-1] against the R response tokens

Only the tail is back-propagated through the Receiver, so an example costs one
no-grad prefill plus a short forward/backward. The run is seeded and resumable:
``train_state/`` holds the weights, AdamW moments, step, loss history and the
Gumbel generator's state, written atomically every ``save_every`` steps, and
the data order is a function of (seed, epoch) only.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import time
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file
from tqdm import tqdm

from c2c.canon import canonical_json, sha256_hex
from c2c.config import c2c_home
from c2c.errors import ConfigError, FuserCheckpointError
from c2c.fuser import checkpoint as ckpt
from c2c.fuser.align import layer_map as make_layer_map
from c2c.fuser.align import render
from c2c.fuser.data import Example, iter_nonempty, mixture
from c2c.fuser.infer import side_record
from c2c.fuser.model import CacheFuser, FuserConfig
from c2c.fuser.precompute import SharerStore, precompute
from c2c.runtime import zoo
from c2c.runtime.protocol import Gradients, require


@dataclass(frozen=True, kw_only=True)
class TrainConfig:
    """One training run (a JSON file; see ``configs/fuser/``).

    ``sharer`` is a zoo name, or ``"self"`` for a control fuser fed the Receiver's
    own cache. ``sources`` gives how many examples to draw from each training source.
    Relative ``out_dir`` / ``cache_dir`` live under ``C2C_HOME/fuser/``.
    """

    name: str
    receiver: str
    sharer: str
    sources: dict[str, int]
    out_dir: str = ""
    cache_dir: str = "precompute"
    data_root: str = ""
    max_context_tokens: int = 256
    max_response_tokens: int = 48
    hidden: int = 128
    gate_init: float = 2.0
    layer_map: Any = "terminal"
    epochs: float = 1.0
    grad_accum: int = 8
    lr: float = 1e-3
    weight_decay: float = 0.0
    warmup_steps: int = 10
    tau_start: float = 1.0
    tau_end: float = 0.1
    seed: int = 0
    save_every: int = 20
    device: str = "auto"
    dtype: str = "float32"
    gate_lr_mult: float = 1.0   # the gate logits' learning rate, as a multiple of lr
    mc_response: str = "label"  # multiple-choice targets: "label" ("B") or "label_text" ("B. text")

    @classmethod
    def from_file(cls, path: str | Path) -> "TrainConfig":
        try:
            d = json.loads(Path(path).read_text())
        except (OSError, ValueError) as e:
            raise ConfigError(f"cannot read training config {path}: {e}") from None
        return cls.from_dict(d)

    @classmethod
    def from_dict(cls, d: dict) -> "TrainConfig":
        known = {f.name for f in fields(cls)}
        d = {k: v for k, v in d.items() if not k.startswith("_")}  # "_comment" keys are allowed
        unknown = set(d) - known
        if unknown:
            raise ConfigError(f"unknown training config keys {sorted(unknown)}; known: {sorted(known)}")
        try:
            cfg = cls(**d)
        except TypeError as e:
            raise ConfigError(f"bad training config: {e}") from None
        if cfg.grad_accum < 1 or cfg.epochs <= 0 or not cfg.sources or cfg.tau_end <= 0 or cfg.tau_start <= 0:
            raise ConfigError("grad_accum >= 1, epochs > 0, tau > 0 and a non-empty sources map are required")
        return cfg

    @classmethod
    def from_checkpoint(cls, meta: ckpt.FuserMeta) -> "TrainConfig":
        """The config a checkpoint was trained with (its ``train`` record, less the run's own facts)."""
        known = {f.name for f in fields(cls)}
        return cls.from_dict({k: v for k, v in meta.train.items() if k in known})

    def to_dict(self) -> dict:
        return asdict(self)

    def out_path(self) -> Path:
        p = Path(self.out_dir or f"runs/{self.name}").expanduser()
        return p if p.is_absolute() else c2c_home() / "fuser" / p

    def cache_path(self) -> Path:
        p = Path(self.cache_dir).expanduser()
        return p if p.is_absolute() else c2c_home() / "fuser" / p

    def resume_key(self) -> str:
        """What must not change between a run and its resumption (device and paths may)."""
        d = self.to_dict()
        for k in ("out_dir", "cache_dir", "data_root", "device", "save_every"):
            d.pop(k)
        for k, default in _ADDED_LATER.items():  # so that runs started before they existed still resume
            if d[k] == default:
                d.pop(k)
        return sha256_hex(canonical_json(d))


# Fields added after the first runs, with the default that reproduces the old behaviour.
_ADDED_LATER = {"gate_lr_mult": 1.0, "mc_response": "label"}


@dataclass(frozen=True, kw_only=True)
class Tokenized:
    """An example in the Receiver's tokens: context (fused) and tail (generation prompt + response)."""

    context: tuple[int, ...]
    tail: tuple[int, ...]
    n_prompt: int


@dataclass
class TrainState:
    step: int = 0
    losses: list[float] = field(default_factory=list)
    seconds: float = 0.0


def resolve_device(device: str) -> str:
    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    return device


class Trainer:
    """Builds everything a run needs from a :class:`TrainConfig` and trains, resumably.

    ``receiver`` / ``sharer`` may be passed in (tests use tiny models); otherwise
    they are loaded from the zoo by name.
    """

    def __init__(self, cfg: TrainConfig, *, receiver=None, sharer=None, examples: list[Example] | None = None,
                 progress: bool = True):

        self.cfg = cfg
        self.progress = progress
        self.device = resolve_device(cfg.device)
        self.receiver = receiver or zoo.load(cfg.receiver, device=self.device, dtype=cfg.dtype)
        self.control = cfg.sharer == ckpt.SELF
        self.out = cfg.out_path()
        rf = self.receiver.facts
        raw = examples if examples is not None else mixture(cfg.sources, seed=cfg.seed, root=cfg.data_root or None,
                                                            mc_style=cfg.mc_response)
        self.data = self._tokenize(list(iter_nonempty(raw)))
        if not self.data:
            raise ConfigError("no training example fits max_context_tokens; raise it or add sources")
        self.examples = [e for e, _ in self.data]
        self.tokens = [t for _, t in self.data]
        if self.control:
            lmap = make_layer_map(cfg.layer_map, rf.num_layers, rf.num_layers)
            s_heads, s_dim = rf.kv_heads, rf.head_dim
            self.sharer_record = {"name": ckpt.SELF}
            self.store: SharerStore | None = None
        else:
            sharer = sharer or zoo.load(cfg.sharer, device=self.device, dtype=cfg.dtype)
            sf = sharer.facts
            lmap = make_layer_map(cfg.layer_map, rf.num_layers, sf.num_layers)
            s_heads, s_dim = sf.kv_heads, sf.head_dim
            self.sharer_record = side_record(sharer)
            self.store = precompute(self.examples, sharer=sharer, receiver=self.receiver, layer_map=lmap,
                                    root=cfg.cache_path(), progress=progress)
            del sharer  # training never needs the Sharer again
        self.fcfg = FuserConfig(receiver_layers=rf.num_layers, receiver_kv_heads=rf.kv_heads,
                                receiver_head_dim=rf.head_dim, sharer_kv_heads=s_heads, sharer_head_dim=s_dim,
                                layer_map=lmap, hidden=cfg.hidden, gate_init=cfg.gate_init)
        torch.manual_seed(cfg.seed)
        self.fuser = CacheFuser(self.fcfg).to(self.device)
        params = list(self.fuser.named_parameters())
        groups = [{"params": [p for n, p in params if not n.endswith("gate_logit")], "lr_mult": 1.0}]
        gates = {"params": [p for n, p in params if n.endswith("gate_logit")], "lr_mult": cfg.gate_lr_mult}
        if cfg.gate_lr_mult == 1.0:
            groups = [{"params": [p for _, p in params], "lr_mult": 1.0}]
        else:  # NOTE: the gate is one scalar per projector; a larger step lets it close within a short run
            groups.append(gates)
        self.opt = torch.optim.AdamW(groups, lr=cfg.lr, weight_decay=cfg.weight_decay)
        self.gen = torch.Generator().manual_seed(cfg.seed)
        self.total_steps = max(1, math.ceil(len(self.tokens) * cfg.epochs / cfg.grad_accum))
        self.state = TrainState()
        if (self.out / "train_state" / "state.json").is_file():
            self._resume()

    # ------------------------------------------------------------ data
    def _tokenize(self, examples: list[Example]) -> list[tuple[Example, Tokenized]]:
        r = self.receiver
        prompt = r.encode(r.generation_prompt())
        out = []
        for e in examples:
            ctx = render(r, e.message_dicts()).ids
            resp = r.encode(e.response)[: self.cfg.max_response_tokens]
            if len(ctx) <= self.cfg.max_context_tokens and resp:
                out.append((e, Tokenized(context=tuple(ctx), tail=tuple(prompt + resp), n_prompt=len(prompt))))
        return out

    def order(self, n: int) -> int:
        """The example used as the ``n``-th draw of the run: a fresh permutation per epoch."""
        N = len(self.tokens)
        epoch, pos = divmod(n, N)
        g = torch.Generator().manual_seed(self.cfg.seed * 100_003 + epoch)
        return int(torch.randperm(N, generator=g)[pos])

    # ----------------------------------------------------------- schedule
    def tau(self, step: int) -> float:
        c = self.cfg
        return c.tau_start * (c.tau_end / c.tau_start) ** min(step / self.total_steps, 1.0)

    def lr(self, step: int) -> float:
        c = self.cfg
        if step < c.warmup_steps:
            return c.lr * (step + 1) / c.warmup_steps
        frac = (step - c.warmup_steps) / max(1, self.total_steps - c.warmup_steps)
        return c.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(frac, 1.0))))

    # --------------------------------------------------------------- loss
    def example_loss(self, i: int, tau: float | None) -> torch.Tensor:
        """Next-token loss on example ``i``'s response tokens, given the fused context cache."""
        t = self.tokens[i]
        _, cache = self.receiver.prefill(list(t.context))                # no grad (inference mode)
        keys = [k.clone() for k in cache.keys]                           # [1, H_r, T, D_r] per layer
        values = [v.clone() for v in cache.values]
        if self.store is None:   # control: the Receiver's own cache in place of the Sharer's
            sk = [keys[s] for _, s in self.fcfg.layer_map]
            sv = [values[s] for _, s in self.fcfg.layer_map]
        else:
            ids, sk, sv = self.store.get(i, device=self.device)          # [1, H_s, T, D_s] per mapped layer
            if tuple(ids) != t.context:
                raise FuserCheckpointError("the precomputed store disagrees with the tokenized data; delete "
                                           f"{self.store.path} and run again")
        fk, fv = self.fuser(keys, values, sk, sv, tau=tau, generator=self.gen)

        fused = replace(cache, keys=tuple(fk), values=tuple(fv))
        logits = require(self.receiver, Gradients).logits_with_grad(list(t.tail), fused)    # (P+R, V)
        target = torch.tensor(t.tail[t.n_prompt:], device=logits.device)  # (R,)
        return F.cross_entropy(logits[t.n_prompt - 1: -1], target)

    def held_out_losses(self) -> list[float]:
        """Each example's loss with the current weights and hard gates (as at inference), no grad, in data order:
        the held-out loss when the examples were never trained on."""
        self.fuser.eval()
        out = []
        with torch.no_grad():
            for i in tqdm(range(len(self.tokens)), desc=f"held-out loss {self.cfg.name}", unit="ex",
                          disable=not self.progress):
                out.append(float(self.example_loss(i, None)))
        return out

    def load_weights(self, path: str | Path) -> ckpt.FuserMeta:
        """Put a checkpoint's weights into this run's fuser; it must have this run's shape and Sharer."""
        fuser, meta = ckpt.load(path, device=self.device)
        if meta.fuser != self.fcfg or meta.sharer.get("name") != self.sharer_record.get("name"):
            raise FuserCheckpointError(f"{path} holds a fuser for {meta.sharer.get('name')} with another shape or "
                                       f"Sharer than this run ({self.sharer_record.get('name')}); build the run from "
                                       "that checkpoint's own training config")
        self.fuser.load_state_dict(fuser.state_dict())
        return meta

    # --------------------------------------------------------------- loop
    def train(self, until: int | None = None) -> TrainState:
        """Train to step ``until`` (default: the end of the schedule), saving as it goes."""
        stop = self.total_steps if until is None else min(until, self.total_steps)
        A = self.cfg.grad_accum
        self.fuser.train()
        log = self.out / "train_log.jsonl"
        self.out.mkdir(parents=True, exist_ok=True)
        bar = tqdm(total=stop, initial=self.state.step, desc=f"train {self.cfg.name}", unit="step",
                   disable=not self.progress)
        while self.state.step < stop:
            step, t0 = self.state.step, time.perf_counter()
            for g in self.opt.param_groups:
                g["lr"] = self.lr(step) * g.get("lr_mult", 1.0)
            tau = self.tau(step)
            self.opt.zero_grad(set_to_none=True)
            total = 0.0
            for j in range(A):
                loss = self.example_loss(self.order(step * A + j), tau) / A
                loss.backward()
                total += loss.item()
            torch.nn.utils.clip_grad_norm_(self.fuser.parameters(), 1.0)
            self.opt.step()
            self.state.step += 1
            self.state.losses.append(total)
            self.state.seconds += time.perf_counter() - t0
            with open(log, "a") as f:
                f.write(json.dumps({"step": self.state.step, "loss": total, "lr": self.lr(step), "tau": tau,
                                    "seconds": round(self.state.seconds, 2)}) + "\n")
            bar.update(1)
            recent = self.state.losses[-20:]
            bar.set_postfix(loss=f"{sum(recent) / len(recent):.4f}", tau=f"{tau:.2f}")
            if self.state.step % self.cfg.save_every == 0 or self.state.step == stop:
                self.save()
        bar.close()
        return self.state

    # ---------------------------------------------------------- save/resume
    def meta(self) -> ckpt.FuserMeta:
        return ckpt.FuserMeta(fuser=self.fcfg, receiver=side_record(self.receiver), sharer=self.sharer_record,
                              alignment={"tokens": "receiver-base, last covering sharer token",
                                         "layers": self.cfg.layer_map if isinstance(self.cfg.layer_map, str)
                                         else "explicit"},
                              train={**self.cfg.to_dict(), "examples": len(self.tokens),
                                     "total_steps": self.total_steps, "seconds": round(self.state.seconds, 1)},
                              step=self.state.step)

    def save(self) -> None:
        """Write the release checkpoint and, atomically, ``train_state/`` for resuming."""
        ckpt.save(self.out, self.fuser, self.meta())
        tmp = self.out / ".train_state.tmp"
        if tmp.exists():
            shutil.rmtree(tmp)
        tmp.mkdir(parents=True)
        save_file({k: v.detach().cpu().contiguous() for k, v in self.fuser.state_dict().items()},
                  str(tmp / "fuser.safetensors"))
        opt = self.opt.state_dict()
        tensors = {"gumbel_generator": self.gen.get_state()}
        for idx, st in opt["state"].items():
            for k, v in st.items():
                tensors[f"opt.{idx}.{k}"] = (v if torch.is_tensor(v) else torch.tensor(v)).detach().cpu().contiguous()
        save_file(tensors, str(tmp / "optimizer.safetensors"))
        (tmp / "state.json").write_text(json.dumps({
            "resume_key": self.cfg.resume_key(), "step": self.state.step, "losses": self.state.losses,
            "seconds": self.state.seconds, "param_groups": opt["param_groups"]}))
        final, old = self.out / "train_state", self.out / ".train_state.old"
        if final.exists():
            os.replace(final, old)
        os.replace(tmp, final)
        if old.exists():
            shutil.rmtree(old)

    def _resume(self) -> None:
        d = self.out / "train_state"
        try:
            st = json.loads((d / "state.json").read_text())
            weights = load_file(str(d / "fuser.safetensors"))
            tensors = load_file(str(d / "optimizer.safetensors"))
        except Exception as e:  # noqa: BLE001 - any unreadable state is the same problem for the user
            raise FuserCheckpointError(f"cannot resume from {d}: {e}; delete it to start over") from None
        if st.get("resume_key") != self.cfg.resume_key():
            raise FuserCheckpointError(f"{self.out} holds a run with a different config; use another out_dir "
                                       "or delete it to start over")
        self.fuser.load_state_dict(weights)
        state: dict[int, dict[str, torch.Tensor]] = {}
        for name, t in tensors.items():
            if name.startswith("opt."):
                _, idx, key = name.split(".", 2)
                state.setdefault(int(idx), {})[key] = t.to(self.device) if key != "step" else t
        self.opt.load_state_dict({"state": state, "param_groups": st["param_groups"]})
        self.gen.set_state(tensors["gumbel_generator"])
        self.state = TrainState(step=int(st["step"]), losses=list(st["losses"]), seconds=float(st["seconds"]))
        log = self.out / "train_log.jsonl"
        if log.is_file():  # drop steps logged after the last save: they are about to be redone
            keep = [line for line in log.read_text().splitlines() if json.loads(line)["step"] <= self.state.step]
            log.write_text("".join(line + "\n" for line in keep))
