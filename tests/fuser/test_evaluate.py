import argparse
import json

import pytest
import torch

from c2c.cli import fuser as cli
from c2c.errors import ConfigError
from c2c.fuser.align import render
from c2c.fuser.data import Question, mc_messages
from c2c.fuser.evaluate import CONDITIONS, Evaluator, choose
from c2c.fuser.infer import FusedReceiver

QUESTIONS = [Question(id=f"q{i}", question=f"Which number follows {i}?",
                      options=(("A", str(i + 1)), ("B", str(i + 3)), ("C", "none")), answer="A") for i in range(3)]


def test_single_and_multi_token_label_scoring_agree(make_link, tiny_rt):
    r = tiny_rt("qwen2")
    q = QUESTIONS[0]
    _, cache = r.prefill(list(render(r, mc_messages(q)).ids))
    gen = r.encode(r.generation_prompt())
    _, single = choose(r, gen, cache, q)  # byte tokenizer: "A" is one token
    multi_q = Question(id="m", question=q.question, options=q.options + (("DD", "both"),), answer="A")
    best, multi = choose(r, gen, cache, multi_q)  # "DD" is two tokens: per-option scoring
    for label in "ABC":
        assert multi[label] == pytest.approx(single[label], abs=1e-4)
    assert best == max(multi, key=multi.get)


def test_all_conditions_run_and_an_untrained_fuser_changes_nothing(make_link, tiny_rt):
    r, s = tiny_rt("qwen2"), tiny_rt("gemma3")
    ev = Evaluator(receiver=r, sharer=s, fused=FusedReceiver(r, [make_link(r, s)]),
                   control=FusedReceiver(r, [make_link(r, None)]), hint_tokens=6)
    rep = ev.evaluate(QUESTIONS, CONDITIONS, progress=False)
    assert rep.n == 3 and set(rep.accuracy) == set(CONDITIONS) == set(rep.latency_s)
    assert all(0.0 <= a <= 1.0 for a in rep.accuracy.values())
    assert all(t > 0 for t in rep.latency_s.values())
    for rec in rep.records:
        assert set(rec["pred"].values()) <= {"A", "B", "C"} and isinstance(rec["hint"], str)
        # zero-initialised fusers are the identity: same answers as the Receiver alone
        assert rec["pred"]["c2c"] == rec["pred"]["receiver"] == rec["pred"]["control"]
        # c2c pays for the Sharer's prefill on top of the Receiver's
        assert rec["latency_s"]["c2c"] > rec["latency_s"]["receiver"]


def test_fused_answers_differ_once_the_fuser_is_trained(make_link, tiny_rt):
    r, s = tiny_rt("qwen2"), tiny_rt("gemma3")
    ev = Evaluator(receiver=r, sharer=s, fused=FusedReceiver(r, [make_link(r, s, perturb=5)]))
    rep = ev.evaluate(QUESTIONS, ["receiver", "c2c"], progress=False)
    msgs = mc_messages(QUESTIONS[0])
    fused = ev.fused.fuse(msgs)
    _, plain = r.prefill(list(fused.rendered.ids))
    assert fused.cache.max_abs_diff(plain) > 0 and rep.n == 3


def test_missing_parts_are_config_errors(make_link, tiny_rt):
    r = tiny_rt("qwen2")
    with pytest.raises(ConfigError, match="Sharer"):
        Evaluator(receiver=r).evaluate(QUESTIONS, ["c2c"], progress=False)
    with pytest.raises(ConfigError, match="unknown conditions"):
        Evaluator(receiver=r).evaluate(QUESTIONS, ["oracle"], progress=False)


# ----------------------------------------------------------------------- CLI
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
