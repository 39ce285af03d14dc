"""Same-machine latency check of a fuser report: every condition timed in one process, on the same questions.

``benchmarks/fuser_report.py`` times each condition in the pass that scores it (base, fused, control),
and those passes may run in different sessions, on different machines. This check asks the first
``--per-benchmark`` questions of each of the report's subsets under every condition, one question at
a time, in one process, and compares the times with the report's records of the same questions:

- ``here``: each condition's mean seconds per question in this one process;
- ``report``: the committed records' mean on the same questions;
- ``here / report`` per condition, which shows whether a pass of the report ran slower than the rest
  (it should be about the same number for every condition when all passes ran under one setting);
- the c2c/t2t speedup measured here, beside the report's, on the same questions.

It also checks that every choice (acc and acc_norm) it makes equals the report's record: the latency
rerun doubles as a reproducibility audit of the records.

Writes ``benchmarks/results/fuser_latency.{json,md}`` and the timings ``fuser_latency.jsonl``
(one line per question and (pair, kind); a rerun of a (pair, kind) replaces its lines).

Usage (CPU, one thread, nothing else running; pair (c) ~16 min at 10 per benchmark, pair (a) ~15 min at 5)::

    nice -n 10 .venv/bin/python benchmarks/fuser_latency.py --pair c --kind task-tuned \\
        --checkpoint checkpoints/fuser/pair_c --control checkpoints/fuser/control
    .venv/bin/python benchmarks/fuser_latency.py --render-only
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

from fuser_report import BASE, BENCHMARKS, CONTROL, FUSED, POOLED, RESULTS, load_meta, run_records

from c2c.bench import results

CONDITIONS = BASE + FUSED + CONTROL


def compare(here: list[dict], report: dict[str, dict]) -> dict:
    """Mean seconds per condition here and in the report on the same questions, their ratio, the c2c/t2t
    speedups, and how many choices differ. Raises ValueError when the report lacks a question or condition."""
    missing = [(r["id"], c) for r in here for c in r["cond"] if c not in report.get(r["id"], {}).get("cond", {})]
    if missing:
        raise ValueError(f"the report has no record of {missing[:3]}{' ...' if len(missing) > 3 else ''}; "
                         "run fuser_report.py for this (pair, kind) first")
    conds = [c for c in CONDITIONS if all(c in r["cond"] for r in here)]
    rows, differ = {}, 0
    for c in conds:
        mine = [r["cond"][c]["s"] for r in here]
        theirs = [report[r["id"]]["cond"][c]["s"] for r in here]
        differ += sum(r["cond"][c][m] != report[r["id"]]["cond"][c][m] for r in here for m in ("acc", "norm"))
        rows[c] = {"here_s": statistics.fmean(mine), "report_s": statistics.fmean(theirs),
                   "ratio": statistics.fmean(mine) / statistics.fmean(theirs)}
    speedup = None
    if {"c2c", "t2t"} <= set(rows):
        speedup = {w: rows["t2t"][f"{w}_s"] / rows["c2c"][f"{w}_s"] for w in ("here", "report")}
    return {"n": len(here), "conditions": rows, "t2t_over_c2c": speedup, "choices_differing": differ,
            "choices_compared": 2 * len(here) * len(conds)}


def read_lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.is_file() else []


def write_all(root: Path) -> dict:
    """Rebuild ``fuser_latency.{json,md}`` from ``fuser_latency.jsonl`` and the report's records."""
    meta = load_meta(root)
    by_key: dict[str, list[dict]] = {}
    for rec in read_lines(root / "fuser_latency.jsonl"):
        by_key.setdefault(rec["key"], []).append(rec)
    out = {"runs": {}}
    for key, recs in sorted(by_key.items()):
        run = meta["runs"][key]
        report = {}  # ids are unique within a benchmark only
        for bench in {r["bench"] for r in recs}:
            report |= {f"{bench}:{r['id']}": r for r in run_records(root, run, bench)}
        recs = [r | {"id": f"{r['bench']}:{r['id']}"} for r in recs]
        out["runs"][key] = compare(recs, report) | {"threads": recs[0]["threads"], "fuser_id": run["fuser_id"]}
    results.write(root / "fuser_latency", out, markdown(out), echo=False)
    return out


