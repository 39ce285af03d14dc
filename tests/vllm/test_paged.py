"""c2c.vllm.paged against a line-by-line model of vLLM's CPU ``reshape_and_cache`` (vec kernels)."""

from __future__ import annotations

import pytest
import torch

from c2c.errors import RuntimeUnsupportedError
from c2c.vllm.paged import layout_for

NB, H, B, D = 6, 3, 32, 64


def reshape_and_cache(layer, keys, values, slots):
    """vLLM's vec kernel, one element at a time: per (block, head) K as [D, B] then V as [B, D]."""
    flat = layer.view(-1)
    for t, slot in enumerate(slots):
        b, o = divmod(slot, B)
        for h in range(H):
            base = (b * H + h) * 2 * B * D
            for d in range(D):
                flat[base + d * B + o] = keys[t, h, d]
            flat[base + B * D + o * D: base + B * D + (o + 1) * D] = values[t, h]


def test_read_finds_what_the_kernel_wrote_and_write_matches_it():
    torch.manual_seed(0)
    lay = layout_for("vec", block_size=B, kv_heads=H, head_dim=D)
    blocks = [4, 1, 3]
    T = 70                                    # two full blocks and part of a third
    keys, values = torch.randn(T, H, D), torch.randn(T, H, D)
    kernel = torch.zeros(NB, H, B, 2 * D)
    reshape_and_cache(kernel, keys, values, [blocks[p // B] * B + p % B for p in range(T)])
    lay.check(kernel)
    k, v = lay.read(kernel, blocks, 0, T)     # (1, H, T, D)
    assert torch.equal(k[0].permute(1, 0, 2), keys) and torch.equal(v[0].permute(1, 0, 2), values)
    ours = torch.zeros_like(kernel)
    lay.write(ours, blocks, 0, k[:, :, :40], v[:, :, :40])      # a load that ends mid-block ...
    lay.write(ours, blocks, 40, k[:, :, 40:], v[:, :, 40:])     # ... and the rest computed after it
    assert torch.equal(ours, kernel)
    k2, v2 = lay.read(ours, blocks, 33, 50)
    assert torch.equal(k2, k[:, :, 33:50]) and torch.equal(v2, v[:, :, 33:50])


def test_other_kernels_and_shapes_are_refused():
    with pytest.raises(RuntimeUnsupportedError, match="amx"):
        layout_for("amx", block_size=B, kv_heads=H, head_dim=D)
    with pytest.raises(RuntimeUnsupportedError, match="layout"):
        layout_for("vec", block_size=B, kv_heads=H, head_dim=D).check(torch.zeros(NB, B, H, 2 * D))
