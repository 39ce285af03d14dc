"""`c2c fuser train|eval|generate`: heterogeneous C2C with a trained cache fuser."""

from __future__ import annotations

import argparse

from c2c.bench.fuser_records import BENCHMARKS, CONDITIONS
from c2c.cli.main import add_json_flag, command, emit


def _threads_flag(c: argparse.ArgumentParser) -> None:
    c.add_argument("--threads", type=int, default=None,
                   help="torch CPU threads (default: C2C_THREADS, else torch's choice); use 1 on a shared, "
                        "busy machine, where more threads than free cores run several times slower")


def _set_threads(args: argparse.Namespace) -> None:
    import torch

    from c2c.config import settings

    n = args.threads or settings().threads
    if n > 0:
        torch.set_num_threads(n)


def register(sub) -> None:
    p = sub.add_parser("fuser", help="train and evaluate cache fusers between different models",
                       description="Heterogeneous C2C: project a Sharer's KV-cache into a Receiver's.")
    s = p.add_subparsers(dest="fuser_command", metavar="ACTION", required=True)

    c = command(s, "train", help="train a fuser (resumable: run the same command again to continue)",
                example="nice -n 10 c2c fuser train --config configs/fuser/pair_b.json", func=_train)
    c.add_argument("--config", required=True, help="training config JSON (see configs/fuser/)")
    c.add_argument("--until", type=int, default=None,
                   help="stop after this optimizer step (default: the end of the schedule); resume later")
    c.add_argument("--device", default=None, help="override the config's device (auto, cpu, cuda)")
    c.add_argument("--quiet", action="store_true", help="no progress bar")
    _threads_flag(c)
    add_json_flag(c)

    c = command(s, "eval", help="score a fuser as lm-evaluation-harness scores, under every condition of the "
                                "report (c2c.bench.harness), reusing its per-question records where they exist",
                example="c2c fuser eval --checkpoint checkpoints/fuser/general_pair_b \\\n"
                        "    --control-checkpoint checkpoints/fuser/general_control --benchmark 'ARC-Easy test' \\\n"
                        "    --limit 200 --records benchmarks/results/fuser_records/pair_b --kind general --json\n"
                        "c2c fuser eval --checkpoint checkpoints/fuser/pair_b --conditions receiver,c2c \\\n"
                        "    --data ../shared/data/eval/arc_challenge/ARC-Challenge-Dev.jsonl --limit 50",
                func=_eval)
    c.add_argument("--checkpoint", required=True, help="fuser checkpoint directory")
    c.add_argument("--control-checkpoint", default=None,
                   help="its matched control fuser's directory (needed for the control condition)")
    which = c.add_mutually_exclusive_group(required=True)
    which.add_argument("--benchmark", action="append", choices=list(BENCHMARKS),
                       help="a benchmark of the report, read under C2C_DATA; repeat to pool several")
    which.add_argument("--data", help="ARC-style .jsonl file, or a folder of MMLU/C-Eval-style CSVs (or .jsonl files)")
    c.add_argument("--limit", type=int, default=None,
                   help="evaluate a fixed random subset of N questions (same subset for every condition)")
    c.add_argument("--seed", type=int, default=0, help="seed of the --limit subset")
    c.add_argument("--conditions", default=None,
                   help=f"comma-separated subset of {','.join(CONDITIONS)} (default: all; control only "
                        "with --control-checkpoint)")
    c.add_argument("--hint-tokens", type=int, default=32, help="t2t: most tokens the Sharer writes")
    c.add_argument("--records", default=None,
                   help="a pair's records folder (as benchmarks/results/fuser_records/pair_b): read the records "
                        "of these checkpoints and settings, compute only what is missing, append it")
    c.add_argument("--kind", default=None, help="with --records: the label of this fuser's files there "
                                                "(general or task-tuned)")
    c.add_argument("--device", default="cpu", help="cpu or cuda")
    c.add_argument("--quiet", action="store_true", help="no progress bar")
    _threads_flag(c)
    add_json_flag(c)

    c = command(s, "generate", help="the Receiver's answer from a cache fused with one or more Sharers",
                example="c2c fuser generate --checkpoint ~/.cache/c2c/fuser/runs/pair_b \\\n"
                        "    --prompt 'Why is the sky blue?' --export fused.c2c",
                func=_generate)
    c.add_argument("--checkpoint", required=True, action="append",
                   help="fuser checkpoint directory; repeat to fuse several Sharers (same Receiver)")
    c.add_argument("--prompt", required=True, help="the user message")
    c.add_argument("--max-new-tokens", type=int, default=64, help="most tokens to generate")
    c.add_argument("--export", default=None, help="also write the fused context cache as a c2c artifact here")
    c.add_argument("--device", default="cpu", help="cpu or cuda")
    add_json_flag(c)


