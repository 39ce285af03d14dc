"""c2c.vllm.paged: every packing of the table against a line-by-line model of vLLM's CPU ``reshape_and_cache``,
and against the installed wheel's own kernel (through ``.venv-vllm``) for each packing this CPU can run it for."""

from __future__ import annotations

import pytest
import torch

from c2c.errors import RuntimeUnsupportedError
from c2c.vllm.paged import check_against_kernel, layout_for

NB, H, B, D = 6, 3, 32, 64


def reshape_and_cache(layer, keys, values, slots):
    """vLLM's vec kernel, one element at a time: per (block, head) K as [D, B] then V as [B, D]."""
    flat, heads = layer.view(-1), layer.shape[1]
    for t, slot in enumerate(slots):
        b, o = divmod(slot, B)
        for h in range(heads):
            base = (b * heads + h) * 2 * B * D
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
    lay.require_layer(kernel)
    k, v = lay.read(kernel, blocks, 0, T)     # (1, H, T, D)
    assert torch.equal(k[0].permute(1, 0, 2), keys) and torch.equal(v[0].permute(1, 0, 2), values)
    ours = torch.zeros_like(kernel)
    lay.write(ours, blocks, 0, k[:, :, :40], v[:, :, :40])      # a load that ends mid-block ...
    lay.write(ours, blocks, 40, k[:, :, 40:], v[:, :, 40:])     # ... and the rest computed after it
    assert torch.equal(ours, kernel)
    k2, v2 = lay.read(ours, blocks, 33, 50)
    assert torch.equal(k2, k[:, :, 33:50]) and torch.equal(v2, v[:, :, 33:50])


