"""Where #16's fuser work stands, and one command that does the rest: every training and every report.

    .venv/bin/python benchmarks/fuser_plan.py              # status: each fuser's step, each report's records
    .venv/bin/python benchmarks/fuser_plan.py --json
    .venv/bin/python benchmarks/fuser_plan.py --run        # train and report what is missing, in order
    .venv/bin/python benchmarks/fuser_plan.py --run --dry-run

The plan, in order (each step resumes where it stopped; run it again after an interruption):

1. train the fusers of ``TRAIN`` (``c2c fuser train --config configs/fuser/<name>.json``); a
   finished run's checkpoint (config.json and fuser.safetensors, 14-19 MB) is copied into
   ``checkpoints/fuser/<name>`` to be committed;
2. ``benchmarks/fuser_report.py`` for every (pair, kind) of ``REPORTS`` on the four benchmarks,
   once its fuser is complete, with its matched control once that is complete too (a report
   made before then gets the control's records in a later run).

Everything runs one step at a time under ``nice -n 10`` with one torch thread (the 2-core CPU
these numbers come from: two jobs at once, one each). ``--only train`` or ``--only report``
limits a run to one kind of step (on two free cores, one ``--only train`` and one
``--only report`` can run side by side); ``--pairs a,b`` limits it to some pairs.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
from pathlib import Path

import fuser_report as rep

from c2c.bench.fuser_records import read_records

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = ROOT / "configs" / "fuser"
COMMITTED = ROOT / "checkpoints" / "fuser"
MAX_COMMIT_BYTES = 25 * 2 ** 20
TRAIN = ("general_pair_b", "general_control", "general_pair_a", "control_a", "general_pair_c", "pair_c")
REPORTS = {  # (pair, kind) -> (fuser, its matched control): the names of their configs
    ("b", "general"): ("general_pair_b", "general_control"),
    ("b", "task-tuned"): ("pair_b", "control"),
    ("a", "general"): ("general_pair_a", "general_control"),
    ("a", "task-tuned"): ("pair_a", "control_a"),
    ("c", "general"): ("general_pair_c", "general_control"),
    ("c", "task-tuned"): ("pair_c", "control"),
}


def checkpoint(name: str) -> dict:
    """The most advanced checkpoint of a config: committed, else in ``C2C_HOME``; its step and total."""
    from c2c.config import c2c_home

    best = {"name": name, "path": None, "step": 0, "total": None, "complete": False, "committed": False}
    for where, path in (("committed", COMMITTED / name), ("runs", c2c_home() / "fuser" / "runs" / name)):
        try:
            meta = json.loads((path / "config.json").read_text())
        except (OSError, ValueError):
            state = path / "train_state" / "state.json"  # a run that has not saved a checkpoint yet
            if state.is_file() and best["path"] is None:
                best |= {"path": str(path), "step": int(json.loads(state.read_text()).get("step", 0))}
            continue
        step, total = int(meta.get("step", 0)), meta.get("train", {}).get("total_steps")
        if step > best["step"] or best["path"] is None:
            best = {"name": name, "path": str(path), "step": step, "total": total,
                    "complete": total is not None and step >= total, "committed": where == "committed"}
    return best


def benchmarks(pair: str, kind: str) -> tuple[str, ...]:
    """The benchmarks a (pair, kind) report covers: the four pooled ones, and ARC-Easy test where neither its
    fuser nor its control trained on ARC-Easy (as ``fuser_report.py`` decides by default)."""
    sources: dict = {}
    for name in REPORTS[(pair, kind)]:
        try:
            sources |= json.loads((CONFIGS / f"{name}.json").read_text()).get("sources", {})
        except (OSError, ValueError):
            pass
    return rep.benchmarks_for(sources)


def report_status(pair: str, kind: str, meta: dict) -> dict:
    """Records per benchmark for one (pair, kind), counted as the report counts them (same fuser, control and
    settings), against the questions each benchmark needs."""
    run = meta.get("runs", {}).get(f"{pair}/{kind}")
    out = {}
    for bench in benchmarks(pair, kind):
        ids = (run or {}).get("questions", {}).get(bench)
        if not run or ids is None:
            out[bench] = {"base": 0, "fused": 0, "control": 0, "of": None, "complete": False}
            continue
        counts = {}
        for key, group, tag in (("base", None, run.get("base_tag")), ("fused", kind, {"fuser_id": run["fuser_id"]}),
                                ("control", f"{kind}.control",
                                 {"control_id": run["control_id"]} if run.get("control_id") else None)):
            got = read_records(rep.records_path(rep.RESULTS, pair, bench, group), tag) if tag else {}
            counts[key] = sum(i in got for i in ids)
        out[bench] = counts | {"of": len(ids), "complete": all(v == len(ids) for v in counts.values())}
    return out


def status() -> dict:
    meta = rep.load_meta(rep.RESULTS)
    names = list(dict.fromkeys([*TRAIN, *(n for pair in REPORTS.values() for n in pair)]))
    return {"checkpoints": {n: checkpoint(n) for n in names},
            "reports": {f"{p}/{k}": report_status(p, k, meta) for p, k in REPORTS}}


def render(st: dict) -> str:
    lines = ["fusers:"]
    for n, c in st["checkpoints"].items():
        where = "committed" if c["committed"] else ("C2C_HOME" if c["path"] else "not started")
        lines.append(f"  {n:16s} step {c['step']}/{c['total'] or '?'}  {'complete' if c['complete'] else ''} "
                     f"({where})")
    lines.append("reports (records: base / fused / control of the questions):")
    for key, benches in st["reports"].items():
        cells = [f"{b}: " + ("-" if s["of"] is None else f"{s['base']}/{s['fused']}/{s['control']} of {s['of']}")
                 for b, s in benches.items()]
        lines.append(f"  {key:13s} " + " · ".join(cells))
    return "\n".join(lines)


def _rel(path: str | Path) -> str:
    p = Path(path)
    return str(p.relative_to(ROOT)) if p.is_relative_to(ROOT) else str(p)


def commit_checkpoint(c: dict) -> str | None:
    """Copy a complete run's checkpoint into checkpoints/fuser/<name> (no training state; its per-step loss log,
    which the report's training audit reads); None if too large."""
    src, dst = Path(c["path"]), COMMITTED / c["name"]
    files = [src / "config.json", src / "fuser.safetensors"] + [f for f in [src / "train_log.jsonl"] if f.is_file()]
    if sum(f.stat().st_size for f in files) > MAX_COMMIT_BYTES:
        return None
    dst.mkdir(parents=True, exist_ok=True)
    for f in files:
        shutil.copy2(f, dst / f.name)
    return str(dst)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--run", action="store_true", help="train and report whatever is missing, one step at a time")
    ap.add_argument("--dry-run", action="store_true", help="with --run: print the commands, run nothing")
    ap.add_argument("--only", choices=["train", "report"], help="with --run: one kind of step")
    ap.add_argument("--pairs", default="a,b,c", help="comma-separated pairs to train and report (default a,b,c)")
    ap.add_argument("--json", action="store_true", help="print the status as JSON")
    args = ap.parse_args(argv)
    pairs = {p.strip() for p in args.pairs.split(",") if p.strip()}
    st = status()
    if not args.run:
        print(json.dumps(st, indent=1) if args.json else render(st))
        return 0
    nice = ["nice", "-n", "10"] if shutil.which("nice") else []
    c2c = [sys.executable, "-m", "c2c.cli.main"]
    wanted = [n for n in TRAIN if any(n in REPORTS[k] for k in REPORTS if k[0] in pairs)]
    if args.only != "report":
        for name in wanted:
            c = checkpoint(name)
            if not c["complete"]:
                cmd = nice + c2c + ["fuser", "train", "--config", _rel(CONFIGS / f"{name}.json"), "--threads", "1"]
                print("+", " ".join(cmd), flush=True)
                if not args.dry_run and subprocess.call(cmd, cwd=ROOT) != 0:
                    print(f"training {name} failed; fix it and run again (it resumes)", file=sys.stderr)
                    return 1
                c = checkpoint(name)
            if c["complete"] and not c["committed"] and not args.dry_run:
                print(f"{name}: checkpoint copied to {commit_checkpoint(c) or 'nowhere (over 25 MB)'}")
    if args.only == "train":
        return 0
    for (pair, kind), (fuser, control) in REPORTS.items():
        if pair not in pairs:
            continue
        f, k = checkpoint(fuser), checkpoint(control)
        if not f["complete"]:
            print(f"{pair}/{kind}: waits for {fuser} (step {f['step']}/{f['total'] or '?'})")
            continue
        if k["complete"] and all(s["complete"] for s in report_status(pair, kind, rep.load_meta(rep.RESULTS)).values()):
            continue
        cmd = nice + [sys.executable, "benchmarks/fuser_report.py", "--pair", pair, "--kind", kind,
                      "--checkpoint", _rel(f["path"])]
        if k["complete"]:
            cmd += ["--control", _rel(k["path"])]
        else:  # base and fused records now; the control's in a later run, once it is trained
            print(f"{pair}/{kind}: its control {control} is not trained yet (step {k['step']}); "
                  "reporting without it for now")
        print("+", " ".join(cmd), flush=True)
        if not args.dry_run and subprocess.call(cmd, cwd=ROOT) != 0:
            print(f"report {pair}/{kind} failed; fix it and run again (it resumes from its records)", file=sys.stderr)
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
