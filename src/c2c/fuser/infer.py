"""Inference: the Receiver answers from a cache fused with one or more Sharers' caches.

Both models read the same context messages, each with its own template. The
Sharer's cache is aligned to the Receiver's tokens (:mod:`c2c.fuser.align`),
every trained fuser is applied in turn (hard gates), and the Receiver continues
from the fused cache: the generation prompt and the answer are the Receiver's
own tokens. A fused cache can be exported as a c2c artifact whose fingerprint
names the fusers and Sharers in ``adapters``, so it never passes for a plain
Receiver cache.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Sequence

import numpy as np
import torch

from c2c.artifact import Artifact
from c2c.artifact.fingerprint import Fingerprint
from c2c.artifact.prefix import PrefixRef
from c2c.errors import FuserCheckpointError
from c2c.fuser import checkpoint as ckpt
from c2c.fuser.align import LayerMap, Rendered, align_tokens, render
from c2c.fuser.model import CacheFuser
from c2c.runtime import zoo
from c2c.runtime.kvcache import KVCache


def aligned_sharer(sharer_cache: KVCache, index: np.ndarray, layer_map: LayerMap,
                   receiver_windows: Sequence[int | None]) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """Sharer K/V gathered onto the Receiver's tokens, one pair per ``layer_map`` entry.

    Args:
        sharer_cache: the Sharer's cache of its own rendering, ``[1, H_s, T_s(l), D_s]`` per layer.
        index: ``(T_r,)`` Sharer token index for each Receiver token (:func:`align_tokens`).
        layer_map: (receiver_layer, sharer_layer) pairs.
        receiver_windows: per Receiver layer sliding window or None; a sliding layer
            holds only its last tokens, and so does its aligned entry.

    Returns:
        keys, values: ``[1, H_s, T_r(l), D_s]`` tensors. A Receiver token whose Sharer
        token fell out of a Sharer sliding window gets zeros.
    """
    T_r, T_s = len(index), sharer_cache.seq_len
    keys, values = [], []
    for r, s in layer_map:
        keep = KVCache.layer_length(T_r, receiver_windows[r])
        held = sharer_cache.keys[s].shape[2]  # the sharer layer holds tokens [T_s - held, T_s)
        local = torch.as_tensor(index[T_r - keep:] - (T_s - held), dtype=torch.long,
                                device=sharer_cache.keys[s].device)   # (keep,)
        ok = (local >= 0).view(1, 1, -1, 1)
        k = sharer_cache.keys[s].index_select(2, local.clamp(min=0)) * ok   # [1, H_s, keep, D_s]
        v = sharer_cache.values[s].index_select(2, local.clamp(min=0)) * ok
        keys.append(k)
        values.append(v)
    return keys, values


@dataclass
class Link:
    """One trained fuser and its Sharer (``sharer is None`` for a control fuser: the Receiver itself)."""

    fuser: CacheFuser
    meta: ckpt.FuserMeta
    sharer: object | None  # a c2c Runtime

    @property
    def sharer_name(self) -> str:
        return self.meta.sharer.get("name", "")

    def sharer_context(self, messages: Sequence[dict]) -> tuple[Rendered, KVCache]:
        """The Sharer's rendering of ``messages`` and its cache of it."""
        rendered = render(self.sharer, messages)
        _, cache = self.sharer.prefill(list(rendered.ids))
        return rendered, cache


@dataclass(frozen=True, kw_only=True)
class Fused:
    """A fused context cache, the Receiver's rendering it covers, and where the time went (seconds)."""

    cache: KVCache
    rendered: Rendered
    timings: dict[str, float] = field(default_factory=dict)


