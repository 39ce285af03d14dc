"""benchmarks/int8_quality.py: the pooled agreement's interval and the context-QA pairing, from records."""

from __future__ import annotations

import json

import pytest

from bench_helpers import load_benchmark


@pytest.fixture(scope="module")
def bench():
    return load_benchmark("int8_quality")


def test_the_agreement_interval_resamples_prompts_and_holds_the_pooled_share(bench):
    hits, totals = [32] * 90 + [16] * 10, [32] * 100
    lo, hi = bench.ratio_interval(hits, totals)
    pooled = sum(hits) / sum(totals)
    assert lo < pooled < hi and hi - lo < 0.06
    assert bench.ratio_interval([5] * 50, [5] * 50) == (1.0, 1.0)


def test_context_qa_runs_are_paired_by_question_and_condition(bench, tmp_path):
    def run(name, right):
        rows = [{"id": f"q{i}", "condition": c, "correct": i in right} for i in range(10) for c in ("none", "text")]
        (tmp_path / name).write_text("\n".join(json.dumps(r) for r in rows) + "\n")
        return tmp_path / name

    out = bench.paired_context_qa(run("a.jsonl", set(range(8))), run("b.jsonl", {0, 1, 2, 3, 4, 5, 6, 9}))
    assert out["n"] == 10 and out["bf16"] == out["int8"] == 0.8 and out["difference"] == 0
    assert out["discordant"] == 2 and out["ci95"][0] < 0 < out["ci95"][1]
    (tmp_path / "c.jsonl").write_text(json.dumps({"id": "x", "condition": "text", "correct": True}) + "\n")
    with pytest.raises(SystemExit, match="share no question"):
        bench.paired_context_qa(tmp_path / "a.jsonl", tmp_path / "c.jsonl")
