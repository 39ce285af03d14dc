"""The fuser report's JSON: parallel runs of one pair merge; a new checkpoint starts the pair over."""

import importlib.util
import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _report():
    spec = importlib.util.spec_from_file_location("fuser_report", ROOT / "benchmarks" / "fuser_report.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _entry(acc: float, conds=("receiver", "sharer", "t2t", "c2c", "control"), questions="q") -> dict:
    return {"n": 10, "accuracy": {c: acc for c in conds}, "latency_s": {c: 0.5 for c in conds},
            "questions": questions, "control_id": "c1"}


def test_two_runs_of_one_pair_merge_and_a_new_checkpoint_starts_over(tmp_path):
    rep = _report()
    out = tmp_path / "fuser.json"
    ident = {"fuser_id": "f1", "limit": 10, "seed": 0, "hint_tokens": 48, "scoring": "text"}
    meta = {**ident, "receiver": "R", "sharer": "S", "step": 5, "device": "cpu", "checkpoint": "x"}
    # two processes, each started before the other wrote anything
    rep.record_benchmark(out, "b", {**meta, "benchmarks": {}}, "MMLU val", _entry(0.25))
    rep.record_benchmark(out, "b", {**meta, "benchmarks": {}}, "OpenBookQA", _entry(0.75))
    pair = json.loads(out.read_text())["pairs"]["b"]
    assert set(pair["benchmarks"]) == {"MMLU val", "OpenBookQA"}
    assert pair["summary"]["accuracy"]["c2c"] == 0.5 and pair["summary"]["benchmarks"] == 2
    assert "| **average** (2 complete) | 20 |" in (tmp_path / "fuser.md").read_text() and (tmp_path / "fuser.png").is_file()
    # another checkpoint: its numbers are not comparable, the old benchmarks go
    rep.record_benchmark(out, "b", {**meta, "fuser_id": "f2", "benchmarks": {}}, "C-Eval val", _entry(0.1))
    pair = json.loads(out.read_text())["pairs"]["b"]
    assert set(pair["benchmarks"]) == {"C-Eval val"} and pair["fuser_id"] == "f2"


def test_conditions_run_later_join_the_same_questions_only(tmp_path):
    rep = _report()
    out = tmp_path / "fuser.json"
    meta = {"fuser_id": "f1", "limit": 10, "seed": 0, "hint_tokens": 48, "scoring": "text", "receiver": "R",
            "sharer": "S", "step": 5, "device": "cpu", "checkpoint": "x"}
    rep.record_benchmark(out, "b", {**meta, "benchmarks": {}}, "MMLU val", _entry(0.3, ("receiver", "c2c")))
    rep.record_benchmark(out, "b", {**meta, "benchmarks": {}}, "MMLU val", _entry(0.2, ("control",)))
    acc = json.loads(out.read_text())["pairs"]["b"]["benchmarks"]["MMLU val"]["accuracy"]
    assert acc == {"receiver": 0.3, "c2c": 0.3, "control": 0.2}
    # other questions (another subset): the entry is replaced, not mixed
    rep.record_benchmark(out, "b", {**meta, "benchmarks": {}}, "MMLU val", _entry(0.9, ("control",), "other"))
    acc = json.loads(out.read_text())["pairs"]["b"]["benchmarks"]["MMLU val"]["accuracy"]
    assert acc == {"control": 0.9}


def test_a_stale_view_of_another_benchmark_does_not_overwrite_a_fresher_one(tmp_path):
    rep = _report()
    out = tmp_path / "fuser.json"
    meta = {"fuser_id": "f1", "limit": 10, "seed": 0, "hint_tokens": 48, "scoring": "text", "receiver": "R",
            "sharer": "S", "step": 5, "device": "cpu", "checkpoint": "x"}
    shared = _entry(0.3, ("receiver", "control"))
    # both processes start when C-Eval holds only the shared conditions
    stale = rep.record_benchmark(out, "a", {**meta, "benchmarks": {}}, "C-Eval val", shared)
    # process 1 finishes C-Eval; process 2 (MMLU) still holds the stale C-Eval entry in memory
    rep.record_benchmark(out, "a", {**meta, "benchmarks": {}}, "C-Eval val", _entry(0.6, ("sharer", "t2t", "c2c")))
    rep.record_benchmark(out, "a", stale, "MMLU val", _entry(0.4))
    benches = json.loads(out.read_text())["pairs"]["a"]["benchmarks"]
    assert set(benches["C-Eval val"]["accuracy"]) == {"receiver", "control", "sharer", "t2t", "c2c"}
    assert benches["C-Eval val"]["accuracy"]["c2c"] == 0.6 and benches["MMLU val"]["accuracy"]["c2c"] == 0.4


def test_a_progress_file_cut_mid_line_keeps_its_complete_records(tmp_path):
    rep = _report()
    p = tmp_path / "b-key.jsonl"
    p.write_text('{"id": "q1", "pred": {}}\n{"id": "q2", "pred": {}}\n{"id": "q3", "pr')
    assert [r["id"] for r in rep._read_records(p)] == ["q1", "q2"]
    assert rep._read_records(tmp_path / "missing.jsonl") == []


def test_only_the_same_computation_is_shared_between_pairs():
    rep = _report()
    other = {"receiver": "R", "scoring": "text", "benchmarks": {"MMLU val": _entry(0.4, questions="q")}}
    got = rep.shared_conditions(other, "MMLU val", "q", receiver="R", scoring="text", control_id="c1")
    assert got["accuracy"] == {"receiver": 0.4, "control": 0.4} and got["control_id"] == "c1"
    # another control checkpoint: only the Receiver alone is the same computation
    got = rep.shared_conditions(other, "MMLU val", "q", receiver="R", scoring="text", control_id="c2")
    assert set(got["accuracy"]) == {"receiver"} and "control_id" not in got
    # other questions, another Receiver, other scoring or a missing benchmark: nothing is shared
    assert rep.shared_conditions(other, "MMLU val", "other", receiver="R", scoring="text", control_id="c1") == {}
    assert rep.shared_conditions(other, "MMLU val", "q", receiver="R2", scoring="text", control_id="c1") == {}
    assert rep.shared_conditions(other, "MMLU val", "q", receiver="R", scoring="label", control_id="c1") == {}
    assert rep.shared_conditions(other, "OpenBookQA", "q", receiver="R", scoring="text", control_id="c1") == {}
    assert rep.shared_conditions(None, "MMLU val", "q", receiver="R", scoring="text", control_id="c1") == {}


def test_the_average_counts_only_benchmarks_with_every_condition():
    rep = _report()
    pair = {"benchmarks": {"A": _entry(0.2), "B": _entry(0.6), "C": _entry(0.9, ("receiver", "control"))}}
    avg = rep.summarize(pair)
    assert avg["benchmarks"] == 2 and avg["n"] == 20 and abs(avg["accuracy"]["receiver"] - 0.4) < 1e-9
    assert rep.summarize({"benchmarks": {"C": _entry(0.9, ("receiver",))}}) == {}
