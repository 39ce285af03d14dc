"""Heterogeneous C2C report: every condition on the four reported benchmarks, per Sharer->Receiver pair.

Writes ``benchmarks/results/fuser.json`` (all numbers, per benchmark and averaged),
``benchmarks/results/fuser.md`` (tables) and ``benchmarks/results/fuser.png`` (plot).

Each benchmark is evaluated on one fixed random subset (``--limit``, ``--seed``)
for every condition, so t2t, whose Sharer must decode a hint per question, is
compared on the same questions as the others. A finished (pair, benchmark) is
kept in the JSON and skipped on the next run, so the report can be built across
sessions; ``--redo`` evaluates it again.

Usage (CPU, background; pair (b) takes ~1 h at --limit 200, pair (a) several hours
because the 1.5B Sharer decodes a hint per question for t2t)::

    nice -n 10 .venv/bin/python benchmarks/fuser_report.py --pair b --checkpoint ~/.cache/c2c/fuser/runs/pair_b
    nice -n 10 .venv/bin/python benchmarks/fuser_report.py --pair a --checkpoint ~/.cache/c2c/fuser/runs/pair_a
    .venv/bin/python benchmarks/fuser_report.py --render-only
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
BENCHMARKS = {  # name -> path under the data root; all four are reported splits, never trained on
    "ARC-Challenge dev": "eval/arc_challenge/ARC-Challenge-Dev.jsonl",
    "OpenBookQA": "eval/openbookqa/test.jsonl",
    "MMLU val": "eval/mmlu/val",
    "C-Eval val": "eval/ceval/val",
}
CONDS = ("receiver", "sharer", "t2t", "c2c", "control")
IDENT = ("fuser_id", "limit", "seed", "hint_tokens", "scoring")  # what makes results comparable


def load_results(path: Path) -> dict:
    return json.loads(path.read_text()) if path.is_file() else {"pairs": {}}


def save_results(path: Path, res: dict) -> None:
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_text(json.dumps(res, indent=2, sort_keys=True))
    os.replace(tmp, path)


def record_benchmark(path: Path, name: str, pair: dict, bench: str, entry: dict) -> dict:
    """Add one finished (pair, benchmark) to the JSON under a lock, keeping what other runs wrote.

    Several report processes (one per benchmark, say) may share one JSON file.
    """
    import fcntl

    with open(path.with_suffix(".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        res = load_results(path)
        old = res["pairs"].get(name)
        keep = old["benchmarks"] if old and all(old.get(k) == pair.get(k) for k in IDENT) else {}
        prior = keep.get(bench)
        if prior and prior.get("questions") == entry.get("questions"):  # same questions: add these conditions
            entry = {**prior, **entry, "accuracy": {**prior["accuracy"], **entry["accuracy"]},
                     "latency_s": {**prior["latency_s"], **entry["latency_s"]},
                     "wall_s": round(prior.get("wall_s", 0) + entry.get("wall_s", 0), 1)}
        # what is on disk is at least as new as this process's view of the other benchmarks: a run
        # started before another process finished a benchmark must not write back its stale copy
        merged = {**pair, "benchmarks": {**pair["benchmarks"], **keep, bench: entry}}
        merged["summary"] = summarize(merged)
        res["pairs"][name] = merged
        save_results(path, res)
        render_outputs(res, path.parent)
    return merged


SHAREABLE = ("receiver", "control")  # conditions that do not involve the Sharer


def shared_conditions(other: dict | None, bench: str, questions: str, *, receiver: str, scoring: str,
                      control_id: str | None) -> dict:
    """The receiver/control results of another pair's ``bench`` that this pair would compute identically.

    Same Receiver, same scoring and the same questions make ``receiver`` the same
    computation; ``control`` also needs the same control checkpoint. Empty when nothing
    can be shared.
    """
    entry = (other or {}).get("benchmarks", {}).get(bench)
    if not entry or entry.get("questions") != questions or other.get("receiver") != receiver \
            or other.get("scoring", "label") != scoring:
        return {}
    conds = [c for c in SHAREABLE if c in entry["accuracy"]
             and (c != "control" or (control_id and entry.get("control_id") == control_id))]
    if not conds:
        return {}
    return {"data": entry.get("data", bench), "n": entry["n"], "scoring": scoring, "questions": questions,
            "accuracy": {c: entry["accuracy"][c] for c in conds},
            "latency_s": {c: entry["latency_s"][c] for c in conds},
            **({"control_id": control_id} if "control" in conds else {})}


def summarize(pair: dict) -> dict:
    """Average accuracy and latency per condition over the benchmarks that have every condition."""
    benches = [b for b in pair["benchmarks"].values() if all(c in b["accuracy"] for c in CONDS)]
    if not benches:
        return {}
    return {"benchmarks": len(benches), "n": sum(b["n"] for b in benches),
            "accuracy": {c: sum(b["accuracy"][c] for b in benches) / len(benches) for c in CONDS},
            "latency_s": {c: sum(b["latency_s"][c] for b in benches) / len(benches) for c in CONDS}}


def _read_records(path: Path) -> list[dict]:
    """The complete lines of a progress file (a run killed mid-write leaves a partial last line)."""
    out = []
    for line in path.read_text().splitlines() if path.is_file() else []:
        try:
            out.append(json.loads(line))
        except ValueError:
            break
    return out


def render_outputs(res: dict, outdir: Path = RESULTS) -> None:
    lines = ["# Heterogeneous C2C: accuracy and latency per condition", "",
             "Generated by `benchmarks/fuser_report.py`. Accuracy in %, latency in ms per question "
             "(sequential on one process; see `c2c.fuser.evaluate`). Every condition is scored on the same "
             "fixed random subset of each benchmark.", ""]
    for name, pair in sorted(res["pairs"].items()):
        lines += [f"## Pair {name}: {pair['sharer']} → {pair['receiver']}", "",
                  f"Checkpoint `{pair['fuser_id'][:12]}` (step {pair['step']}), control "
                  f"`{', '.join(sorted({b['control_id'][:12] for b in pair['benchmarks'].values() if 'control_id' in b})) or '–'}`, "
                  f"device {pair['device']}, subset {pair['limit']} per benchmark (seed {pair['seed']}), "
                  f"scoring {pair.get('scoring', 'label')}.", "",
                  "| benchmark | n | " + " | ".join(CONDS) + " | t2t ms | c2c ms | t2t/c2c |",
                  "|---|---:|" + "---:|" * len(CONDS) + "---:|---:|---:|"]
        rows = list(pair["benchmarks"].items())
        avg = summarize(pair)
        if avg:
            rows.append((f"**average** ({avg['benchmarks']} complete)", avg))
        for bench, r in rows:
            acc = " | ".join(f"{100 * r['accuracy'][c]:.1f}" if c in r["accuracy"] else "–" for c in CONDS)
            lt, lc = r["latency_s"].get("t2t"), r["latency_s"].get("c2c")
            speed = f"{lt / lc:.1f}×" if lt and lc else "–"
            ms = " | ".join(f"{1000 * x:.0f}" if x else "–" for x in (lt, lc))
            lines.append(f"| {bench} | {r['n']} | {acc} | {ms} | {speed} |")
        shared = sorted({b["shared_from"] for b in pair["benchmarks"].values() if b.get("shared_from")})
        if shared:
            lines += ["", f"`receiver` and `control` are shared with pair {', '.join(shared)}: the same Receiver, "
                          "control checkpoint, questions and scoring, so the same computation."]
        lines.append("")
    (outdir / "fuser.md").write_text("\n".join(lines))
    _plot(res, outdir)


def _plot(res: dict, outdir: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    pairs = sorted(res["pairs"].items())
    if not pairs:
        return
    fig, axes = plt.subplots(1, len(pairs), figsize=(7 * len(pairs), 4), squeeze=False)
    for ax, (name, pair) in zip(axes[0], pairs):
        avg = summarize(pair)
        benches = list(pair["benchmarks"]) + (["average"] if avg else [])
        width = 0.8 / len(CONDS)
        for i, c in enumerate(CONDS):
            vals = [100 * (pair["benchmarks"][b]["accuracy"].get(c, 0) if b != "average"
                           else avg["accuracy"].get(c, 0)) for b in benches]
            ax.bar([x + i * width for x in range(len(benches))], vals, width, label=c)
        ax.set_xticks([x + 0.4 - width / 2 for x in range(len(benches))], benches, rotation=15, fontsize=8)
        ax.set_ylabel("accuracy (%)")
        ax.set_title(f"pair {name}: {pair['sharer']} → {pair['receiver']}", fontsize=9)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(outdir / "fuser.png", dpi=120)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pair", help="pair label in the report, e.g. a or b")
    ap.add_argument("--checkpoint", help="the pair's fuser checkpoint directory")
    ap.add_argument("--control-checkpoint", default=None, help="control fuser (default: next to the checkpoint)")
    ap.add_argument("--limit", type=int, default=200, help="questions per benchmark (fixed random subset)")
    ap.add_argument("--seed", type=int, default=0, help="seed of the subset")
    ap.add_argument("--benchmarks", default=",".join(BENCHMARKS), help="comma-separated subset of the benchmarks")
    ap.add_argument("--conditions", default=",".join(CONDS),
                    help="conditions to run now; others already in the JSON for the same questions are kept")
    ap.add_argument("--hint-tokens", type=int, default=48, help="t2t: most tokens the Sharer writes")
    ap.add_argument("--scoring", choices=["label", "text", "generate"], default="label", help="see c2c.fuser.evaluate")
    ap.add_argument("--device", default="cpu", help="cpu or cuda")
    ap.add_argument("--threads", type=int, default=None, help="torch CPU threads (1 on a busy shared machine)")
    ap.add_argument("--out", default=str(RESULTS / "fuser.json"), help="results JSON")
    ap.add_argument("--redo", action="store_true", help="evaluate benchmarks already in the JSON again")
    ap.add_argument("--share-from", default=None, metavar="PAIR",
                    help="take receiver and control from another pair's finished benchmarks when they are the "
                         "same computation (same Receiver, control checkpoint, questions and scoring)")
    ap.add_argument("--render-only", action="store_true", help="only rewrite the markdown and plot from the JSON")
    args = ap.parse_args(argv)

    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    res = load_results(out)
    if args.render_only:
        render_outputs(res, out.parent)
        return 0
    if not (args.pair and args.checkpoint):
        ap.error("--pair and --checkpoint are required (or --render-only)")

    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
    from c2c.canon import canonical_json, sha256_hex
    from c2c.fuser.data import data_root, load_questions, subset
    from c2c.fuser.evaluate import Evaluator

    conds = [c.strip() for c in args.conditions.split(",") if c.strip()]
    ev = Evaluator.from_checkpoint(args.checkpoint, control_checkpoint=args.control_checkpoint, conditions=conds,
                                   device=args.device, hint_tokens=args.hint_tokens, scoring=args.scoring)
    link = ev.fused.links[0]
    control_id = ev.control.links[0].meta.fuser_id if ev.control is not None else None
    pair = res["pairs"].get(args.pair)
    ident = {"fuser_id": link.meta.fuser_id, "limit": args.limit,
             "seed": args.seed, "hint_tokens": args.hint_tokens, "scoring": args.scoring}
    if pair is None or any(pair.get(k) != v for k, v in ident.items()):
        pair = {"benchmarks": {}}  # a new checkpoint or subset: start this pair over
    pair.update(ident, receiver=ev.receiver.name, sharer=link.sharer_name, step=link.meta.step,
                device=args.device, checkpoint=str(args.checkpoint))
    res["pairs"][args.pair] = pair
    root = data_root()
    for bench in [b.strip() for b in args.benchmarks.split(",") if b.strip()]:
        if bench not in BENCHMARKS:
            ap.error(f"unknown benchmark {bench!r}; choose from {', '.join(BENCHMARKS)}")
        qs = subset(load_questions(root / BENCHMARKS[bench]), args.limit, args.seed)
        ids = sha256_hex(canonical_json([q.id for q in qs]))
        measured = set(pair["benchmarks"].get(bench, {}).get("accuracy", {}))
        if args.share_from and not args.redo and not set(SHAREABLE) <= measured:
            shared = shared_conditions(res["pairs"].get(args.share_from), bench, ids, receiver=ev.receiver.name,
                                       scoring=args.scoring, control_id=control_id)
            if shared:
                pair = record_benchmark(out, args.pair, pair, bench, {**shared, "shared_from": args.share_from})
                print(f"{bench}: {', '.join(shared['accuracy'])} shared with pair {args.share_from}", file=sys.stderr)
                measured = set(pair["benchmarks"][bench]["accuracy"])
        todo = [c for c in conds if args.redo or c not in measured]
        if not todo:
            print(f"{bench}: done, skipping", file=sys.stderr)
            continue
        # progress of an interrupted run of these questions and conditions (resumed, then removed)
        key = sha256_hex(canonical_json([ident, ids, todo]))[:16]
        partial = out.parent / "fuser_partial" / f"{args.pair}-{key}.jsonl"
        partial.parent.mkdir(parents=True, exist_ok=True)
        done = _read_records(partial)
        if done:
            print(f"{bench}: resuming after {len(done)} questions", file=sys.stderr)
        t0 = time.perf_counter()
        with open(partial, "a") as f:
            rep = ev.evaluate(qs, todo, data=bench, done=done,
                              on_record=lambda rec: (f.write(json.dumps(rec) + "\n"), f.flush()))
        partial.unlink()
        pair = record_benchmark(out, args.pair, pair, bench,
                                {**rep.to_dict(), "questions": ids, "wall_s": round(time.perf_counter() - t0, 1),
                                 **({"control_id": control_id} if control_id else {})})
        print(f"{bench}: " + ", ".join(f"{c} {100 * a:.1f}" for c, a in rep.accuracy.items()), file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
