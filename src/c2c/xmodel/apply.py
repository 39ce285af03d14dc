"""Apply a map: a source model's cache becomes a cache the target model continues from, unprefilled.

Per target layer ``t``: the source layers the map reads have their keys un-rotated (the source's
RoPE), K and V (each from the same kind, those layers side by side) go through the layer's
linear maps ``(T, G * d_in) @ (G * d_in, d_out) + b``, the
keys are rotated again for the same positions with the target's own RoPE, and the result is
laid out ``(1, kv_heads, T, head_dim)`` in the target's dtype.

The first tokens are the target's own: ``prefix`` when the caller holds the target's cache of
them (a shared system prompt it has prefilled once), else the target computes the first token
itself (one token: its K/V depend on that token alone, and it is the attention sink every later
query leans on; the map is not fitted there).
"""

from __future__ import annotations

from dataclasses import replace

import torch

from c2c.artifact.fingerprint import Fingerprint
from c2c.errors import IncompatibleCacheError
from c2c.runtime.kvcache import KVCache
from c2c.runtime.protocol import RopeCodec
from c2c.xmodel.collect import flat_plain, require_mappable, unflat
from c2c.xmodel.crossmap import CrossModelMap


@torch.inference_mode()
def map_cache(xmap: CrossModelMap, cache: KVCache, *, source, target, prefix: KVCache | None = None) -> KVCache:
    """``target``'s KV-cache of ``cache.token_ids``, computed from ``source``'s ``cache`` through ``xmap``.

    Args:
        xmap: a map fitted for exactly ``source`` -> ``target``.
        cache: ``source``'s cache of a whole context (``start == 0``), or of the tokens right
            after ``prefix`` (``start == prefix.end``: a slice cut after the shared prefix, whose
            own K/V the source need not send).
        source, target: the two runtimes (transformers backend); the source's is needed to
            take its RoPE out of the keys (no forward pass of the source runs).
        prefix: ``target``'s own cache of the first ``P >= 1`` tokens of the context (e.g. the
            shared system prompt); default: the target prefills the first token.

    Returns:
        a cache of ``target``'s layout, ``start == 0``, holding the prefix and every token of ``cache``:
        the target continues from it (``target.prefill(more, past=...)``) without prefilling them.

    Raises:
        MapMismatchError: ``xmap`` was fitted for another model pair.
        IncompatibleCacheError: ``cache`` is not ``source``'s layout or not a whole context;
            ``prefix`` is not a prefix of it.
        RuntimeUnsupportedError: a backend or layer layout a map cannot serve.
    """
    _check(xmap, cache, source, target)
    after = prefix is not None and cache.start == prefix.end > 0               # a slice that continues the prefix
    if (cache.start != 0 and not after) or cache.seq_len == 0:
        raise IncompatibleCacheError(f"map a whole context (a cache starting at position 0, not {cache.start}) or "
                                     "the tokens right after the given prefix; re-position a slice after its "
                                     "prefix first")
    if prefix is None:
        _, prefix = target.prefill(cache.token_ids[:1])
    P = prefix.seq_len
    if prefix.start != 0 or (not after and (P > cache.seq_len
                                            or tuple(prefix.token_ids) != tuple(cache.token_ids[:P]))):
        raise IncompatibleCacheError("prefix must be the target's cache of the first tokens of the mapped cache")
    target.check_cache(prefix)
    if P == cache.end:
        return prefix
    return prefix.append(_mapped(xmap, cache if after else cache.slice(P, cache.end), source, target))  # P..T-1


@torch.inference_mode()
def map_after_prefix(xmap: CrossModelMap, cache: KVCache, *, source, target) -> KVCache:
    """``target``'s K/V of a slice of ``source``'s that starts after a shared prefix (``cache.start > 0``),
    mapped at the slice's own positions: for a receiver that holds (or will compute) its own K/V of
    the prefix, so no prefix cache is needed to map it.

    Raises:
        MapMismatchError, IncompatibleCacheError, RuntimeUnsupportedError: as :func:`map_cache`
            (here: an empty slice, or one that starts at position 0).
    """
    _check(xmap, cache, source, target)
    if cache.start == 0 or cache.seq_len == 0:
        raise IncompatibleCacheError("map_after_prefix maps a non-empty slice after a prefix (start > 0); map a "
                                     "whole context with map_cache, which keeps the target's own first tokens")
    return _mapped(xmap, cache, source, target)


def map_received(xmap: CrossModelMap, cache: KVCache, *, source, target, prefix_len: int,
                 prefix: KVCache | None = None) -> KVCache | None:
    """The one mapping of a received cache into ``target``'s model after a shared prefix of ``prefix_len``
    tokens: the library's in-process mapped path (:class:`c2c.handoff.paths.MappedPath`) and ``c2c serve``'s
    mapped attach (:func:`c2c.serve.mapped.mapped_parts`) both call it.

    Args:
        cache: ``source``'s K/V of a whole context (``start == 0``), or of a slice of what follows the
            shared prefix, at any positions (a slice kept at its positions is first moved to follow the
            prefix, which the map needs).
        prefix_len: ``P``, the shared prefix's length (0: none).
        prefix: ``target``'s own K/V of the shared prefix: the result is then a whole context
            (``start == 0``: the prefix, then every mapped token); without it, only what follows the
            prefix (``start == P``), which the receiver places after its own prefix.

    Returns:
        the mapped cache, or None when the received cache holds nothing after the prefix.

    Raises:
        as :func:`map_cache` and :func:`map_after_prefix`.
    """
    P = prefix_len
    if cache.start not in (0, P):                              # a slice kept at its positions: after the prefix
        cache = source.reposition(cache, P)
    if P == 0:                                                 # no shared prefix: the target's own first token
        return map_cache(xmap, cache, source=source, target=target)
    if prefix is not None and cache.start in (0, P):
        return map_cache(xmap, cache, source=source, target=target, prefix=prefix)
    if cache.end == P:
        return None
    rest = cache if cache.start == P else cache.slice(P, cache.end)
    return map_after_prefix(xmap, rest, source=source, target=target)


def _check(xmap: CrossModelMap, cache: KVCache, source, target) -> None:
    require_mappable(source)
    require_mappable(target)
    xmap.check_pair(Fingerprint.of(source), Fingerprint.of(target))
    source.check_cache(cache)


def _mapped(xmap: CrossModelMap, rest: KVCache, source: RopeCodec, target: RopeCodec) -> KVCache:
    """The map applied to ``rest``: the source's K/V of positions ``S..T-1`` (``S = rest.start``)."""
    S = rest.start
    xk, xv = flat_plain(source, rest)                                          # Ls x (T-S, d_in)
    Ht, dtype = target.facts.kv_heads, target.dtype
    keys, values = [], []
    for t in range(len(xmap.layers)):
        wk, bk = xmap.weight("k", t)
        wv, bv = xmap.weight("v", t)
        lf = xmap.layers[t]
        k = torch.cat([xk[s] for s in lf["k"].sources], 1) @ wk + bk          # (T-S, d_out), un-rotated
        v = torch.cat([xv[s] for s in lf["v"].sources], 1) @ wv + bv          # (T-S, d_out)
        keys.append(target.rope_apply(t, unflat(k, Ht), S).to(dtype))         # (1, Ht, T-S, Dt)
        values.append(unflat(v, Ht).to(dtype))
    return replace(rest, keys=tuple(keys), values=tuple(values), windows=tuple(target.facts.windows))
