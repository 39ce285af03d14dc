"""The same-machine latency check: its comparison with the report's records, and the rendering from timings."""

import json
import sys
from pathlib import Path

import pytest

from bench_helpers import load_benchmark

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def lat():
    sys.path.insert(0, str(ROOT / "benchmarks"))  # it reads the report's records with fuser_report's helpers
    mod = load_benchmark("fuser_latency")
    yield mod
    sys.path.remove(str(ROOT / "benchmarks"))


def _cond(s, acc=0, norm=0):
    return {"acc": acc, "norm": norm, "s": s}


def test_compare_means_ratios_speedup_and_differing_choices(lat):
    here = [{"id": "q1", "cond": {"t2t": _cond(6.0), "c2c": _cond(1.0, acc=2)}},
            {"id": "q2", "cond": {"t2t": _cond(4.0), "c2c": _cond(3.0)}}]
    report = {"q1": {"cond": {"t2t": _cond(10.0), "c2c": _cond(4.0, acc=1), "receiver": _cond(9.0)}},
              "q2": {"cond": {"t2t": _cond(10.0), "c2c": _cond(4.0)}}}
    s = lat.compare(here, report)
    assert s["conditions"]["t2t"] == pytest.approx({"here_s": 5.0, "report_s": 10.0, "ratio": 0.5})
    assert s["conditions"]["c2c"] == pytest.approx({"here_s": 2.0, "report_s": 4.0, "ratio": 0.5})
    assert list(s["conditions"]) == ["t2t", "c2c"]  # only what was asked here, in the report's order
    assert s["t2t_over_c2c"] == pytest.approx({"here": 2.5, "report": 2.5})
    assert (s["choices_differing"], s["choices_compared"]) == (1, 8)  # q1's c2c acc: 2 here, 1 in the report


def test_compare_refuses_questions_the_report_lacks(lat):
    here = [{"id": "q9", "cond": {"c2c": _cond(1.0)}}]
    with pytest.raises(ValueError, match="no record of .*q9"):
        lat.compare(here, {"q1": {"cond": {"c2c": _cond(1.0)}}})
    with pytest.raises(ValueError, match="c2c"):
        lat.compare(here, {"q9": {"cond": {"t2t": _cond(1.0)}}})


def test_render_merges_the_three_passes_by_their_tags(lat, tmp_path):
    """Records with another fuser's id are ignored; the markdown names the ratio of every condition."""
    bench = "OpenBookQA"
    run = {"pair": "z", "kind": "general", "fuser_id": "F", "control_id": "C", "base_tag": {"b": 1},
           "questions": {bench: ["q1"]}}
    (tmp_path / "fuser_records").mkdir()
    (tmp_path / "fuser_records" / "runs.json").write_text(json.dumps({"runs": {"z/general": run}}))

    def write(group, recs):
        p = sys.modules["fuser_report"].records_path(tmp_path, "z", bench, group)
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text("".join(json.dumps(r) + "\n" for r in recs))

    write(None, [{"id": "q1", "answer": 0, "b": 1, "cond": {"t2t": _cond(8.0)}}])
    write("general", [{"id": "q1", "fuser_id": "OTHER", "cond": {"c2c": _cond(99.0)}},
                      {"id": "q1", "fuser_id": "F", "cond": {"c2c": _cond(2.0)}}])
    write("general.control", [{"id": "q1", "control_id": "C", "cond": {"control": _cond(1.0)}}])
    line = {"key": "z/general", "bench": bench, "id": "q1", "threads": 1,
            "cond": {"t2t": _cond(4.0), "c2c": _cond(1.0), "control": _cond(0.5)}}
    (tmp_path / "fuser_latency.jsonl").write_text(json.dumps(line) + "\n")
    out = lat.write_all(tmp_path)["runs"]["z/general"]
    assert out["conditions"]["c2c"]["report_s"] == 2.0
    assert out["conditions"]["control"]["ratio"] == 0.5
    assert out["t2t_over_c2c"] == {"here": 4.0, "report": 4.0}
    md = (tmp_path / "fuser_latency.md").read_text()
    assert "| c2c | 1000 | 2000 | 0.50 |" in md and "here 4.0x, in the report 4.0x" in md
