"""benchmarks/gguf_quant.py: transformers' tensor names as llama.cpp names them, and the choice rule."""

from __future__ import annotations

import pytest

from bench_helpers import load_benchmark


@pytest.fixture(scope="module")
def bench():
    return load_benchmark("gguf_quant")


def test_every_tensor_of_a_qwen2_model_has_one_llama_cpp_name(bench, tiny):
    rt = tiny("qwen2")
    names = [bench.gguf_name(k) for k in rt.model.state_dict()]
    layers = rt.model.config.num_hidden_layers
    kept = [n for n in names if n is not None]
    assert len(set(kept)) == len(kept)                       # no two tensors land on one name
    per_layer = {"attn_norm.weight", "ffn_norm.weight", "attn_q.weight", "attn_q.bias", "attn_k.weight",
                 "attn_k.bias", "attn_v.weight", "attn_v.bias", "attn_output.weight", "ffn_gate.weight",
                 "ffn_up.weight", "ffn_down.weight"}
    assert {f"blk.{i}.{p}" for i in range(layers) for p in per_layer} <= set(kept)
    assert {"token_embd.weight", "output_norm.weight"} <= set(kept)
    assert bench.gguf_name("model.layers.3.self_attn.rotary_emb.inv_freq") is None
    assert bench.gguf_name("model.layers.3.mlp.down_proj.weight") == "blk.3.ffn_down.weight"


def _row(label, ms, agreement, lo):
    return {"label": label, "decode_ms": ms, "agreement": agreement, "agreement_ci95": [lo, 1.0]}


def test_the_choice_is_the_fastest_file_whose_interval_clears_the_floor(bench):
    rows = [_row("BF16", 26.0, 1.0, 1.0), _row("Q8_0", 20.0, 0.99, 0.985), _row("Q4_0", 12.0, 0.96, 0.95),
            _row("Q4_K_M", 15.0, 0.975, 0.969)]
    c = bench.choose(rows)
    assert c["label"] == "Q8_0" and c["cleared"] and c["fastest"] == "Q4_0"
    none = bench.choose([_row("Q4_0", 12.0, 0.9, 0.88), _row("Q3_K", 10.0, 0.8, 0.7)])
    assert none["label"] == "Q4_0" and not none["cleared"]
