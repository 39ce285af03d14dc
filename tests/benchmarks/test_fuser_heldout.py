"""The held-out fuser audit: the learning-curve slope and its verdict, and fuser/control losses paired by example."""

import json
import sys
from pathlib import Path

import pytest

from bench_helpers import load_benchmark

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def ho():
    sys.path.insert(0, str(ROOT / "benchmarks"))  # it reads training logs with fuser_report's reader
    mod = load_benchmark("fuser_heldout")
    yield mod
    sys.path.remove(str(ROOT / "benchmarks"))


def _log(path: Path, losses) -> Path:
    path.write_text("".join(json.dumps({"step": i + 1, "loss": x}) + "\n" for i, x in enumerate(losses)))
    return path


def _curve(ho, tmp_path, gap):
    import numpy as np

    rng = np.random.default_rng(1)
    control = 2.0 + 0.05 * rng.standard_normal(200)
    fuser = control + np.array([gap(i) for i in range(200)]) + 0.002 * rng.standard_normal(200)
    return ho.gap_curve(_log(tmp_path / "f.jsonl", fuser), _log(tmp_path / "c.jsonl", control))


def test_a_gap_that_falls_with_data_is_called_so(ho, tmp_path):
    c = _curve(ho, tmp_path, lambda i: 0.03 - 0.0003 * i)           # +0.03 down to -0.03
    assert c["slope_per_100_steps"] == pytest.approx(-0.03, abs=0.003) and c["slope_ci95"][1] < 0
    assert c["quarters"][0]["ci95"][0] > 0 and c["quarters"][-1]["ci95"][1] < 0
    assert ho.verdict(c) == "falls with data; below the control in the last quarter"


def test_a_flat_gap_is_not_called_a_trend(ho, tmp_path):
    c = _curve(ho, tmp_path, lambda i: 0.01)
    lo, hi = c["slope_ci95"]
    assert lo < 0 < hi
    assert ho.verdict(c) == "flat; above the control in the last quarter"
    assert ho.verdict(None) == "no log"


def test_losses_are_paired_by_example_and_skipped_ones_left_out(ho):
    ids = ["e1", "e2", "e3", "e4"]
    recs = [{"checkpoint": "general_pair_b", "fuser_id": "f", "example": i, "loss": x}
            for i, x in zip(ids, [1.0, 2.0, None, 4.0])]
    recs += [{"checkpoint": "general_control", "fuser_id": "c", "example": i, "loss": x}
             for i, x in zip(ids, [1.5, 2.5, 3.0, 4.5])]
    rows = {r["fuser"]: r for r in ho.build(recs, ids, pool=10, limit=4, seed=0)["pairs"]}
    b = rows["general_pair_b"]
    assert b["n"] == 3 and b["diff"] == pytest.approx(-0.5) and b["diff_ci95"][1] < 0   # e3: no fuser loss
    assert b["control_loss"] == pytest.approx((1.5 + 2.5 + 4.5) / 3)
    assert rows["general_pair_a"]["n"] == 0                                             # no records: not shown
    md = ho.render(ho.build(recs, ids, pool=10, limit=4, seed=0))
    assert "**-0.5000" in md                                                            # it clears zero: bold


@pytest.fixture(scope="module")
def more(ho):
    return load_benchmark("fuser_more_data")


def _recs(name, losses):
    return [{"checkpoint": name, "fuser_id": name, "example": f"e{i}", "loss": x} for i, x in enumerate(losses)]


@pytest.mark.parametrize("after_gap,verdict", [
    (-0.2, "moves the fuser's held-out loss below its control's"),
    (0.05, "lowers the fuser's held-out gap to its control, but not below"),
    (0.2, "does not measurably change"),
    (0.5, "widens"),
])
def test_more_data_verdict_follows_the_paired_change(more, tmp_path, after_gap, verdict):
    import numpy as np

    rng = np.random.default_rng(0)
    control = 2 + rng.standard_normal(80)
    noise = 0.01 * rng.standard_normal(80)
    before = _recs("general_pair_a", control + 0.2 + noise) + _recs("general_control", control)
    after = _recs("general_pair_a_more", control + after_gap + noise) + _recs("general_control_more", control)
    logs = (_log(tmp_path / "f.jsonl", [1.0, 1.1, 0.9]), _log(tmp_path / "c.jsonl", [1.0, 1.0, 1.0]))
    rep = more.build(after, [f"e{i}" for i in range(80)], before, trained=(1900, 600), logs=logs)
    assert rep["held_out"] == 80 and rep["committed"]["diff"] == pytest.approx(0.2, abs=0.01)
    assert rep["change"]["diff"] == pytest.approx(after_gap - 0.2, abs=1e-9)
    assert verdict in rep["verdict"] and rep["steps"] == 3
    assert "Verdict: the extra data" in more.render(rep)
