import argparse
import json

import pytest

from c2c.cli import fuser as cli
from c2c.fuser.data import Question
from c2c.bench.fuser_records import CONDITIONS

QUESTIONS = [Question(id=f"q{i}", question=f"Which number follows {i}?",
                      options=(("A", str(i + 1)), ("B", str(i + 3)), ("C", "none")), answer="A") for i in range(3)]


def parser():
    from c2c.cli.main import Formatter

    p = argparse.ArgumentParser(prog="c2c", formatter_class=Formatter)
    cli.register(p.add_subparsers(dest="command"))
    return p


def run(argv, capsys):
    args = parser().parse_args(argv)
    assert args.func(args) == 0
    return json.loads(capsys.readouterr().out)


def test_every_fuser_command_has_an_example():
    p = parser()
    group = next(a for a in p._subparsers._group_actions[0].choices.values())
    for name, sub in group._subparsers._group_actions[0].choices.items():
        assert "Example:" in (sub.epilog or ""), name
        assert all(a.help for a in sub._actions if a.dest != "help"), name


def test_cli_train_then_eval_end_to_end(make_link, tiny_rt, data_root, tmp_path, capsys):
    tiny_rt("qwen2"), tiny_rt("gemma3")  # noqa: B018 - built once; the CLI loads them by name below
    common = {"receiver": "tiny-qwen2", "sources": {"alpaca": 3, "arc_easy": 3}, "max_context_tokens": 512,
              "hidden": 8, "grad_accum": 2, "epochs": 1.0, "save_every": 1}
    for name, sharer in (("pair", "tiny-gemma3"), ("pair-control", "self")):
        cfg = tmp_path / f"{name}.json"
        cfg.write_text(json.dumps({"name": name, "sharer": sharer, "out_dir": str(tmp_path / name), **common}))
        out = run(["fuser", "train", "--config", str(cfg), "--json"], capsys)
        assert out["step"] == out["total_steps"] == 3 and out["examples"] == 6
    qs = tmp_path / "held_out.jsonl"
    qs.write_text("".join(json.dumps({"id": q.id, "question": {"stem": q.question, "choices": [
        {"label": l, "text": t} for l, t in q.options]}, "answerKey": q.answer}) + "\n" for q in QUESTIONS))
    evaluate = ["fuser", "eval", "--checkpoint", str(tmp_path / "pair"), "--control-checkpoint",
                str(tmp_path / "pair-control"), "--data", str(qs), "--limit", "2", "--hint-tokens", "4",
                "--records", str(tmp_path / "records"), "--kind", "general", "--json"]
    out = run(evaluate, capsys)
    assert out["n"] == 2 and set(out["conditions"]) == set(CONDITIONS) | {"oracle"} and out["made"] == 6
    assert all(0 <= row["acc"] <= 1 and row["latency_s"] > 0 for c, row in out["conditions"].items() if c != "oracle")
    assert sorted(p.name for p in (tmp_path / "records").iterdir()) == [
        "held_out.base.jsonl", "held_out.general.control.jsonl", "held_out.general.jsonl"]
    again = run(evaluate, capsys)  # every record is there now: read back, nothing computed
    assert again["made"] == 0 and again["conditions"] == out["conditions"]
    out = run(["fuser", "generate", "--checkpoint", str(tmp_path / "pair"), "--checkpoint",
               str(tmp_path / "pair-control"), "--prompt", "hi", "--max-new-tokens", "3",
               "--export", str(tmp_path / "f.c2c"), "--json"], capsys)
    assert out["sharers"] == ["tiny-gemma3", "self"] and len(out["artifact"]["id"]) == 64


@pytest.mark.needs_data  # the questions the committed records are of
def test_fuser_eval_recomputes_the_docs_pair_b_figures_from_the_committed_records(capsys, monkeypatch):
    """`c2c fuser eval --records` over the committed records of general pair (b) gives the README's numbers
    (ARC-Easy test, and the pooled row of the four reported splits) without loading a model."""
    from pathlib import Path

    from c2c.bench.fuser_records import BENCHMARKS
    from c2c.fuser.data import data_root
    from c2c.fuser.infer import FusedReceiver

    root = Path(__file__).resolve().parents[2]
    missing = [b for b in BENCHMARKS if not (data_root() / BENCHMARKS[b]).exists()]
    if missing:
        pytest.skip(f"C2C_DATA ({data_root()}) lacks {missing}: the questions the records are of")

    def no_model(*a, **k):
        raise AssertionError("every record is committed: no model may be loaded")

    monkeypatch.setattr(FusedReceiver, "load", no_model)
    readme = (root / "docs" / "cross_model.md").read_text()   # the docs page that quotes these figures
    common = ["fuser", "eval", "--checkpoint", str(root / "checkpoints/fuser/general_pair_b"),
              "--control-checkpoint", str(root / "checkpoints/fuser/general_control"), "--limit", "200",
              "--records", str(root / "benchmarks/results/fuser_records/pair_b"), "--kind", "general", "--json"]

    def cell(row: dict) -> str:  # as the README writes an accuracy: "49.0 (42–56)"
        lo, hi = row["acc_ci95"]
        return f"{100 * row['acc']:.1f} ({100 * lo:.0f}–{100 * hi:.0f})"

    easy = run(common + ["--benchmark", "ARC-Easy test"], capsys)
    c = easy["conditions"]
    assert easy["made"] == 0 and easy["n"] == 200
    assert (cell(c["receiver"]), cell(c["sharer"]), cell(c["c2c"]), cell(c["control"])) == (
        "47.0 (40–54)", "45.0 (38–52)", "49.0 (42–56)", "49.0 (42–56)")
    vs = easy["paired"]["receiver"]["acc"]
    shift = f"{100 * vs['diff']:+.1f} ({100 * vs['ci95'][0]:+.1f}, {100 * vs['ci95'][1]:+.1f})".replace("-", "−")
    assert shift == "+2.0 (−2.0, +6.0)"
    assert f"general c2c {cell(c['c2c'])}, {shift} over the Receiver" in readme

    pooled = run(common + sum((["--benchmark", b] for b in ("ARC-Challenge dev", "OpenBookQA", "MMLU val",
                                                                 "C-Eval val")), []), capsys)
    assert pooled["made"] == 0 and pooled["n"] == 800
    order = ("receiver", "sharer", "oracle", "t2t", "t2t_choice", "c2c", "control", "c2c_other", "c2c_zero")
    row = "| general | " + " | ".join(cell(pooled["conditions"][k]) for k in order) + " |"
    assert row in readme
