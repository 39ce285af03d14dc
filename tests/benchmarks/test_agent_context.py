"""benchmarks/agent_context.py on a tiny model: every condition runs an episode, and the counts add up."""

from __future__ import annotations

import pytest

from bench_helpers import load_benchmark

pytestmark = pytest.mark.needs_data  # the episodes cut their documents from train/lima.json


@pytest.fixture(scope="module")
def bench():
    return load_benchmark("agent_context")


@pytest.fixture(scope="module")
def runs(bench, tiny):
    from c2c.bench import agent_episodes

    rt = tiny("qwen2")
    [ep] = agent_episodes.build(rt, 1, steps=12, doc_tokens=60, keep=4, seed=1,
                                checkpoints={6: (1, 1), 12: (2, 1)})
    return ep, {c: bench.run_episode(rt, ep, c, keep=4, max_new_tokens=2) for c in bench.CONDITIONS}


def test_every_condition_reads_the_same_tokens_and_only_the_cache_paths_skip_the_prefill(runs):
    ep, out = runs
    text, keep = out["text_drop"]["steps"], out["keep"]["steps"]
    for c, r in out.items():
        steps = r["steps"]
        assert [a["id"] for a in r["answers"]] == [q.id for q in ep.questions]
        if c != "keep":  # the same kept messages, so the same prompt, in every dropping condition
            assert [s["prompt_tokens"] for s in steps] == [s["prompt_tokens"] for s in text]
    # from step 5 (keep 4) on, the text drop re-prefills what followed the dropped response; the cache drops don't
    assert all(t["prefilled"] > d["prefilled"] for t, d in zip(text[5:], out["cache_drop"]["steps"][5:]))
    assert all(s["prompt_tokens"] < k["prompt_tokens"] for s, k in zip(text[5:], keep[5:]))
    gaps, closed = out["cache_drop_gaps"]["steps"][-1], out["cache_drop"]["steps"][-1]
    assert gaps["positions"] > gaps["prompt_tokens"] and closed["positions"] == closed["prompt_tokens"]
    assert sum(s["recomputed"] for s in out["repair_first16"]["steps"]) > 0
    assert sum(s["recomputed"] for s in out["cache_drop"]["steps"]) == 0


def test_the_summary_pairs_by_question_and_states_the_acceptance(bench, runs):
    _, out = runs
    s = bench.summarize(list(out.values()), list(bench.CONDITIONS), keep=4)
    assert s["text_drop"]["kept"]["n"] == 3 and "diff_vs_text_drop" not in s["text_drop"]["kept"]
    d = s["cache_drop"]["kept_after_drops"]
    assert d["n"] == 3 and -1 <= d["diff_vs_text_drop"] <= 1 and d["diff_ci95"][0] <= d["diff_vs_text_drop"]
    assert s["keep"]["kv_bytes_last_step"] > s["cache_drop"]["kv_bytes_last_step"]
    assert set(s["cache_drop"]["ttft_s_by_step"]) == set(range(1, 13))
