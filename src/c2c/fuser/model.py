"""The cache fuser: per Receiver layer, project the Sharer's cache into the Receiver's and add it.

For one layer and one of keys/values (a :class:`KVProjector`), per token::

    r: Receiver entry  [B, H_r, T, D_r]        s: aligned Sharer entry  [B, H_s, T, D_s]
    x = concat(rms_norm(r), rms_norm(s))       [B, T, H_r*D_r + H_s*D_s]
    h = silu(W_in x)                           [B, T, hidden]
    delta = W_out h                            [B, T, H_r*D_r]   -> [B, H_r, T, D_r]
    w = sigmoid(W_head h)                      [B, T, H_r]       -> [B, H_r, T, 1]   weight per head
    g = gate(logit)                            scalar            Gumbel-sigmoid in training, hard at inference
    out = r + g * w * rms(r) * delta           [B, H_r, T, D_r]  residual on the Receiver's cache

``W_out`` starts at zero, so an untrained fuser returns the Receiver's cache
exactly. ``delta`` is scaled by the Receiver entry's own RMS so that one
learning rate suits layers whose keys differ in magnitude by 100× (Qwen's do).
Both LLMs stay frozen; only these projectors train.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Sequence

import torch
import torch.nn.functional as F
from torch import nn

from c2c.errors import FuserCheckpointError
from c2c.fuser.align import LayerMap

_EPS = 1e-6


@dataclass(frozen=True, kw_only=True)
class FuserConfig:
    """Shapes and sizes of a :class:`CacheFuser` (stored in every checkpoint)."""

    receiver_layers: int
    receiver_kv_heads: int
    receiver_head_dim: int
    sharer_kv_heads: int
    sharer_head_dim: int
    layer_map: LayerMap          # (receiver_layer, sharer_layer) pairs that get a projector
    hidden: int = 128
    gate_init: float = 2.0       # initial gate logit: sigmoid(2) ≈ 0.88, open at inference

    def to_dict(self) -> dict:
        d = asdict(self)
        d["layer_map"] = [list(p) for p in self.layer_map]
        return d

    @classmethod
    def from_dict(cls, d: dict) -> "FuserConfig":
        d = dict(d)
        d["layer_map"] = tuple((int(r), int(s)) for r, s in d["layer_map"])
        return cls(**d)


def gumbel_sigmoid(logit: torch.Tensor, tau: float, generator: torch.Generator | None = None) -> torch.Tensor:
    """A relaxed Bernoulli sample: ``sigmoid((logit + logistic noise) / tau)``, differentiable in ``logit``."""
    u = torch.rand(logit.shape, generator=generator, dtype=torch.float32).to(logit.device)
    u = u.clamp(_EPS, 1 - _EPS)
    return torch.sigmoid((logit + torch.log(u) - torch.log1p(-u)) / tau)


def _rms(x: torch.Tensor) -> torch.Tensor:
    return x.pow(2).mean(-1, keepdim=True).add(_EPS).sqrt()


class KVProjector(nn.Module):
    """Fuses one layer's keys (or values). See the module docstring for the equations."""

    def __init__(self, cfg: FuserConfig):
        super().__init__()
        self.h_r, self.d_r = cfg.receiver_kv_heads, cfg.receiver_head_dim
        self.h_s, self.d_s = cfg.sharer_kv_heads, cfg.sharer_head_dim
        self.inp = nn.Linear(self.h_r * self.d_r + self.h_s * self.d_s, cfg.hidden)
        self.out = nn.Linear(cfg.hidden, self.h_r * self.d_r, bias=False)
        self.head = nn.Linear(cfg.hidden, self.h_r)
        self.gate_logit = nn.Parameter(torch.tensor(float(cfg.gate_init)))
        nn.init.zeros_(self.out.weight)  # start as the identity on the Receiver's cache

    def gate(self, tau: float | None, generator: torch.Generator | None = None) -> torch.Tensor:
        """Training (``tau`` given): a Gumbel-sigmoid sample. Inference (``None``): exactly 0 or 1."""
        if tau is None:
            return (self.gate_logit > 0).to(self.gate_logit.dtype)
        return gumbel_sigmoid(self.gate_logit, tau, generator)

    def forward(self, r: torch.Tensor, s: torch.Tensor, *, tau: float | None = None,
                generator: torch.Generator | None = None) -> torch.Tensor:
        B, _, T, _ = r.shape
        r32, s32 = r.float(), s.float()
        # [B, H, T, D] -> [B, T, H*D], each entry normalized per head so scales match
        rn = (r32 / _rms(r32)).transpose(1, 2).reshape(B, T, self.h_r * self.d_r)
        sn = (s32 / _rms(s32)).transpose(1, 2).reshape(B, T, self.h_s * self.d_s)
        h = F.silu(self.inp(torch.cat([rn, sn], dim=-1)))                      # [B, T, hidden]
        delta = self.out(h).view(B, T, self.h_r, self.d_r).transpose(1, 2)      # [B, H_r, T, D_r]
        w = torch.sigmoid(self.head(h)).transpose(1, 2).unsqueeze(-1)           # [B, H_r, T, 1]
        g = self.gate(tau, generator)
        return (r32 + g * w * _rms(r32) * delta).to(r.dtype)


class CacheFuser(nn.Module):
    """One :class:`KVProjector` per fused Receiver layer, for keys and for values."""

    def __init__(self, cfg: FuserConfig):
        super().__init__()
        self.cfg = cfg
        self.proj = nn.ModuleDict()
        for r, _ in cfg.layer_map:
            if not 0 <= r < cfg.receiver_layers:
                raise FuserCheckpointError(f"layer map names receiver layer {r} of {cfg.receiver_layers}")
            self.proj[f"k{r}"] = KVProjector(cfg)
            self.proj[f"v{r}"] = KVProjector(cfg)

    @property
    def receiver_layers(self) -> tuple[int, ...]:
        return tuple(r for r, _ in self.cfg.layer_map)

    def gates(self) -> dict[str, float]:
        """The inference (hard) gate of every projector, e.g. ``{"k23": 1.0, ...}``."""
        return {name: float(p.gate(None)) for name, p in self.proj.items()}

    def forward(self, keys: Sequence[torch.Tensor], values: Sequence[torch.Tensor],
                sharer_keys: Sequence[torch.Tensor], sharer_values: Sequence[torch.Tensor], *,
                tau: float | None = None, generator: torch.Generator | None = None
                ) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        """Fuse a whole cache.

        Args:
            keys, values: the Receiver's cache, one ``[B, H_r, T, D_r]`` tensor per layer.
            sharer_keys, sharer_values: the aligned Sharer entries, one ``[B, H_s, T, D_s]``
                tensor per pair of ``cfg.layer_map`` (in that order), on the Receiver's tokens.
            tau: Gumbel-sigmoid temperature in training; ``None`` for hard gates (inference).

        Returns:
            The fused keys and values, one tensor per Receiver layer; unmapped layers
            are the Receiver's own tensors.
        """
        if len(sharer_keys) != len(self.cfg.layer_map) or len(sharer_values) != len(self.cfg.layer_map):
            raise FuserCheckpointError(
                f"got {len(sharer_keys)} sharer layers, the fuser maps {len(self.cfg.layer_map)}")
        out_k, out_v = list(keys), list(values)
        for j, (r, _) in enumerate(self.cfg.layer_map):
            out_k[r] = self.proj[f"k{r}"](keys[r], sharer_keys[j], tau=tau, generator=generator)
            out_v[r] = self.proj[f"v{r}"](values[r], sharer_values[j], tau=tau, generator=generator)
        return out_k, out_v
