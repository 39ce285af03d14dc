"""benchmarks/xmodel_map.py: its numbers from records, its calibration record, and a resumable run on tiny models."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from bench_helpers import load_benchmark

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def bench():
    return load_benchmark("xmodel_map")


def _records(n, right):
    """``right[c]``: how many of the ``n`` questions condition ``c`` gets right (the first ones)."""
    out = []
    for i in range(n):
        for c, k in right.items():
            r = {"id": f"q{i}", "condition": c, "correct": i < k}
            if c in ("target", "mapped"):
                r["context_s"] = 2.0 if c == "target" else 0.1 * (1 + i % 2)
            out.append(r)
    return out


def test_report_pairs_the_conditions_and_times_the_same_questions(bench):
    recs = _records(100, {"target": 80, "mapped": 60, "source": 30, "text": 40, "none": 2})
    r = bench.report(recs, ["target", "mapped", "source", "text", "none"], n=100)
    assert r["conditions"]["mapped"]["correct"] == 60 and r["complete"]
    ms = r["paired"]["mapped-source"]
    assert ms["n"] == 100 and abs(ms["diff"] - 0.3) < 1e-12 and ms["clears_zero"]
    assert r["paired"]["mapped-target"]["below_zero"]
    assert abs(r["mapped_over_target_accuracy"] - 0.75) < 1e-12
    assert r["speed"]["median_speedup"] == pytest.approx(15.0) and r["speed"]["min_speedup"] == pytest.approx(10.0)
    partial = bench.report(recs[:-3], ["target", "mapped", "source", "text", "none"], n=100)
    assert not partial["complete"]


def test_a_calibration_record_is_earned_only_by_a_clear_win(bench):
    win = bench.report(_records(100, {"target": 80, "mapped": 60, "source": 30}), ["target", "mapped", "source"], n=100)
    tie = bench.report(_records(100, {"target": 80, "mapped": 31, "source": 30}), ["target", "mapped", "source"], n=100)
    for r in (win, tie):
        r["map_id"] = "c" * 64
    a, b = bench.calibration(win, task="t"), bench.calibration(tie, task="t")
    assert a.earned and a.mapped_correct == 60 and a.source_correct == 30 and a.target_correct == 80
    assert not b.earned


@pytest.mark.slow
def test_a_run_on_tiny_models_writes_every_file_and_resumes(tmp_path):
    from c2c.runtime import zoo
    from c2c.xmodel import FitConfig, fit

    rt = zoo.load("tiny-qwen2", dtype="float32")
    streams = [[(i * 7 + j * 13) % 256 for j in range(40)] for i in range(12)]
    fit(rt, rt, FitConfig(tokens=300, seq_len=40, layer_window=1), streams=streams,
        progress=False).save(tmp_path / "tiny.c2cmap")
    cmd = [sys.executable, str(ROOT / "benchmarks" / "xmodel_map.py"), "--source", "tiny-qwen2", "--target",
           "tiny-qwen2", "--map", str(tmp_path / "tiny.c2cmap"), "--doc-tokens", "48", "--n", "2",
           "--max-new-tokens", "2", "--note-tokens", "3", "--out-dir", str(tmp_path / "out")]
    # a corpus of its own (the benchmark cuts its documents from train/lima.json under C2C_DATA), so the run
    # needs no shared data folder beside the checkout
    data = tmp_path / "data"
    (data / "train").mkdir(parents=True)
    words = "the quick brown fox jumps over a lazy dog near the river bank".split()
    rows = [{"output": " ".join(f"{words[(i + k) % len(words)]}{'.' if k % 9 == 8 else ''}" for k in range(60))}
            for i in range(40)]
    (data / "train" / "lima.json").write_text(json.dumps(rows))
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src"), C2C_DATA=str(data))
    # two shards (as two processes on two cores would run them) write one run's records
    subprocess.run(cmd + ["--shard", "1/2"], check=False, env=env, capture_output=True, text=True, timeout=600)
    records = tmp_path / "out" / "xmodel_map" / "tiny-qwen2--tiny-qwen2_48.jsonl"
    assert {json.loads(x)["id"] for x in records.read_text().splitlines()} == {"cqa-48-0-1"}
    subprocess.run(cmd + ["--shard=0/2"], check=False, env=env, capture_output=True, text=True, timeout=600)
    lines = records.read_text().splitlines()
    assert len(lines) == 2 * 6  # 2 questions x 6 conditions
    assert {json.loads(x)["condition"] for x in lines} == {"target", "mapped", "mapped_all", "source", "text", "none"}
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    assert len(records.read_text().splitlines()) == 12, proc.stderr[-2000:]  # resumed: nothing recomputed
    result = json.loads((tmp_path / "out" / "xmodel_map.json").read_text())
    run = result["runs"]["tiny-qwen2--tiny-qwen2_48"]
    assert run["complete"] and "mapped-source" in run["paired"] and run["speed"]["n"] == 2
    assert "--shard" not in run["command"] and "--n 2" in run["command"]
    assert (tmp_path / "out" / "xmodel_map.md").read_text().count("mapped - source") >= 1
    assert (tmp_path / "out" / "xmodel_map.png").is_file()
    # a self map reproduces the model's own cache: the same replies as the model's own prefill
    recs = {(r["id"], r["condition"]): r for r in map(json.loads, lines)}
    assert all(recs[i, "mapped"]["reply"] == recs[i, "target"]["reply"] for i, _ in recs)


def test_a_bad_shard_is_refused_before_any_model_loads():
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "xmodel_map.py"), "--shard", "2/2"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "--shard must be I/K" in proc.stderr
