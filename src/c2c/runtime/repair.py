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
from c2c.runtime.pace import ONE_PASS, Pace
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


def deviation(runtime: Runtime, head: KVCache, piece: KVCache, probe_layers: int = 2,
              pace: Pace = ONE_PASS) -> torch.Tensor:
    """How far each of ``piece``'s tokens is from its K/V computed after ``head``, at the last of the first
    ``probe_layers`` layers (the probe: that many layers of a prefill of ``piece``). Returns ``(n,)``.

    The probe runs at ``pace``: each pass's tokens attend to ``head`` and to the fresh probe K/V of the
    passes before (the later layers of what the passes add are ``piece``'s own, never read: the probe
    stops after its layers), so the result is the one pass's, within rounding."""
    probe_layers = max(2, min(probe_layers, runtime.facts.num_layers))
    probes = require(runtime, Probes)
    L = probe_layers - 1
    past, out = head, []
    for a, b in pace.runs(piece.seq_len):
        fresh = probes.probe_first_layers(piece.token_ids[a:b], past, probe_layers)   # L+1 pairs (1, H, b-a, D)
        part = piece.take(a, b)
        k_f, v_f = fresh[-1]
        out.append(((k_f - part.keys[L]).float().pow(2).sum(dim=(0, 1, 3))
                    + (v_f - part.values[L]).float().pow(2).sum(dim=(0, 1, 3))).sqrt())   # (b-a,)
        if b < piece.seq_len:  # the next pass attends to this one's fresh K/V on the probed layers
            keys = tuple(k.to(pk.dtype) for (k, _), pk in zip(fresh, part.keys)) + part.keys[len(fresh):]
            values = tuple(v.to(pv.dtype) for (_, v), pv in zip(fresh, part.values)) + part.values[len(fresh):]
            past = past.append(replace(part, keys=keys, values=values, edits=None))
    return torch.cat(out) if out else torch.zeros(0)                                     # (n,)


def recompute(runtime: Runtime, head: KVCache, piece: KVCache, chosen: list[int], pace: Pace = ONE_PASS) -> KVCache:
    """``head`` + ``piece`` with the K/V of ``piece``'s tokens ``chosen`` (sorted, piece-relative) recomputed
    through the whole model, each attending to all of ``head``, the reused K/V of the earlier tokens not
    chosen and the fresh K/V of the earlier chosen ones.

    At ``pace``, ``pace.chunk`` chosen tokens a pass: each pass writes its fresh K/V into the cache, where
    the later passes read them, so the result is the one pass's, within rounding. Where every token of
    ``piece`` is chosen, that is a prefill of ``piece`` after ``head``, and is run as one (causal attention,
    no mask)."""
    combined = head.append(piece)
    if not chosen:
        return combined
    n, P = piece.seq_len, head.end
    if len(chosen) == n and not head.gaps:
        _, out = pace.prefill(runtime, piece.token_ids, head)
        return replace(out, gaps=combined.gaps, edits=combined.edits)
    probes = require(runtime, Probes)
    total = combined.seq_len
    keys = [k.clone() for k in combined.keys]                                          # (1, H, total, D) each
    values = [v.clone() for v in combined.values]
    cols = torch.arange(P, total)                                                     # piece positions
    for a, b in pace.runs(len(chosen)):
        batch, k = chosen[a:b], b - a
        positions = [P + i for i in batch]
        # allowed[q, c]: new token q may see cache column c (0..total-1), or new column total + j
        allowed = torch.zeros(k, total + k, dtype=torch.bool)
        allowed[:, :P] = True
        earlier = cols[None, :] < torch.tensor(positions)[:, None]                    # (k, n)
        visible = torch.ones(n, dtype=torch.bool)
        visible[chosen[a:]] = False         # this pass's and the later ones' still hold their old K/V
        allowed[:, P:total] = earlier & visible[None, :]
        allowed[:, total:] = torch.tril(torch.ones(k, k, dtype=torch.bool))
        now = replace(combined, keys=tuple(keys), values=tuple(values))
        new = probes.probe_kv([piece.token_ids[i] for i in batch], positions, now, allowed)
        idx = torch.tensor(positions)
        for layer, (k_new, v_new) in enumerate(new):
            keys[layer][:, :, idx] = k_new.to(keys[layer].dtype)
            values[layer][:, :, idx] = v_new.to(values[layer].dtype)
    return replace(combined, keys=tuple(keys), values=tuple(values))
