"""`c2c fuser train|eval|generate`: heterogeneous C2C with a trained cache fuser."""

from __future__ import annotations

import argparse

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

    c = command(s, "eval", help="accuracy and latency of receiver / sharer / t2t / c2c / control",
                example="c2c fuser eval --checkpoint ~/.cache/c2c/fuser/runs/pair_b \\\n"
                        "    --data ../shared/data/eval/arc_challenge/ARC-Challenge-Dev.jsonl --limit 50 --json",
                func=_eval)
    c.add_argument("--checkpoint", required=True, help="fuser checkpoint directory")
    c.add_argument("--control-checkpoint", default=None,
                   help="control fuser directory (default: <checkpoint>-control, else control/, next to it)")
    c.add_argument("--data", required=True,
                   help="ARC-style .jsonl file, or a folder of MMLU/C-Eval-style CSVs (or of .jsonl files)")
    c.add_argument("--limit", type=int, default=None,
                   help="evaluate a fixed random subset of N questions (same subset for every condition)")
    c.add_argument("--seed", type=int, default=0, help="seed of the --limit subset")
    c.add_argument("--conditions", default="receiver,sharer,t2t,c2c,control",
                   help="comma-separated subset of receiver,sharer,t2t,c2c,control")
    c.add_argument("--hint-tokens", type=int, default=48, help="t2t: most tokens the Sharer writes")
    c.add_argument("--scoring", choices=["label", "text", "generate"], default="label",
                   help="label: log p(label); text: mean log p per token of 'label. option text'; "
                        "generate: the model answers greedily and the label is read from its words")
    c.add_argument("--device", default="cpu", help="cpu or cuda")
    c.add_argument("--records", default=None, help="also write per-question records (JSON) to this file")
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
    import json

    from c2c.fuser.data import load_questions, subset
    from c2c.fuser.evaluate import Evaluator

    _set_threads(args)
    conditions = [c.strip() for c in args.conditions.split(",") if c.strip()]
    questions = subset(load_questions(args.data), args.limit, args.seed)
    ev = Evaluator.from_checkpoint(args.checkpoint, control_checkpoint=args.control_checkpoint,
                                   conditions=conditions, device=args.device, hint_tokens=args.hint_tokens,
                                   scoring=args.scoring)
    rep = ev.evaluate(questions, conditions, data=str(args.data), progress=not (args.quiet or args.json))
    if args.records:
        with open(args.records, "w") as f:
            json.dump(rep.to_dict(with_records=True), f, indent=1, ensure_ascii=False)
    lines = [f"{args.data}: n={rep.n}", f"{'condition':<10}{'accuracy':>10}{'latency ms':>12}"]
    lines += [f"{c:<10}{rep.accuracy[c]:>10.3f}{rep.latency_s[c] * 1000:>12.0f}" for c in rep.accuracy]
    emit(args, rep.to_dict(), "\n".join(lines))
    return 0


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
