"""`c2c bench handoff`: one handoff measured by text, full cache and slice in one run."""

from __future__ import annotations

import argparse

from c2c.cli.main import add_runtime_flags, add_json_flag, command, emit


def register(sub) -> None:
    p = sub.add_parser("bench", help="measure text vs cache handoffs",
                       description="Benchmarks that compare text and cache handoffs in one run.")
    s = p.add_subparsers(dest="bench_command", metavar="BENCH", required=True)
    c = command(s, "handoff", help="time one analyst -> writer handoff by text, full cache and slice",
                example="c2c bench handoff --model Qwen2.5-Coder-0.5B-Instruct --message-tokens 256 --json",
                func=_handoff)
    c.add_argument("--model", default="Qwen2.5-Coder-0.5B-Instruct", help="zoo model name or model directory")
    add_runtime_flags(c)
    c.add_argument("--message-tokens", type=int, default=256, help="length of the message / exported notes")
    c.add_argument("--context-tokens", type=int, default=512, help="length of the document the analyst reads")
    c.add_argument("--answer-tokens", type=int, default=16, help="tokens the writer decodes at the end")
    add_json_flag(c)


def _handoff(args: argparse.Namespace) -> int:
    from c2c.bench import handoff
    from c2c.runtime import zoo

    runtime = zoo.load(args.model, dtype=args.dtype, backend=args.backend)
    r = handoff.run(runtime, handoff.HandoffBenchConfig(message_tokens=args.message_tokens,
                                                          context_tokens=args.context_tokens,
                                                          answer_tokens=args.answer_tokens))
    text = (f"{r['model']}: context {r['context_tokens']} + message {r['message_tokens']} tokens\n"
            f"  text  pipeline {r['text_pipeline_s']:.2f}s  (handoff {r['text_handoff_s']:.2f}s)\n"
            f"  full  pipeline {r['cache_pipeline_s']:.2f}s  (handoff {r['cache_handoff_s']:.3f}s, "
            f"{r['artifact_bytes']:,} bytes)  {r['speedup_full']:.1f}x\n"
            + (f"  slice pipeline {r['slice_pipeline_s']:.2f}s  (handoff {r['slice_handoff_s']:.3f}s, "
               f"{r['slice_artifact_bytes']:,} bytes)  {r['speedup_slice']:.1f}x\n" if r["slice_pipeline_s"] else
               f"  slice: not on this runtime ({r['slice_unsupported']})\n") +
            f"  exact: {r['exact']}   cache/text handoff: {100 * r['handoff_ratio']:.2f}%")
    emit(args, r, text)
    return 0
