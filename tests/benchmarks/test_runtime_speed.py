"""benchmarks/runtime_speed.py: a model's dtypes take turns within each repeat, each with its own runs."""

from __future__ import annotations

import pytest

from bench_helpers import load_benchmark

pytestmark = pytest.mark.needs_data  # the prompts are cut from train/lima.json


def test_every_variant_runs_once_per_repeat_and_keeps_its_own_numbers():
    bench = load_benchmark("runtime_speed")
    rows = bench.time_transformers("tiny-qwen2", 12, 3, 3, variants=(("float32", False), ("bfloat16", True)))
    assert [r["variant"] for r in rows] == ["float32", "bfloat16"]
    for r in rows:
        assert r["interleaved"] and len(r["prefill_s_all"]) == len(r["decode_ms_all"]) == 3
        assert r["prompt_tokens"] == 12 and len(r["tokens"]) == 3 and r["decode_ms"] > 0
    assert rows[0]["dtype"] == "float32" and rows[1]["dtype"] == "bfloat16"
