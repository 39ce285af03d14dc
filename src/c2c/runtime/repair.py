"""Slice repair: selectively recompute the slice tokens whose K/V deviate most.

A slice was computed in the sender's context; attached after the receiver's
prefix, its K/V are approximate (each token attended to text the receiver does
not have). In the manner of CacheBlend we

1. probe: recompute the slice's K/V on the first ``probe_layers`` layers only, in
   the receiver's context (cheap), and rank tokens by how far their reused K/V
   are from the fresh ones at the last probed layer;
2. recompute the top ``ratio`` of tokens through the whole model, each attending
   to the receiver's prefix, the reused K/V of earlier non-selected tokens and the
   fresh K/V of earlier selected ones, and write their K/V back.

``ratio=0`` is plain reuse; ``ratio=1`` equals the receiver prefilling the slice
itself (exactly, up to float rounding).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import torch

from c2c.errors import ConfigError, RuntimeUnsupportedError
from c2c.runtime.kvcache import KVCache
from c2c.runtime.protocol import Probes, Runtime, require


@dataclass(frozen=True, kw_only=True)
class RepairReport:
    ratio: float
    recomputed: tuple[int, ...]     # absolute positions recomputed
    deviation: tuple[float, ...]    # per slice token, at the last probed layer


def repair(runtime: Runtime, head: KVCache, piece: KVCache, *, ratio: float,
           probe_layers: int = 2) -> tuple[KVCache, RepairReport]:
    """Attach ``piece`` (already re-positioned to ``head.end``) after ``head``, repairing ``ratio`` of it.

    Args:
        head: the receiver's cache (starts at 0).
        piece: the slice, re-positioned to start at ``head.end``.
        ratio: fraction of slice tokens to recompute, 0..1.

    Returns: (the combined cache, a report).
    """
    if not 0.0 <= ratio <= 1.0:
        raise ConfigError(f"ratio must be within 0..1, got {ratio}")
    if runtime.facts.sliding_window is not None:
        raise RuntimeUnsupportedError("slice repair needs full attention on every layer; "
                                      f"{runtime.name} has sliding-window layers")
    if piece.start != head.end:
        raise ConfigError(f"re-position the slice to {head.end} first (it starts at {piece.start})")
    dev = deviation(runtime, head, piece, probe_layers)                 # (n,)
    k = math.ceil(ratio * piece.seq_len)
    if k == 0:
        return head.append(piece), RepairReport(ratio=ratio, recomputed=(), deviation=tuple(dev.tolist()))
    chosen = sorted(torch.topk(dev, k).indices.tolist())       # slice-relative indices
    out = recompute(runtime, head, piece, chosen)
    return out, RepairReport(ratio=ratio, recomputed=tuple(head.end + i for i in chosen),
                             deviation=tuple(dev.tolist()))


def deviation(runtime: Runtime, head: KVCache, piece: KVCache, probe_layers: int = 2) -> torch.Tensor:
    """How far each of ``piece``'s tokens is from its K/V computed after ``head``, at the last of the first
    ``probe_layers`` layers (the probe: that many layers of a prefill of ``piece``). Returns ``(n,)``."""
    probe_layers = max(2, min(probe_layers, runtime.facts.num_layers))
    fresh = require(runtime, Probes).probe_first_layers(piece.token_ids, head, probe_layers)
    k_f, v_f = fresh[-1]                                        # (1, H, n, D)
    L = probe_layers - 1
    return ((k_f - piece.keys[L]).float().pow(2).sum(dim=(0, 1, 3))
            + (v_f - piece.values[L]).float().pow(2).sum(dim=(0, 1, 3))).sqrt()  # (n,)


def recompute(runtime: Runtime, head: KVCache, piece: KVCache, chosen: list[int]) -> KVCache:
    """``head`` + ``piece`` with the K/V of ``piece``'s tokens ``chosen`` (sorted, piece-relative) recomputed
    through the whole model, each attending to all of ``head``, the reused K/V of the earlier tokens not
    chosen and the fresh K/V of the earlier chosen ones."""
    combined = head.append(piece)
    if not chosen:
        return combined
    n, P, k = piece.seq_len, head.end, len(chosen)
    positions = [P + i for i in chosen]
    total = combined.seq_len
    # allowed[q, c]: new token q may see cache column c (positions 0..total-1) or new column total + j
    allowed = torch.zeros(k, total + k, dtype=torch.bool)
    allowed[:, :P] = True
    pos_t = torch.tensor(positions)                                                   # (k,)
    cols = torch.arange(P, total)                                                     # slice positions
    earlier = cols[None, :] < pos_t[:, None]                                          # (k, n)
    reused = torch.ones(n, dtype=torch.bool)
    reused[chosen] = False
    allowed[:, P:total] = earlier & reused[None, :]
    allowed[:, total:] = torch.tril(torch.ones(k, k, dtype=torch.bool))
    new = require(runtime, Probes).probe_kv([piece.token_ids[i] for i in chosen], positions, combined, allowed)
    idx = torch.tensor(positions)
    keys, values = [], []
    for (k_new, v_new), k_old, v_old in zip(new, combined.keys, combined.values):
        k2, v2 = k_old.clone(), v_old.clone()
        k2[:, :, idx] = k_new.to(k2.dtype)
        v2[:, :, idx] = v_new.to(v2.dtype)
        keys.append(k2)
        values.append(v2)
    return replace(combined, keys=tuple(keys), values=tuple(values))
