"""benchmarks/handoff_sweep.py: a point's median over repeats keeps every run's timings."""

from __future__ import annotations

from bench_helpers import load_benchmark


def test_the_median_of_repeats_keeps_each_runs_timings_and_recomputes_the_ratios():
    bench = load_benchmark("handoff_sweep")
    runs = [{"text_pipeline_s": t, "cache_pipeline_s": c, "slice_pipeline_s": 2.0, "cache_handoff_s": 0.1,
             "text_handoff_s": 1.0, "llama_text_pipeline_s": 20.0, "exact": True, "model": "m"}
            for t, c in ((10.0, 2.0), (12.0, 4.0), (11.0, 3.0))]
    r = bench.median_run(runs)
    assert (r["cache_pipeline_s"], r["text_pipeline_s"]) == (3.0, 11.0) and r["repeats"] == 3
    assert r["each_run"]["cache_pipeline_s"] == [2.0, 4.0, 3.0]
    assert r["speedup_vs_llama_text"] == 20.0 / 3.0 and r["speedup_full"] == 11.0 / 3.0
