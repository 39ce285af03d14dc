import argparse
import json

from c2c.cli import fuser as cli
from c2c.fuser.data import Question
from c2c.fuser.evaluate import CONDITIONS

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
    out = run(["fuser", "eval", "--checkpoint", str(tmp_path / "pair"), "--data", str(qs), "--limit", "2",
               "--hint-tokens", "4", "--json"], capsys)
    assert out["n"] == 2 and set(out["accuracy"]) == set(CONDITIONS) == set(out["latency_s"])
    out = run(["fuser", "generate", "--checkpoint", str(tmp_path / "pair"), "--checkpoint",
               str(tmp_path / "pair-control"), "--prompt", "hi", "--max-new-tokens", "3",
               "--export", str(tmp_path / "f.c2c"), "--json"], capsys)
    assert out["sharers"] == ["tiny-gemma3", "self"] and len(out["artifact"]["id"]) == 64
