"""`c2c demo`: analyst -> writer, by text and by cache, on a real zoo model."""

from __future__ import annotations

import argparse

from c2c.cli.main import add_runtime_flags, add_json_flag, command, emit


def register(sub) -> None:
    p = command(sub, "demo", help="run a demo scenario on a real zoo model: handoff (default) or chain",
                example="c2c demo                      # analyst -> writer, by text and by cache\n"
                        "c2c demo chain --policy continue   # 3-agent chain over the store, upstream changes\n"
                        "c2c demo router --fuser checkpoints/fuser/pair_b   # switch models mid-conversation\n"
                        "c2c demo --model SmolLM2-135M-Instruct --json", func=_demo)
    p.add_argument("scenario", nargs="?", default="handoff", choices=["handoff", "chain", "router"],
                   help="handoff: text vs cache for one hop; chain: researcher -> analyst -> writer over the "
                        "store, then a new upstream version makes the chain stale; router: a conversation that "
                        "switches between SmolLM2 and Qwen, routed cache / fused / text per hop")
    p.add_argument("--fuser", default=None,
                   help="router: a trained SmolLM2 -> Qwen fuser checkpoint dir (enables the fused path)")
    p.add_argument("--store", default=None, help="store URL for the chain (default: sqlite under C2C_HOME)")
    p.add_argument("--policy", default="re-pull", choices=["re-pull", "continue"],
                   help="chain: what the writer does with stale context")
    p.add_argument("--model", default="Qwen2.5-Coder-0.5B-Instruct", help="zoo model name or model directory")
    add_runtime_flags(p)
    p.add_argument("--questions", type=int, default=3, help="MMLU dev questions the analyst studies")
    p.add_argument("--message-tokens", type=int, default=96, help="token budget of the text message")
    p.add_argument("--answer-tokens", type=int, default=24, help="token budget of the writer's answer")
    add_json_flag(p)


def _demo(args: argparse.Namespace) -> int:
    from c2c.demos import analyst_writer as demo
    from c2c.runtime import zoo

    if args.scenario == "router":
        from c2c.demos import cross_model

        rep = cross_model.demo(args.model, fuser_checkpoint=args.fuser)
        emit(args, rep, cross_model.format_demo(rep))
        return 0
    runtime = zoo.load(args.model, dtype=args.dtype, backend=args.backend)
    if args.scenario == "chain":
        from c2c.demos import stale_chain
        from c2c.store.url import open_store

        with open_store(args.store) as store:
            rep = stale_chain.run(runtime, store, policy=args.policy)
        emit(args, rep.to_dict(), stale_chain.format_report(rep))
        return 0
    report = demo.run(runtime, questions=args.questions, message_tokens=args.message_tokens,
                      answer_tokens=args.answer_tokens)
    emit(args, report, demo.format_table(report))
    return 0
