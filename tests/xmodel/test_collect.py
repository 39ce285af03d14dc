"""RoPE out and back in: exact round trips, with each model's own rotary settings."""

from __future__ import annotations

import torch

from c2c.xmodel.collect import flat_plain, unflat


def test_rope_removal_then_application_round_trips(tiny_models):
    for rt in (tiny_models["small"], tiny_models["big"]):
        _, cache = rt.prefill(list(range(40, 90)))
        for layer, k in enumerate(cache.keys):
            plain = rt.rope_remove(layer, k, 0)
            assert not torch.allclose(plain, k.float(), atol=1e-3)  # RoPE was really there
            torch.testing.assert_close(rt.rope_apply(layer, plain, 0), k.float(), atol=2e-6, rtol=0)


def test_unrotated_first_layer_keys_do_not_depend_on_position(tiny_models):
    # Layer 0's key of a token depends on the token and its position only; with RoPE taken out
    # (the model's own base: 1e4 for "small", 1e6 for "big"), a shifted prefill gives the same keys.
    for rt in (tiny_models["small"], tiny_models["big"]):
        ids = list(range(100, 130))
        _, at0 = rt.prefill(ids)
        _, at37 = rt.prefill(ids, start=37)
        k0 = rt.rope_remove(0, at0.keys[0][:, :, :1], 0)
        k37 = rt.rope_remove(0, at37.keys[0][:, :, :1], 37)
        torch.testing.assert_close(k0, k37, atol=2e-5, rtol=0)
        assert not torch.allclose(at0.keys[0][:, :, :1], at37.keys[0][:, :, :1], atol=1e-3)


def test_flat_layout_is_heads_side_by_side_and_inverts(tiny_models):
    rt = tiny_models["big"]
    _, cache = rt.prefill(list(range(10, 30)))
    keys, values = flat_plain(rt, cache)
    H, D = rt.facts.kv_heads, rt.facts.head_dim
    assert keys[0].shape == (20, H * D) and len(values) == rt.facts.num_layers
    torch.testing.assert_close(values[2][:, D:2 * D], cache.values[2][0, 1].float())  # head 1's columns
    torch.testing.assert_close(unflat(values[2], H), cache.values[2].float())