class FusedReceiver:
    """A Receiver plus one or more fusers; :meth:`fuse` builds the fused context cache."""

    def __init__(self, receiver, links: Sequence[Link]):
        self.receiver = receiver
        self.links = list(links)
        for link in self.links:
            _check_receiver(link.meta, receiver)
            if link.sharer is not None:
                _check_side(link.meta.sharer, link.sharer, "sharer")

    @classmethod
    def load(cls, checkpoints: Sequence[str | Path], *, receiver=None, sharers: dict | None = None,
             device: str = "cpu", dtype: str = "float32") -> "FusedReceiver":
        """Load fusers from checkpoint dirs, and the models they name from the zoo (unless given)."""

        links: list[Link] = []
        sharers = dict(sharers or {})
        for path in checkpoints:
            fuser, meta = ckpt.load(path, device=device)
            if receiver is None:
                receiver = zoo.load(meta.receiver["name"], device=device, dtype=dtype)
            name = meta.sharer["name"]
            sharer = None
            if name != ckpt.SELF:
                if name not in sharers:
                    sharers[name] = zoo.load(name, device=device, dtype=dtype)
                sharer = sharers[name]
            links.append(Link(fuser=fuser, meta=meta, sharer=sharer))
        if receiver is None:
            raise FuserCheckpointError("no fuser checkpoint given")
        return cls(receiver, links)

    # ------------------------------------------------------------------ fuse
    def receiver_context(self, messages: Sequence[dict]) -> tuple[Rendered, KVCache]:
        rendered = render(self.receiver, messages)
        _, cache = self.receiver.prefill(list(rendered.ids))
        return rendered, cache

    @torch.inference_mode()
    def fuse(self, messages: Sequence[dict], *, context: tuple[Rendered, KVCache] | None = None,
             sharer_contexts: dict[str, tuple[Rendered, KVCache]] | None = None) -> Fused:
        """Fuse every Sharer into the Receiver's cache of ``messages``.

        ``context`` / ``sharer_contexts`` (by sharer name) may pass caches already
        computed (the evaluator shares them between conditions); their time is then
        not in ``timings``.
        """
        timings: dict[str, float] = {}
        t0 = time.perf_counter()
        if context is None:
            context = self.receiver_context(messages)
            timings["receiver_prefill"] = time.perf_counter() - t0
        rendered, cache = context
        aligned: dict[str, tuple[KVCache, np.ndarray]] = {}
        for link in self.links:
            if link.sharer is None:
                continue
            t0 = time.perf_counter()
            sc = (sharer_contexts or {}).get(link.sharer_name)
            if sc is None:
                sc = link.sharer_context(messages)
                timings[f"sharer_prefill:{link.sharer_name}"] = time.perf_counter() - t0
            t0 = time.perf_counter()
            aligned[link.sharer_name] = (sc[1], align_tokens(rendered, sc[0]))
            timings[f"align:{link.sharer_name}"] = time.perf_counter() - t0
        fused, fuse_timings = self.fuse_caches(cache, aligned)
        return Fused(cache=fused, rendered=rendered, timings=timings | fuse_timings)

    @torch.inference_mode()
    def fuse_caches(self, cache: KVCache, sharers: dict[str, tuple[KVCache, np.ndarray]]
                    ) -> tuple[KVCache, dict[str, float]]:
        """Apply every fuser to the Receiver's ``cache``, given each Sharer's cache and its alignment.

        ``sharers`` maps a Sharer's name to (its cache, ``(T_r,)`` Sharer token index per Receiver
        token). :meth:`fuse` passes real alignments; evaluation's causal controls pass another
        question's cache, or zeros, through the very same fusers.
        """
        timings: dict[str, float] = {}
        keys, values = list(cache.keys), list(cache.values)
        for link in self.links:
            if link.sharer is None:  # control: the Receiver's own (unfused) cache stands in
                sk = [cache.keys[s] for _, s in link.fuser.cfg.layer_map]
                sv = [cache.values[s] for _, s in link.fuser.cfg.layer_map]
            else:
                s_cache, index = sharers[link.sharer_name]
                sk, sv = aligned_sharer(s_cache, index, link.fuser.cfg.layer_map, self.receiver.facts.windows)
            t0 = time.perf_counter()
            # [1, H_r, T, D_r] per layer in and out; hard gates
            keys, values = link.fuser(keys, values, sk, sv, tau=None)
            timings[f"fuse:{link.sharer_name}"] = time.perf_counter() - t0
        fused = replace(cache, keys=tuple(k.to(cache.dtype) for k in keys),
                        values=tuple(v.to(cache.dtype) for v in values))
        return fused, timings

    # -------------------------------------------------------------- continue
    def generation_ids(self) -> list[int]:
        return self.receiver.encode(self.receiver.generation_prompt())

    def generate(self, messages: Sequence[dict], *, max_new_tokens: int = 64):
        """The Receiver's greedy answer to ``messages``, continuing from the fused cache."""
        fused = self.fuse(messages)
        return self.receiver.generate(self.generation_ids(), fused.cache, max_new_tokens=max_new_tokens)

    # ---------------------------------------------------------------- export
    def fingerprint(self) -> Fingerprint:
        """The Receiver's fingerprint, with every fuser and Sharer added to ``adapters``."""
        base = Fingerprint.of(self.receiver)
        extra: list[str] = []
        for link in self.links:
            extra.append(f"c2c-fuser:{link.meta.fuser_id}")
            digest = link.meta.sharer.get("weights_digest", "")
            extra.append(f"c2c-sharer:{link.sharer_name}@{digest[:16]}" if digest else f"c2c-sharer:{link.sharer_name}")
        return replace(base, adapters=tuple(base.adapters) + tuple(extra))

    def describe(self) -> dict:
        """What the artifact's ``extra`` records about the fusion."""
        return {"c2c.fusion": {
            "kind": "fused-kv", "receiver": self.receiver.name, "gate": "hard",
            "fusers": [{"fuser_id": l.meta.fuser_id, "sharer": l.sharer_name,
                        "sharer_weights_digest": l.meta.sharer.get("weights_digest", ""),
                        "layer_map": [list(p) for p in l.fuser.cfg.layer_map],
                        "active_gates": sum(1 for g in l.fuser.gates().values() if g > 0)}
                       for l in self.links]}}

    def export(self, fused: Fused, *, prefix_len: int | None = None, path: str | Path | None = None):
        """A c2c :class:`~c2c.artifact.Artifact` of ``fused.cache`` (written to ``path`` if given)."""

        n = fused.cache.seq_len if prefix_len is None else prefix_len
        art = Artifact.build(fused.cache, fingerprint=self.fingerprint(),
                             prefix=PrefixRef.of(fused.cache.token_ids[:n]), extra=self.describe(),
                             labels={"kind": "c2c-fused"})
        if path is not None:
            art.write(path)
        return art


