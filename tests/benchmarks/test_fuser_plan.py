"""The fuser plan: each checkpoint's progress, found committed or in C2C_HOME; finished runs copied for
committing; reports run only for finished fusers, and with their control only once it is finished."""

import json
import sys
from pathlib import Path

from bench_helpers import load_benchmark

ROOT = Path(__file__).resolve().parents[2]


def _plan(monkeypatch, tmp_path):
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))
    monkeypatch.setenv("C2C_HOME", str(tmp_path / "home"))
    mod = load_benchmark("fuser_plan")
    monkeypatch.setattr(mod, "COMMITTED", tmp_path / "committed")
    monkeypatch.setattr(mod.rep, "RESULTS", tmp_path / "results")
    return mod


def _run(tmp_path, name, step, total, *, committed=False, size=10):
    d = (tmp_path / "committed" / name) if committed else (tmp_path / "home" / "fuser" / "runs" / name)
    d.mkdir(parents=True)
    (d / "config.json").write_text(json.dumps({"step": step, "train": {"total_steps": total}}))
    (d / "fuser.safetensors").write_bytes(b"x" * size)
    return d


def test_progress_is_read_from_the_most_advanced_checkpoint(monkeypatch, tmp_path):
    plan = _plan(monkeypatch, tmp_path)
    _run(tmp_path, "general_pair_a", 40, 238)
    state = tmp_path / "home" / "fuser" / "runs" / "control_a" / "train_state"
    state.mkdir(parents=True)
    (state / "state.json").write_text(json.dumps({"step": 7}))  # saved state, no checkpoint yet
    _run(tmp_path, "pair_b", 244, 244, committed=True)
    st = plan.status()["checkpoints"]
    assert (st["general_pair_a"]["step"], st["general_pair_a"]["complete"], st["general_pair_a"]["committed"]) == (
        40, False, False)
    assert st["control_a"]["step"] == 7 and not st["control_a"]["complete"]
    assert st["pair_b"]["complete"] and st["pair_b"]["committed"]
    assert st["general_pair_c"]["path"] is None
    assert "general_pair_a   step 40/238" in plan.render(plan.status())


def test_a_finished_run_is_copied_for_committing_unless_too_large(monkeypatch, tmp_path):
    plan = _plan(monkeypatch, tmp_path)
    _run(tmp_path, "general_control", 238, 238)
    c = plan.checkpoint("general_control")
    assert c["complete"] and not c["committed"]
    dst = Path(plan.commit_checkpoint(c))
    assert (dst / "fuser.safetensors").read_bytes() == b"x" * 10 and plan.checkpoint("general_control")["committed"]
    _run(tmp_path, "general_pair_c", 238, 238, size=plan.MAX_COMMIT_BYTES + 1)
    assert plan.commit_checkpoint(plan.checkpoint("general_pair_c")) is None


def test_reports_wait_for_their_fuser_and_take_the_control_once_it_is_finished(monkeypatch, tmp_path, capsys):
    plan = _plan(monkeypatch, tmp_path)
    for name in ("pair_a", "general_pair_b", "pair_b", "control"):
        _run(tmp_path, name, 5, 5, committed=True)
    _run(tmp_path, "control_a", 3, 80)
    assert plan.main(["--run", "--dry-run", "--only", "report", "--pairs", "a"]) == 0
    out = capsys.readouterr().out
    assert "a/general: waits for general_pair_a" in out
    a_task = [line for line in out.splitlines() if "--pair a --kind task-tuned" in line]
    assert len(a_task) == 1 and "--control" not in a_task[0]  # control_a is at step 3 of 80
    assert "benchmarks/fuser_report.py" in a_task[0] and sys.executable in a_task[0]
    assert plan.main(["--run", "--dry-run", "--only", "report", "--pairs", "b"]) == 0
    out = capsys.readouterr().out
    assert "--pair b --kind task-tuned --checkpoint" in out and "--control" in out.split("--kind task-tuned")[1]
    assert "general_control" in out  # b/general: reporting without its control for now


def test_arc_easy_is_planned_for_general_fusers_only(monkeypatch, tmp_path):
    plan = _plan(monkeypatch, tmp_path)
    assert "ARC-Easy test" in plan.benchmarks("a", "general")
    assert "ARC-Easy test" not in plan.benchmarks("a", "task-tuned")  # pair_a drew examples from ARC-Easy
    assert "ARC-Easy test" in plan.report_status("a", "general", {"runs": {}})