def reshape_and_cache_amx(layer, keys, values, slots):
    """vLLM's amx kernel as its issue states it, one element at a time: per (block, head) B*D keys as
    [B/16, D/2, 16, 2] with K[p//16, d//2, p%16, d%2] = key[p, d], then values as [D/16, B/2, 16, 2] with
    V[d//16, p//2, d%16, p%2] = value[p, d]."""
    flat, heads = layer.view(-1), layer.shape[1]
    for t, slot in enumerate(slots):
        b, p = divmod(slot, B)
        for h in range(heads):
            base = (b * heads + h) * 2 * B * D
            for d in range(D):
                flat[base + ((p // 16) * (D // 2) + d // 2) * 32 + (p % 16) * 2 + d % 2] = keys[t, h, d]
                flat[base + B * D + ((d // 16) * (B // 2) + p // 2) * 32 + (d % 16) * 2 + p % 2] = values[t, h, d]


def test_the_amx_packing_reads_what_its_model_wrote_and_writes_the_same_bytes():
    torch.manual_seed(1)
    lay = layout_for("amx", block_size=B, kv_heads=H, head_dim=D)
    assert lay.name == "cpu_attn:amx k:B16xD2x16x2 v:D16xB2x16x2" != layout_for("vec", block_size=B, kv_heads=H,
                                                                                 head_dim=D).name
    blocks, T = [5, 2, 0], 75
    keys, values = torch.randn(T, H, D).bfloat16(), torch.randn(T, H, D).bfloat16()
    kernel = torch.zeros(NB, H, B, 2 * D, dtype=torch.bfloat16)
    reshape_and_cache_amx(kernel, keys, values, [blocks[p // B] * B + p % B for p in range(T)])
    lay.require_layer(kernel)
    k, v = lay.read(kernel, blocks, 0, T)
    assert torch.equal(k[0].permute(1, 0, 2), keys) and torch.equal(v[0].permute(1, 0, 2), values)
    ours = torch.zeros_like(kernel)
    lay.write(ours, blocks, 0, k[:, :, :33], v[:, :, :33])
    lay.write(ours, blocks, 33, k[:, :, 33:], v[:, :, 33:])
    assert torch.equal(ours.view(torch.int16), kernel.view(torch.int16))


@pytest.mark.parametrize("isa, model", [("vec", reshape_and_cache), ("amx", reshape_and_cache_amx)])
@pytest.mark.parametrize("heads", [1, 3])
def test_a_write_inside_blocks_leaves_every_other_position_as_it_was(isa, model, heads):
    """A load that begins and ends part way through blocks (and one of whole blocks, and one inside a single
    block) writes exactly the kernel's slots for those positions: the other positions of the same blocks, and
    other blocks, keep their bytes. One KV head too (multi-query models, or one head per tensor-parallel rank)."""
    torch.manual_seed(2)
    lay = layout_for(isa, block_size=B, kv_heads=heads, head_dim=D)
    blocks = [3, 0, 5]
    for start, end in ((33, 50), (5, 90), (32, 64), (0, 10), (40, 41)):
        keys, values = torch.randn(end - start, heads, D).bfloat16(), torch.randn(end - start, heads, D).bfloat16()
        before = torch.randn(NB, heads, B, 2 * D).bfloat16()
        theirs, ours = before.clone(), before.clone()
        model(theirs, keys, values, [blocks[p // B] * B + p % B for p in range(start, end)])
        lay.write(ours, blocks, start, keys.permute(1, 0, 2)[None], values.permute(1, 0, 2)[None])
        assert torch.equal(ours.view(torch.int16), theirs.view(torch.int16)), (start, end)
        k, v = lay.read(ours, blocks, start, end)
        assert torch.equal(k[0].permute(1, 0, 2), keys) and torch.equal(v[0].permute(1, 0, 2), values)


def test_positions_beyond_the_blocks_given_are_refused():
    lay = layout_for("vec", block_size=B, kv_heads=H, head_dim=D)
    layer = torch.zeros(NB, H, B, 2 * D)
    with pytest.raises(RuntimeUnsupportedError, match="need 2 KV blocks"):
        lay.read(layer, [2], 0, B + 8)
    with pytest.raises(RuntimeUnsupportedError, match="need 2 KV blocks"):
        lay.write(layer, [2], 30, torch.zeros(1, H, 5, D), torch.zeros(1, H, 5, D))


def test_other_kernels_and_shapes_are_refused():
    with pytest.raises(RuntimeUnsupportedError, match="neon"):
        layout_for("neon", block_size=B, kv_heads=H, head_dim=D)
    with pytest.raises(RuntimeUnsupportedError, match="multiples of 32"):
        layout_for("amx", block_size=16, kv_heads=H, head_dim=D)
    with pytest.raises(RuntimeUnsupportedError, match="layout"):
        layout_for("vec", block_size=B, kv_heads=H, head_dim=D).require_layer(torch.zeros(NB, B, H, 2 * D))
    with pytest.raises(RuntimeUnsupportedError, match="packs"):
        layout_for("amx", block_size=B, kv_heads=H, head_dim=D).require_layer(torch.zeros(NB, H, B, 2 * D))


def test_a_packing_that_disagrees_with_the_kernel_stops_the_connector():
    """check_against_kernel with a kernel that packs otherwise (here: the vec model called for an amx layout)."""
    def vec_kernel(keys, values, key_cache, value_cache, slots, isa):
        layer = torch.cat([key_cache, value_cache], dim=2).view(key_cache.shape[0], H, B, 2 * D)
        reshape_and_cache(layer, keys, values, slots.tolist())
        key_cache.copy_(layer.view(-1, H, 2 * B, D)[:, :, :B]), value_cache.copy_(layer.view(-1, H, 2 * B, D)[:, :, B:])

    check_against_kernel(layout_for("vec", block_size=B, kv_heads=H, head_dim=D), vec_kernel, torch.float32)
    with pytest.raises(RuntimeUnsupportedError, match="--dtype float32"):
        check_against_kernel(layout_for("amx", block_size=B, kv_heads=H, head_dim=D), vec_kernel, torch.bfloat16)


KERNEL_CHECK = """
import sys, torch
from vllm import _custom_ops as ops
from c2c.vllm.paged import check_against_kernel, layout_for
isa, dtype = sys.argv[1], getattr(torch, sys.argv[2])
for B, H, D in ((32, 3, 64), (128, 2, 64), (64, 1, 128)):
    check_against_kernel(layout_for(isa, block_size=B, kv_heads=H, head_dim=D), ops.cpu_attn_reshape_and_cache, dtype)
print("exact", isa, sys.argv[2])
"""


@pytest.mark.vllm
@pytest.mark.parametrize("isa, dtype", [("vec", "float32"), ("vec", "bfloat16"), ("vec16", "float32"),
                                        ("amx", "bfloat16")])
def test_the_packing_is_bit_exact_against_the_wheels_own_kernel(isa, dtype):
    """The installed vLLM's ``cpu_attn_reshape_and_cache`` writes; c2c reads it back bit-identically, and its own
    writes are the same bytes. Every packing's reshape is plain data movement, so it runs on any x86 CPU, the amx
    one included (vLLM's amx *attention* needs AMX; its block packing does not); the connector runs the same
    check at start-up."""
    import subprocess

    from c2c.testing.vllm import vllm_python

    py = vllm_python()
    proc = subprocess.run([str(py), "-c", KERNEL_CHECK, isa, dtype], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0 and f"exact {isa} {dtype}" in proc.stdout, proc.stderr[-3000:]


LOAD_FAILURE = """
import logging, torch
from c2c.vllm.connector import C2CConnector, LoadSpec
from c2c.vllm.paged import layout_for
logging.disable(logging.CRITICAL)
B, H, D = 32, 2, 64
c = C2CConnector.__new__(C2CConnector)   # the worker side's state only: no engine is started
c.block_size, c.layout = B, layout_for("vec", block_size=B, kv_heads=H, head_dim=D)
c._kv = {f"model.layers.{i}.self_attn.attn": torch.zeros(6, H, B, 2 * D) for i in range(2)}
c._layer_of = {name: i for i, name in enumerate(c._kv)}
c._pending, c._failed_blocks = {}, set()
kv = torch.ones(1, H, 70, D)
good = LoadSpec(req_id="good", commit="a" * 64, staged="-", start=0, end=40, block_ids=(4, 1))
bad = LoadSpec(req_id="bad", commit="b" * 64, staged="-", start=0, end=70, block_ids=(2, 3))   # needs 3 blocks
for i in range(2):
    c._pending[i] = [(bad, (kv, kv)), (good, (kv, kv))]
for name in c._kv:
    c.wait_for_layer_load(name)
failed = c.get_block_ids_with_load_errors()
assert c.get_block_ids_with_load_errors() == set() and not c._pending
for name in c._kv:   # the good request loaded on every layer; the bad one wrote nothing
    assert c._kv[name][[4, 1]].abs().sum() > 0 and c._kv[name][[2, 3]].abs().sum() == 0
print("recomputed", sorted(failed))
"""


@pytest.mark.vllm
def test_a_load_the_worker_cannot_write_is_reported_for_recompute_and_the_others_load():
    """A load whose positions its blocks cannot hold (refused by the layout) does not fail vLLM's forward pass:
    its other layers are dropped, its blocks reported through ``get_block_ids_with_load_errors`` (vLLM then
    recomputes them, once), and the other requests of the same step load as usual."""
    import subprocess

    from c2c.testing.vllm import vllm_python

    proc = subprocess.run([str(vllm_python()), "-c", LOAD_FAILURE], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0 and "recomputed [2, 3]" in proc.stdout, proc.stderr[-3000:]
