"""Recompute K/V at chosen positions with the receiver's own model.

Two probes, both used by :mod:`c2c.trust.verify`:

- :func:`kv_at_positions`: the K/V of *every layer* at positions ``p_1..p_k`` of
  a full cache, each token attending only to the cache's own entries before it
  (and itself). It is the batched form of ``runtime.prefill([t_p],
  past=cache.slice(0, p))``: one forward of ``k`` tokens with a 4-D attention
  mask and explicit position ids, instead of ``k`` one-token forwards.
- :func:`layer0_kv`: the K/V of *layer 0* at every position. Layer 0 depends
  only on the token and its position, so it is checked everywhere, also for a
  slice whose earlier context the receiver does not have. The forward stops
  right after the first attention block, so it costs about ``1/num_layers`` of
  a prefill.

Both are the engine's probes (:meth:`~c2c.runtime.protocol.Probes.probe_kv` and
:meth:`~c2c.runtime.protocol.Probes.probe_layer0`): this module builds the positions and
the mask, the engine runs the forward. An engine without them raises
:class:`RuntimeUnsupportedError` naming the way out (``strict``, a full re-prefill).
"""

from __future__ import annotations

from typing import Sequence

import torch

from c2c.errors import RuntimeUnsupportedError
from c2c.runtime.kvcache import KVCache
from c2c.runtime.protocol import Probes, Runtime, require

#: probe at most this many positions per forward (bounds the (k, T + k) mask)
PROBE_CHUNK = 256


def kv_at_positions(runtime: Runtime, cache: KVCache,
                    positions: Sequence[int]) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """Recompute every layer's K/V at ``positions`` of ``cache`` from the cache's own context.

    Args:
        runtime: the receiver's runtime.
        cache: a full cache (``start == 0``) whose layers all hold every position.
        positions: distinct absolute positions in ``[0, cache.end)``.

    Returns:
        ``(keys, values)``: per layer, a tensor ``(1, kv_heads, k, head_dim)`` in the
        order of ``positions``.

    Raises:
        RuntimeUnsupportedError: the cache is a slice, or a sliding-window layer
            no longer holds the context of some position.
    """
    if cache.start != 0:
        raise RuntimeUnsupportedError(
            f"deep probes need a full cache starting at position 0, not {cache.start}; "
            "check layer 0 only, or pass the prefix cache")
    T, pos = cache.seq_len, list(positions)
    # a sliding layer holds only W - 1 tokens: the context and the appended probes must all fit
    if any(w is not None and T + min(len(pos), PROBE_CHUNK) > w - 1 for w in cache.windows):
        raise RuntimeUnsupportedError(
            "a sliding-window layer keeps only the last W-1 tokens, so earlier positions cannot be "
            "recomputed from this cache; use strict verification (a full re-prefill)")
    runtime.check_cache(cache)
    keys: list[list[torch.Tensor]] = [[] for _ in range(cache.num_layers)]
    values: list[list[torch.Tensor]] = [[] for _ in range(cache.num_layers)]
    for i in range(0, len(pos), PROBE_CHUNK):
        k, v = _probe_chunk(runtime, cache, pos[i: i + PROBE_CHUNK])
        for layer in range(cache.num_layers):
            keys[layer].append(k[layer])
            values[layer].append(v[layer])
    return [torch.cat(k, dim=2) for k in keys], [torch.cat(v, dim=2) for v in values]


def _probe_chunk(runtime: Runtime, cache: KVCache, pos: list[int]) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    T, k, device = cache.seq_len, len(pos), runtime.device
    p = torch.tensor(pos, dtype=torch.long, device=device)                       # (k,)
    # Row i may see cache columns [0, p_i) and its own new column T + i, nothing else.
    cols = torch.arange(T + k, device=device)                                   # (T + k,)
    allowed = cols[None, :] < p[:, None]                                         # (k, T + k)
    allowed[torch.arange(k, device=device), T + torch.arange(k, device=device)] = True
    kv = require(runtime, Probes).probe_kv([cache.token_ids[i] for i in pos], pos, cache, allowed)
    return [k_ for k_, _ in kv], [v for _, v in kv]


def layer0_kv(runtime: Runtime, token_ids: Sequence[int], start: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Layer-0 K/V of ``token_ids`` at positions ``start, start + 1, ...``.

    Returns ``(keys, values)``, each ``(1, kv_heads, T_0, head_dim)`` where ``T_0``
    is what layer 0 keeps (all ``T``, or the last ``W - 1`` for a sliding window).
    """
    return require(runtime, Probes).probe_layer0(token_ids, start)
