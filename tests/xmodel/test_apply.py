"""Applying a map: the target continues from the mapped cache, without prefilling those tokens."""

from __future__ import annotations

import pytest
import torch

from c2c.errors import IncompatibleCacheError
from c2c.xmodel import FitConfig, fit, map_after_prefix, map_cache


def test_mapped_cache_has_the_target_layout_and_the_target_continues(small_to_big, tiny_models):
    small, big = tiny_models["small"], tiny_models["big"]
    ids = list(range(60, 100))
    _, cache = small.prefill(ids)
    out = map_cache(small_to_big, cache, source=small, target=big)
    assert out.num_layers == 5 and out.seq_len == 40 and out.start == 0 and out.token_ids == tuple(ids)
    assert all(k.shape == v.shape == (1, 2, 40, 16) for k, v in zip(out.keys, out.values))
    assert out.dtype == big.dtype
    _, own = big.prefill(ids[:1])  # the first token is the target's own
    assert out.slice(0, 1).max_abs_diff(own) == 0.0
    logits, grown = big.prefill([5, 6, 7], out)  # continues: only the 3 new tokens are run
    assert grown.seq_len == 43 and torch.isfinite(logits).all()
    assert grown.slice(0, 40).max_abs_diff(out) == 0.0



def context_and_prefix(tiny_models):
    """The small model's cache of 40 tokens, and the big model's own cache of their first 10 (the prefix)."""
    small, big = tiny_models["small"], tiny_models["big"]
    ids = list(range(60, 100))
    _, cache = small.prefill(ids)
    _, prefix = big.prefill(ids[:10])
    return small, big, ids, cache, prefix


def test_a_given_prefix_is_kept_as_the_target_computed_it(small_to_big, tiny_models):
    small, big, ids, cache, prefix = context_and_prefix(tiny_models)
    out = map_cache(small_to_big, cache, source=small, target=big, prefix=prefix)
    assert out.slice(0, 10).max_abs_diff(prefix) == 0.0 and out.seq_len == 40
    _, wrong = big.prefill([1, 2, 3])
    with pytest.raises(IncompatibleCacheError):
        map_cache(small_to_big, cache, source=small, target=big, prefix=wrong)
    with pytest.raises(IncompatibleCacheError):  # a cache of the target is not a cache of the source
        map_cache(small_to_big, prefix, source=small, target=big)


def test_a_self_map_reproduces_the_models_own_cache_and_answer(tiny_models, streams):
    # keys go out of RoPE, through the (near-identity) map, and back in at the same positions
    big = tiny_models["big"]
    m = fit(big, big, FitConfig(tokens=400, seq_len=48, layer_window=1), streams=streams, progress=False)
    ids = list(range(70, 110))
    _, own = big.prefill(ids)
    mapped = map_cache(m, own, source=big, target=big)
    assert mapped.max_abs_diff(own) < 1e-2
    a = big.generate([9, 10], own, max_new_tokens=6)
    b = big.generate([9, 10], mapped, max_new_tokens=6)
    assert a.token_ids == b.token_ids


def test_a_slice_after_the_prefix_maps_as_the_same_tokens_of_the_whole_context(small_to_big, tiny_models):
    # what a slice cut after the shared prefix carries: the source need not send the prefix's K/V
    small, big, ids, cache, prefix = context_and_prefix(tiny_models)
    whole = map_cache(small_to_big, cache, source=small, target=big, prefix=prefix)
    part = map_cache(small_to_big, cache.slice(10, 40), source=small, target=big, prefix=prefix)
    assert part.start == 0 and part.token_ids == tuple(ids) and part.max_abs_diff(whole) == 0.0
    with pytest.raises(IncompatibleCacheError):  # a slice that does not continue the prefix
        map_cache(small_to_big, cache.slice(12, 40), source=small, target=big, prefix=prefix)
    with pytest.raises(IncompatibleCacheError):  # nor without one
        map_cache(small_to_big, cache.slice(10, 40), source=small, target=big)


def test_a_slice_maps_alone_at_its_positions_as_in_the_whole_context(small_to_big, tiny_models):
    # what a receiver holding its own prefix takes (c2c serve, a slice handoff): no prefix cache is needed
    small, big, ids, cache, prefix = context_and_prefix(tiny_models)
    whole = map_cache(small_to_big, cache, source=small, target=big, prefix=prefix)
    rest = map_after_prefix(small_to_big, cache.slice(10, 40), source=small, target=big)
    assert (rest.start, rest.end) == (10, 40) and rest.token_ids == tuple(ids[10:40])
    assert rest.max_abs_diff(whole.slice(10, 40)) == 0.0
    with pytest.raises(IncompatibleCacheError, match="map_cache"):  # a whole context keeps the target's first tokens
        map_after_prefix(small_to_big, cache, source=small, target=big)
