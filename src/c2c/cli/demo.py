"""`c2c demo`: analyst -> writer, by text and by cache, on a real zoo model."""

from __future__ import annotations

import argparse

from c2c.cli.main import add_json_flag, command, emit


def register(sub) -> None:
    p = command(sub, "demo", help="run the analyst -> writer handoff by text and by cache and compare",
                example="c2c demo\nc2c demo --model SmolLM2-135M-Instruct --json", func=_demo)
    p.add_argument("--model", default="Qwen2.5-Coder-0.5B-Instruct", help="zoo model name or model directory")
    p.add_argument("--questions", type=int, default=3, help="MMLU dev questions the analyst studies")
    p.add_argument("--message-tokens", type=int, default=96, help="token budget of the text message")
    p.add_argument("--answer-tokens", type=int, default=24, help="token budget of the writer's answer")
    add_json_flag(p)


def _demo(args: argparse.Namespace) -> int:
    from c2c import demo
    from c2c.runtime import zoo

    runtime = zoo.load(args.model)
    report = demo.run(runtime, questions=args.questions, message_tokens=args.message_tokens,
                      answer_tokens=args.answer_tokens)
    emit(args, report, demo.format_table(report))
    return 0