def markdown(out: dict) -> str:
    lines = ["# Fuser latency, every condition in one process on the same questions", "",
             "`benchmarks/fuser_latency.py`: the first questions of each of the report's subsets, every condition "
             "asked one after another in one process (transformers, float32, one thread, nice), against the "
             "report's records of the same questions, whose passes (base, fused, control) may have run in "
             "other sessions on other machines. `here / report` near the same value for every condition means "
             "the report's passes ran under one setting.", ""]
    for key, s in out["runs"].items():
        lines += [f"## {key}", "",
                  f"{s['n']} questions; choices equal to the report's: {s['choices_compared'] - s['choices_differing']}"
                  f" of {s['choices_compared']} (acc and acc_norm per condition).", "",
                  "| condition | here (ms) | report (ms) | here / report |", "|---|---:|---:|---:|"]
        lines += [f"| {c} | {1000 * r['here_s']:.0f} | {1000 * r['report_s']:.0f} | {r['ratio']:.2f} |"
                  for c, r in s["conditions"].items()]
        if s["t2t_over_c2c"]:
            lines += ["", f"t2t / c2c latency on these questions: here {s['t2t_over_c2c']['here']:.1f}x, "
                          f"in the report {s['t2t_over_c2c']['report']:.1f}x.", ""]
    return "\n".join(lines).rstrip() + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pair", help="pair label: a, b or c (its report must exist)")
    ap.add_argument("--kind", choices=("general", "task-tuned"), help="how the fuser was trained")
    ap.add_argument("--checkpoint", help="the report's fuser checkpoint directory")
    ap.add_argument("--control", help="the report's matched control checkpoint directory")
    ap.add_argument("--per-benchmark", type=int, default=10, help="questions from the start of each subset")
    ap.add_argument("--threads", type=int, default=1, help="torch CPU threads (the report's default: 1)")
    ap.add_argument("--results", default=str(RESULTS), help="folder of the report's records and these results")
    ap.add_argument("--render-only", action="store_true", help="only rebuild json and markdown from the timings")
    args = ap.parse_args(argv)
    root = Path(args.results)
    if args.render_only:
        write_all(root)
        return 0
    if not (args.pair and args.kind and args.checkpoint and args.control):
        ap.error("--pair, --kind, --checkpoint and --control are required (or --render-only)")
    key = f"{args.pair}/{args.kind}"
    run = load_meta(root)["runs"].get(key)
    if run is None or not run.get("control_id"):
        ap.error(f"{key} has no report with a control in {root}; run fuser_report.py first")

    import torch

    torch.set_num_threads(args.threads)
    from tqdm import tqdm

    from c2c.bench.harness import HarnessEvaluator, other_question
    from c2c.fuser.data import data_root, load_questions, subset
    from c2c.fuser.infer import FusedReceiver

    fused = FusedReceiver.load([args.checkpoint])
    control = FusedReceiver.load([args.control], receiver=fused.receiver)
    ids = (fused.links[0].meta.fuser_id, control.links[0].meta.fuser_id)
    if ids != (run["fuser_id"], run["control_id"]):
        ap.error(f"{args.checkpoint} and {args.control} are not the checkpoints of {key}'s report")
    ev = HarnessEvaluator(fused.receiver, sharer=fused.links[0].sharer, fused=fused, control=control,
                          hint_tokens=run["hint_tokens"])
    asked = []
    for bench in POOLED:
        qs = subset(load_questions(data_root() / BENCHMARKS[bench]), run["limit"], run["seed"])
        # c2c_other is fed the same other question as in the report, which asked the whole subset
        asked += [(bench, q, other_question(qs, i)) for i, q in enumerate(qs[:args.per_benchmark])]
    fresh = []
    for bench, q, other in tqdm(asked, desc=key, unit="q"):
        rec = ev.ask(q, CONDITIONS, other=other)
        fresh.append({"key": key, "bench": bench, "id": q.id, "threads": args.threads,
                      "cond": {c: {m: v[m] for m in ("acc", "norm", "s")} for c, v in rec["cond"].items()}})
    path = root / "fuser_latency.jsonl"
    kept = [r for r in read_lines(path) if r["key"] != key]
    path.write_text("".join(json.dumps(r, sort_keys=True) + "\n" for r in kept + fresh))
    s = write_all(root)["runs"][key]
    print(json.dumps(s, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