def _train(args: argparse.Namespace) -> int:
    from dataclasses import replace

    from c2c.fuser.train import TrainConfig, Trainer

    _set_threads(args)
    cfg = TrainConfig.from_file(args.config)
    if args.device:
        cfg = replace(cfg, device=args.device)
    trainer = Trainer(cfg, progress=not (args.quiet or args.json))
    state = trainer.train(until=args.until)
    recent = state.losses[-20:]
    data = {"checkpoint": str(trainer.out), "step": state.step, "total_steps": trainer.total_steps,
            "examples": len(trainer.tokens), "loss_first": state.losses[0] if state.losses else None,
            "loss_last20": sum(recent) / len(recent) if recent else None, "seconds": round(state.seconds, 1),
            "gates": trainer.fuser.gates()}
    done = "done" if state.step >= trainer.total_steps else "run the same command again to continue"
    loss = f"; mean loss of the last {len(recent)} steps {data['loss_last20']:.4f}" if recent else ""
    emit(args, data, f"{trainer.out}: step {state.step}/{trainer.total_steps} ({done}){loss}")
    return 0


def _eval(args: argparse.Namespace) -> int:
    from pathlib import Path

    from c2c.bench.fuser_records import slug
    from c2c.bench.harness import evaluate_checkpoints
    from c2c.errors import ConfigError
    from c2c.fuser.data import data_root, load_questions, subset

    if args.records is not None and not args.kind:
        raise ConfigError("--records needs --kind: the label of this fuser's files in that folder "
                          "(general or task-tuned)")
    _set_threads(args)
    sources = {b: data_root() / BENCHMARKS[b] for b in args.benchmark} if args.benchmark else {
        slug(Path(args.data).stem): Path(args.data)}
    questions = {b: subset(load_questions(path), args.limit, args.seed) for b, path in sources.items()}
    conditions = [c.strip() for c in args.conditions.split(",") if c.strip()] if args.conditions else None
    result = evaluate_checkpoints(args.checkpoint, args.control_checkpoint, questions=questions,
                                  conditions=conditions, hint_tokens=args.hint_tokens, device=args.device,
                                  records=args.records, kind=args.kind or "general",
                                  extra={"threads": args.threads or 0}, progress=not (args.quiet or args.json))
    s = result.summary()
    emit(args, s, _eval_text(s))
    return 0


def _eval_text(s: dict) -> str:
    where = ", ".join(f"{b} ({n})" for b, n in s["benchmarks"].items())
    lines = [f"{s['n']} questions: {where}; {s['made']} new records",
             f"{'condition':<12}{'acc % (95%)':>18}{'acc_norm %':>12}{'latency s':>11}"]
    for c, row in s["conditions"].items():
        lo, hi = row["acc_ci95"]
        lat = f"{row['latency_s']:>11.2f}" if "latency_s" in row else f"{'-':>11}"
        lines.append(f"{c:<12}{100 * row['acc']:>7.1f} ({100 * lo:.0f}-{100 * hi:.0f}){'':>2}"
                     f"{100 * row['norm']:>12.1f}{lat}")
    vs = s.get("paired", {}).get("receiver")
    if vs:
        d = vs["acc"]
        lines.append(f"c2c - receiver: {100 * d['diff']:+.1f} ({100 * d['ci95'][0]:+.1f}, {100 * d['ci95'][1]:+.1f}) acc"
                     + (" (clears zero)" if d["clears"] else ""))
    return "\n".join(lines)


def _generate(args: argparse.Namespace) -> int:
    from c2c.fuser.data import SYSTEM
    from c2c.fuser.infer import FusedReceiver

    fr = FusedReceiver.load(args.checkpoint, device=args.device)
    msgs = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": args.prompt}]
    fused = fr.fuse(msgs)
    gen = fr.receiver.generate(fr.generation_ids(), fused.cache, max_new_tokens=args.max_new_tokens)
    data = {"text": gen.text, "sharers": [l.sharer_name for l in fr.links], "timings_s": fused.timings}
    if args.export:
        art = fr.export(fused, path=args.export)
        data["artifact"] = {"path": args.export, "id": art.id}
    emit(args, data, gen.text)
    return 0
