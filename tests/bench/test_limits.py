"""c2c.bench.limits: a forward pass's FLOPs and bytes, counted from the model as the runtime holds it."""

from __future__ import annotations

import pytest

from c2c.bench import limits


def _by_config(rt, n: int, past: int) -> float:
    """The same count from the config alone (qwen2: q/k/v/o projections, a gated MLP, a tied LM head)."""
    c = rt.model.config
    hd = c.hidden_size // c.num_attention_heads
    q, kv = c.num_attention_heads * hd, c.num_key_value_heads * hd
    per_layer = c.hidden_size * q + 2 * c.hidden_size * kv + q * c.hidden_size + 3 * c.hidden_size * c.intermediate_size
    attended = n * past + n * (n + 1) / 2
    return (2.0 * n * c.num_hidden_layers * per_layer + 2.0 * c.hidden_size * c.vocab_size
            + 4.0 * c.num_hidden_layers * c.num_attention_heads * hd * attended)


@pytest.mark.parametrize("n,past", [(1, 0), (1, 37), (16, 0), (16, 5)])
def test_prefill_flops_match_a_count_from_the_config(tiny, n, past):
    rt = tiny("qwen2")
    assert limits.prefill_flops(rt, n, past) == pytest.approx(_by_config(rt, n, past), rel=1e-12)


def test_decode_bytes_count_each_weight_once_plus_the_cache_it_reads(tiny):
    rt = tiny("qwen2")
    f = rt.facts
    per_position = 2 * f.num_layers * f.kv_heads * f.head_dim * rt.model.dtype.itemsize
    assert limits.decode_bytes(rt, 11) - limits.decode_bytes(rt, 10) == per_position
    weights = limits.decode_bytes(rt, 0)
    everything = sum(p.numel() * p.element_size() for p in rt.model.parameters())
    row = rt.model.config.hidden_size * rt.model.dtype.itemsize
    table = rt.model.get_input_embeddings().weight.numel() * rt.model.dtype.itemsize
    # one embedding row, not the table; a tied head reads the table as the head (parameters() yields it once)
    expected = everything + row if rt.model.config.tie_word_embeddings else everything - table + row
    assert weights == expected


def test_a_pass_is_bound_by_its_flops_or_its_bytes_whichever_is_slower(tiny):
    rt = tiny("qwen2")
    slow_math = limits.Limits(gemm_gflops=1e-3, read_gb_s=1e6)
    slow_memory = limits.Limits(gemm_gflops=1e6, read_gb_s=1e-3)
    cost = limits.pass_cost(rt, 4, 2)
    assert cost.seconds(slow_math) == pytest.approx(limits.prefill_flops(rt, 4, 2) / 1e6)
    assert cost.seconds(slow_memory) == pytest.approx(limits.decode_bytes(rt, 6) / 1e6)
    step = limits.pass_cost(rt, 1, 9)
    b = limits.Bound.of([limits.pass_cost(rt, 4, 0), limits.pass_cost(rt, 3, 4)], [step] * 5, slow_memory)
    assert b.decode_s == pytest.approx(5 * limits.decode_bytes(rt, 10) / 1e6)
    assert b.seconds == pytest.approx(b.prefill_s + b.decode_s) and b.prefill_s > 0


def test_the_best_of_several_measurements_is_each_limits_maximum():
    best = limits.Limits.best([limits.Limits(gemm_gflops=300, read_gb_s=50), limits.Limits(gemm_gflops=400,
                                                                                           read_gb_s=30)])
    assert best == limits.Limits(gemm_gflops=400, read_gb_s=50)


def test_packed_bf16_reads_what_dense_bf16_reads_and_int8_reads_a_byte_per_weight():
    """The two storage kinds the published rows run on: oneDNN-packed bf16 (two bytes a weight, as dense) and
    int8 decode copies (one byte a weight plus a scale per output channel)."""
    import torch

    from c2c.runtime import zoo
    from c2c.runtime.transformers import int8, packing

    packed = zoo.load("tiny-qwen2", dtype="bfloat16")
    if not any(isinstance(m, packing.PackedLinear) for m in packed.model.modules()):
        pytest.skip("this CPU does not pack bf16 linear layers for oneDNN (no AVX512-BF16 or AMX)")
    dense = zoo.load("tiny-qwen2", dtype="bfloat16")
    dense.ensure_dense()
    assert limits.decode_bytes(packed, 7) == limits.decode_bytes(dense, 7)
    try:
        q = zoo.load("tiny-qwen2", dtype="int8")
    except Exception as e:  # noqa: BLE001 - int8 decode needs x86's quantized engine
        pytest.skip(f"no int8 runtime here: {e}")
    lins = [m for m in q.model.modules() if isinstance(m, int8.Int8DecodeLinear)]
    assert lins and q.dtype == torch.bfloat16
    saved = sum(m.in_features * m.out_features * 2 - (m.in_features * m.out_features + 4 * m.out_features)
                for m in lins)
    assert limits.decode_bytes(dense, 7) - limits.decode_bytes(q, 7) == saved
