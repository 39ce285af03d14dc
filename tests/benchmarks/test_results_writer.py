"""Every benchmark leaves its results through c2c.bench.results.write: one format, whole files, one status rule."""

import json
import re
from pathlib import Path

from c2c.bench import results

ROOT = Path(__file__).resolve().parents[2]
HELPERS = {"llama_text.py", "fuser_plan.py",  # a text engine the sweeps import; the runner of the fuser runs
           "store_sharing.py",  # sections of store_bench.py, which writes their results
           "random_zoo.py"}  # builds a model folder for the others to time; it measures nothing


def test_the_writer_leaves_json_md_records_and_plot_and_its_status_follows_the_acceptance(tmp_path, capsys):
    drawn = []
    status = results.write(tmp_path / "sub" / "bench", {"x": 1, "acceptance": {"a": True, "b": False}}, "# t\n",
                           records=[{"id": 1}, {"id": 2}], plot=lambda p: drawn.append(p) or p.write_bytes(b"png"))
    out = tmp_path / "sub"
    assert status == 1 and capsys.readouterr().out == "# t\n\n"
    assert (out / "bench.json").read_text() == json.dumps({"x": 1, "acceptance": {"a": True, "b": False}}, indent=2)
    assert (out / "bench.md").read_text() == "# t\n" and drawn == [out / "bench.png"]
    assert (out / "bench.jsonl").read_text() == '{"id": 1}\n{"id": 2}\n'
    assert sorted(p.name for p in out.iterdir()) == ["bench.json", "bench.jsonl", "bench.md", "bench.png"]  # no temp
    assert results.write(out / "other", {"acceptance": {"a": True}}, "", echo=False) == 0
    assert capsys.readouterr().out == ""


def test_no_benchmark_writes_its_result_files_by_hand():
    by_hand = re.compile(r'with_suffix\("\.(json|md)"\)\.write_text|"[\w.]+\.(json|md)"\)\.write_text|json\.dump\(')
    scripts = sorted(p for p in (ROOT / "benchmarks").glob("*.py") if p.name not in HELPERS)
    assert len(scripts) >= 20
    for path in scripts:
        src = path.read_text()
        assert not by_hand.search(src), f"{path.name} writes a result file by hand; use c2c.bench.results.write"
        assert re.search(r"from c2c\.bench(\.results)? import [\w, ]*\b(results|write)\b", src), path.name