def side_record(runtime) -> dict[str, str]:
    """How a checkpoint names a model: name, weights and tokenizer digests."""
    return {"name": runtime.name, "weights_digest": runtime.weights_digest,
            "tokenizer_digest": runtime.tokenizer_digest}


def _check_side(recorded: dict, runtime, role: str) -> None:
    if recorded.get("tokenizer_digest") and recorded["tokenizer_digest"] != runtime.tokenizer_digest:
        raise FuserCheckpointError(f"the fuser was trained with {role} {recorded.get('name')}; {runtime.name} "
                                   "has a different tokenizer")
    if recorded.get("weights_digest") and recorded["weights_digest"] != runtime.weights_digest:
        raise FuserCheckpointError(f"the fuser was trained with {role} {recorded.get('name')}; {runtime.name} "
                                   "has different weights. Train a fuser for this pair")


def _check_receiver(meta: ckpt.FuserMeta, receiver) -> None:
    _check_side(meta.receiver, receiver, "receiver")
    f, c = receiver.facts, meta.fuser
    if (f.num_layers, f.kv_heads, f.head_dim) != (c.receiver_layers, c.receiver_kv_heads, c.receiver_head_dim):
        raise FuserCheckpointError(f"the fuser is shaped for {c.receiver_layers} layers of {c.receiver_kv_heads}x"
                                   f"{c.receiver_head_dim}; {receiver.name} has {f.num_layers} of "
                                   f"{f.kv_heads}x{f.head_dim}")
