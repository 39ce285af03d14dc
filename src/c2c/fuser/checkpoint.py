"""Fuser checkpoints: ``fuser.safetensors`` (weights) next to ``config.json``. Never pickle.

Layout of a checkpoint directory::

    config.json           {"format": "c2c-fuser", "version": 1, "fuser_id": ..., "fuser": FuserConfig,
                           "receiver": {...}, "sharer": {...}, "train": {...}, "step": N}
    fuser.safetensors     the projector weights (fp32)
    train_state/          only while training: optimizer.safetensors + state.json (resume)

``fuser_id`` is sha256 over the canonical fuser config and the weight bytes: the
identity a fused cache records in its fingerprint's ``adapters``.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file
from safetensors.torch import save as save_bytes

from c2c._io import write_atomic
from c2c.canon import canonical_json, check_format
from c2c.errors import FuserCheckpointError
from c2c.fuser.model import CacheFuser, FuserConfig

FORMAT = "c2c-fuser"
VERSION = 1
WEIGHTS = "fuser.safetensors"
CONFIG = "config.json"
SELF = "self"  # sharer name of a control fuser: fed the Receiver's own cache


@dataclass(frozen=True, kw_only=True)
class FuserMeta:
    """What a checkpoint says about itself, besides the weights.

    ``receiver``/``sharer``: ``{"name", "weights_digest", "tokenizer_digest"}``; the
    sharer's name is ``"self"`` for a control fuser.
    """

    fuser: FuserConfig
    receiver: dict[str, str]
    sharer: dict[str, str]
    alignment: dict[str, Any] = field(default_factory=dict)
    train: dict[str, Any] = field(default_factory=dict)
    step: int = 0
    fuser_id: str = ""

    @property
    def is_control(self) -> bool:
        return self.sharer.get("name") == SELF


def weights_bytes_digest(state: dict[str, torch.Tensor]) -> str:
    h = hashlib.sha256()
    for name in sorted(state):
        t = state[name].detach().cpu().contiguous()
        h.update(name.encode() + str(tuple(t.shape)).encode() + str(t.dtype).encode())
        h.update(t.view(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def fuser_id(cfg: FuserConfig, state: dict[str, torch.Tensor]) -> str:
    return hashlib.sha256(canonical_json(cfg.to_dict()) + weights_bytes_digest(state).encode()).hexdigest()


def save(path: str | Path, fuser: CacheFuser, meta: FuserMeta) -> FuserMeta:
    """Write ``fuser`` and ``meta`` to directory ``path`` (files replaced atomically). Returns the meta with its id."""
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    state = {k: v.detach().cpu().float().contiguous() for k, v in fuser.state_dict().items()}
    fid = fuser_id(fuser.cfg, state)
    meta = FuserMeta(fuser=fuser.cfg, receiver=meta.receiver, sharer=meta.sharer, alignment=meta.alignment,
                     train=meta.train, step=meta.step, fuser_id=fid)
    write_atomic(path / WEIGHTS, save_bytes(state, metadata={"format": FORMAT, "fuser_id": fid}),
                 error=FuserCheckpointError)
    doc = {"format": FORMAT, "version": VERSION, "fuser_id": fid, "fuser": meta.fuser.to_dict(),
           "receiver": meta.receiver, "sharer": meta.sharer, "alignment": meta.alignment,
           "train": meta.train, "step": meta.step}
    write_atomic(path / CONFIG, json.dumps(doc, indent=2, sort_keys=True).encode(), error=FuserCheckpointError)
    return meta


def read_meta(path: str | Path) -> FuserMeta:
    path = Path(path)
    try:
        doc = json.loads((path / CONFIG).read_text())
    except FileNotFoundError:
        raise FuserCheckpointError(f"{path} is not a fuser checkpoint (no {CONFIG}); train one with "
                                   "`c2c fuser train --config FILE`") from None
    except (OSError, ValueError) as e:
        raise FuserCheckpointError(f"{path / CONFIG} is unreadable: {e}") from None
    check_format(doc, FORMAT, VERSION, where=str(path / CONFIG), what="c2c fuser config",
                 not_it=FuserCheckpointError, too_new=FuserCheckpointError)
    try:
        return FuserMeta(fuser=FuserConfig.from_dict(doc["fuser"]), receiver=dict(doc["receiver"]),
                         sharer=dict(doc["sharer"]), alignment=dict(doc.get("alignment", {})),
                         train=dict(doc.get("train", {})), step=int(doc.get("step", 0)),
                         fuser_id=str(doc["fuser_id"]))
    except (KeyError, TypeError, ValueError) as e:
        raise FuserCheckpointError(f"{path / CONFIG} has a malformed field: {e}") from None


def load(path: str | Path, *, device: str | torch.device = "cpu") -> tuple[CacheFuser, FuserMeta]:
    """Read a checkpoint, checking every tensor's name, shape and finiteness and the fuser id.

    Raises:
        FuserCheckpointError: missing or corrupt files, a weight that does not fit
            the config, or weights that do not hash to the recorded ``fuser_id``.
    """
    path = Path(path)
    meta = read_meta(path)
    fuser = CacheFuser(meta.fuser)
    want = fuser.state_dict()
    try:
        state = load_file(str(path / WEIGHTS))
    except FileNotFoundError:
        raise FuserCheckpointError(f"{path} has no {WEIGHTS}") from None
    except (SafetensorError, OSError, ValueError) as e:
        raise FuserCheckpointError(f"{path / WEIGHTS} is corrupt: {e}") from None
    if set(state) != set(want):
        raise FuserCheckpointError(
            f"{path / WEIGHTS} does not match its config: unexpected {sorted(set(state) - set(want))[:3]}, "
            f"missing {sorted(set(want) - set(state))[:3]}")
    for name, t in state.items():
        if t.shape != want[name].shape:
            raise FuserCheckpointError(f"weight {name} has shape {tuple(t.shape)}, config implies "
                                       f"{tuple(want[name].shape)}")
        if not bool(torch.isfinite(t).all()):
            raise FuserCheckpointError(f"weight {name} contains NaN or Inf")
    if fuser_id(meta.fuser, state) != meta.fuser_id:
        raise FuserCheckpointError(f"{path / WEIGHTS} does not hash to the fuser_id in {CONFIG} "
                                   "(modified or mixed up with another checkpoint)")
    fuser.load_state_dict(state)
    return fuser.to(device).eval(), meta
