"""Does a fuser use the Sharer's cache on instruction data it never saw, and does more data help?

#16 asks to extend the training corpora with self-generated responses "if more data helps". This
measures both halves of that question for every committed fuser against its matched control (the
same data, steps, seed and size, fed the Receiver's own cache):

1. **Held-out loss.** The mean next-token loss of the response, with hard gates as at inference, on
   instruction examples (alpaca, dolly, lima) that no committed run drew (:func:`c2c.fuser.data.held_out`),
   a fixed random ``--limit`` of them. Fuser minus control, paired per example, with a 95% bootstrap
   interval: below zero, the Sharer's cache helps on new text.
2. **Learning curve.** Every run is one epoch, so each step's batch is new to it: the fuser's training
   loss minus the control's on the same batch is a held-out gap after ``step x 8`` examples. It is
   given per quarter of the run and as a least-squares slope over the steps, both with 95% bootstrap
   intervals (over steps). A gap that keeps falling with the examples seen says more data would help;
   a flat or rising one says it would not. Runs without a committed log use a rerun of the same recipe
   (``benchmarks/results/fuser_training/``), which audits the recipe, not the committed weights.

Writes ``benchmarks/results/fuser_heldout.{json,md,png}`` and per-example records
``fuser_heldout.jsonl`` (checkpoint, fuser id, example id, loss); a rerun reuses the records of an
unchanged checkpoint. Usage (CPU; ~1 h on one thread, most of it pair (a)'s 1.5B Sharer)::

    nice -n 10 .venv/bin/python benchmarks/fuser_heldout.py
    .venv/bin/python benchmarks/fuser_heldout.py --render-only
"""

from __future__ import annotations

import argparse
import hashlib
import json
import random
import sys
import tempfile
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
COMMITTED = ROOT / "checkpoints" / "fuser"
RERUNS = RESULTS / "fuser_training"
SOURCES = ("alpaca", "dolly", "lima")
# (label, fuser, matched control, fuser's training log, control's log): logs relative to the repository root
PAIRS = (
    ("general (a)", "general_pair_a", "general_control",
     "checkpoints/fuser/general_pair_a/train_log.jsonl", "checkpoints/fuser/general_control/train_log.jsonl"),
    ("general (b)", "general_pair_b", "general_control",
     "checkpoints/fuser/general_pair_b/train_log.jsonl", "checkpoints/fuser/general_control/train_log.jsonl"),
    ("general (c)", "general_pair_c", "general_control",
     "checkpoints/fuser/general_pair_c/train_log.jsonl", "checkpoints/fuser/general_control/train_log.jsonl"),
    ("task-tuned (a)", "pair_a", "control_a",
     "benchmarks/results/fuser_training/pair_a_retrain.train_log.jsonl", "checkpoints/fuser/control_a/train_log.jsonl"),
    ("task-tuned (b)", "pair_b", "control", None, None),
    ("task-tuned (c)", "pair_c", "control",
     "checkpoints/fuser/pair_c/train_log.jsonl", "benchmarks/results/fuser_training/control_retrain.train_log.jsonl"),
)
QUARTERS = 4


def example_id(e) -> str:
    return hashlib.sha256(json.dumps([list(map(list, e.messages)), e.response]).encode()).hexdigest()[:16]


def committed_runs() -> list[tuple[dict[str, int], int]]:
    """(sources, seed) of every committed checkpoint's training: the held-out set avoids all of them."""
    runs = []
    for cfg in sorted(COMMITTED.glob("*/config.json")):
        train = json.loads(cfg.read_text())["train"]
        runs.append((dict(train["sources"]), int(train["seed"])))
    return runs


def held_out_sample(limit: int, seed: int):
    from c2c.fuser.data import held_out

    pool = held_out(SOURCES, committed_runs())
    return random.Random(seed).sample(pool, min(limit, len(pool))), len(pool)


def read_records(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines()] if path.is_file() else []


def checkpoint_losses(name: str, examples, receiver, sharers: dict, progress: bool,
                      path: Path | None = None) -> tuple[str, dict[str, float | None]]:
    """Per-example held-out loss of the checkpoint at ``path`` (default: the committed ``name``):
    (fuser id, {example id: loss, or None where the context is too long to train on})."""
    from c2c.fuser import checkpoint as ckpt
    from c2c.fuser.train import Trainer, TrainConfig

    path = path or COMMITTED / name
    meta = ckpt.read_meta(path)
    cfg = TrainConfig.from_checkpoint(meta)
    with tempfile.TemporaryDirectory() as tmp:  # a run folder that holds no state: nothing resumes, nothing kept
        cfg = replace(cfg, out_dir=tmp, device="cpu")
        tr = Trainer(cfg, receiver=receiver, sharer=sharers.get(cfg.sharer), examples=examples, progress=progress)
        tr.load_weights(path)
        losses = tr.held_out_losses()
    kept = {example_id(e): x for e, x in zip(tr.examples, losses)}
    return meta.fuser_id, {example_id(e): kept.get(example_id(e)) for e in examples}  # None: context too long


def gap_curve(fuser_log: Path, control_log: Path) -> dict | None:
    """Per-step training-loss gap (fuser - control): per quarter, and its slope per 100 steps, with 95% bootstrap
    intervals over steps."""
    import numpy as np
    from c2c.bench.stats import bootstrap_mean

    from fuser_report import read_train_log

    f, c = read_train_log(fuser_log), read_train_log(control_log)
    steps = sorted(set(f) & set(c))
    if len(steps) < 2 * QUARTERS:
        return None
    x = np.array(steps, dtype=np.float64)
    d = np.array([f[s] - c[s] for s in steps])
    quarters = []
    for part in np.array_split(np.arange(len(steps)), QUARTERS):
        quarters.append({"steps": [int(x[part[0]]), int(x[part[-1]])], "diff": float(d[part].mean()),
                         "ci95": bootstrap_mean(d[part], reps=4000)})
    rng = np.random.default_rng(0)
    boots = []
    for _ in range(2000):
        i = rng.integers(0, len(d), len(d))
        if np.ptp(x[i]) > 0:
            boots.append(np.polyfit(x[i], d[i], 1)[0])
    slope = float(np.polyfit(x, d, 1)[0])
    lo, hi = np.quantile(boots, [0.025, 0.975])
    window = max(1, len(d) // 12)
    smooth = np.convolve(d, np.ones(window) / window, mode="valid")
    return {"steps": len(steps), "quarters": quarters,
            "slope_per_100_steps": 100 * slope, "slope_ci95": [100 * float(lo), 100 * float(hi)],
            "curve": {"step": [int(s) for s in x[window - 1:]], "gap": [round(float(v), 5) for v in smooth],
                      "window": window},
            "fuser_log": _shown(fuser_log), "control_log": _shown(control_log)}


def _shown(path: Path) -> str:
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)


def verdict(curve: dict | None) -> str:
    if curve is None:
        return "no log"
    lo, hi = curve["slope_ci95"]
    last = curve["quarters"][-1]
    if hi < 0:
        trend = "falls with data"
    elif lo > 0:
        trend = "rises with data"
    else:
        trend = "flat"
    where = "below" if last["ci95"][1] < 0 else "above" if last["ci95"][0] > 0 else "at"
    return f"{trend}; {where} the control in the last quarter"


def build(records: list[dict], sample_ids: list[str], pool: int, limit: int, seed: int) -> dict:
    import numpy as np
    from c2c.bench.stats import bootstrap_mean

    by: dict[str, dict[str, float]] = {}
    ids: dict[str, str] = {}
    for r in (r for r in records if r["loss"] is not None):
        by.setdefault(r["checkpoint"], {})[r["example"]] = r["loss"]
        ids[r["checkpoint"]] = r["fuser_id"]
    rows = []
    for label, fuser, control, flog, clog in PAIRS:
        f, c = by.get(fuser, {}), by.get(control, {})
        common = [i for i in sample_ids if i in f and i in c]
        row = {"label": label, "fuser": fuser, "control": control, "n": len(common)}
        if common:
            fv, cv = np.array([f[i] for i in common]), np.array([c[i] for i in common])
            row |= {"fuser_loss": float(fv.mean()), "fuser_ci95": bootstrap_mean(fv, reps=4000),
                    "control_loss": float(cv.mean()), "control_ci95": bootstrap_mean(cv, reps=4000),
                    "diff": float((fv - cv).mean()), "diff_ci95": bootstrap_mean(fv - cv, reps=4000),
                    "fuser_id": ids[fuser], "control_id": ids[control]}
        row["learning_curve"] = gap_curve(ROOT / flog, ROOT / clog) if flog and clog else None
        row["verdict"] = verdict(row["learning_curve"])
        rows.append(row)
    return {"held_out": {"sources": list(SOURCES), "pool": pool, "limit": limit, "seed": seed,
                         "examples": len(sample_ids)}, "pairs": rows}


def _pm(v: float, ci) -> str:
    return f"{v:+.4f} ({ci[0]:+.4f}, {ci[1]:+.4f})"


def bold(v: float, ci) -> str:
    """``v (lo, hi)``, in bold where the interval clears zero."""
    t = _pm(v, ci)
    return f"**{t}**" if ci[0] > 0 or ci[1] < 0 else t


def render(report: dict) -> str:
    h = report["held_out"]
    lines = ["# Held-out loss and learning curves of the fusers against their matched controls", "",
             f"Held-out set: {h['examples']} instruction examples ({', '.join(h['sources'])}) drawn with seed "
             f"{h['seed']} from the {h['pool']} that no committed fuser or control trained on; n counts those whose "
             "context fits the fuser's 256 tokens (the others are never trained on either). Loss: mean next-token "
             "cross-entropy of the response (at most 48 tokens), hard gates as at inference. Differences are fuser "
             "minus control, paired; 95% bootstrap intervals; **bold** where the interval clears zero.", "",
             "| fuser | n | fuser loss | control loss | fuser - control (held out) | training gap, 1st quarter | "
             "last quarter | slope per 100 steps | learning curve |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---|"]
    for r in report["pairs"]:
        cells = [f"{r['label']} (`{r['fuser']}` vs `{r['control']}`)", str(r["n"])]
        if r["n"]:
            cells += [f"{r['fuser_loss']:.4f}", f"{r['control_loss']:.4f}", bold(r["diff"], r["diff_ci95"])]
        else:
            cells += ["-", "-", "-"]
        lc = r["learning_curve"]
        if lc:
            q0, q1 = lc["quarters"][0], lc["quarters"][-1]
            cells += [bold(q0["diff"], q0["ci95"]), bold(q1["diff"], q1["ci95"]),
                      bold(lc["slope_per_100_steps"], lc["slope_ci95"])]
        else:
            cells += ["-", "-", "-"]
        cells.append(r["verdict"])
        lines.append("| " + " | ".join(cells) + " |")
    lines += ["", "Training gap: the fuser's training loss minus its control's on the same batch (each batch is new "
              "to both: one epoch), over the first and last quarter of the steps; the slope is a least-squares fit "
              "over all steps, bootstrapped over steps (neighbouring steps share a trajectory, so these intervals "
              "are if anything too narrow). Task-tuned (a)'s fuser log and task-tuned (c)'s control log come from "
              "reruns of the committed recipes (`benchmarks/results/fuser_training/`); task-tuned (b) has no log.",
              "", "Reproduce: `nice -n 10 .venv/bin/python benchmarks/fuser_heldout.py` "
              "(records in `fuser_heldout.jsonl`; `--render-only` rebuilds from them).", ""]
    return "\n".join(lines)


def plot(report: dict, out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a1, a2) = plt.subplots(1, 2, figsize=(12, 4.2))
    for r in report["pairs"]:
        lc = r["learning_curve"]
        if lc:
            a1.plot([8 * s for s in lc["curve"]["step"]], lc["curve"]["gap"], label=r["label"])
    a1.axhline(0, color="grey", lw=0.8, ls="--")
    a1.set_xlabel("training examples seen")
    a1.set_ylabel("training loss, fuser - control (rolling mean)")
    a1.set_title("Learning curve: below zero, the Sharer's cache helps", fontsize=9)
    a1.legend(fontsize=7)
    rows = [r for r in report["pairs"] if r["n"]]
    y = list(range(len(rows)))
    a2.errorbar([r["diff"] for r in rows], y, fmt="o", capsize=3,
                xerr=[[r["diff"] - r["diff_ci95"][0] for r in rows], [r["diff_ci95"][1] - r["diff"] for r in rows]])
    a2.set_yticks(y, [r["label"] for r in rows], fontsize=8)
    a2.axvline(0, color="grey", lw=0.8, ls="--")
    a2.set_xlabel("held-out loss, fuser - control (95% CI)")
    a2.set_title(f"Held out: {max(r['n'] for r in rows)} unseen instruction examples", fontsize=9)
    fig.tight_layout()
    fig.savefig(out, dpi=120)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--limit", type=int, default=300, help="held-out examples (a fixed random subset; default 300)")
    ap.add_argument("--seed", type=int, default=0, help="seed of the subset")
    ap.add_argument("--threads", type=int, default=1, help="torch CPU threads (default 1: a background job)")
    ap.add_argument("--results", default=str(RESULTS), help="folder of the outputs")
    ap.add_argument("--kinds", default="general,task-tuned",
                    help="which fusers to measure (with their controls): general, task-tuned or both (default)")
    ap.add_argument("--render-only", action="store_true", help="only rebuild json, markdown and plot from records")
    ap.add_argument("--json", action="store_true", help="print the report as JSON instead of the table")
    args = ap.parse_args(argv)
    if args.limit < 1:
        ap.error("--limit must be at least 1")
    kinds = {k.strip() for k in args.kinds.split(",") if k.strip()}
    if not kinds or kinds - {"general", "task-tuned"}:
        ap.error(f"--kinds takes general and/or task-tuned, not {args.kinds!r}")

    from c2c._io import write_atomic
    from c2c.bench import results

    out = Path(args.results) / "fuser_heldout"
    recs_path = out.with_suffix(".jsonl")
    records = read_records(recs_path)
    sample, pool = held_out_sample(args.limit, args.seed)
    sample_ids = [example_id(e) for e in sample]
    if not args.render_only:
        import torch
        from c2c.runtime import zoo

        torch.set_num_threads(args.threads)
        names = sorted({n for label, f, c, _, _ in PAIRS if label.split(" ")[0] in kinds for n in (f, c)})
        from c2c.fuser import checkpoint as ckpt

        metas = {n: ckpt.read_meta(COMMITTED / n) for n in names}
        receiver = zoo.load(metas[names[0]].receiver["name"], device="cpu", dtype="float32")
        for sharer_name in sorted({m.sharer["name"] for m in metas.values()}):  # one Sharer in memory at a time
            sharer = None if sharer_name == ckpt.SELF else zoo.load(sharer_name, device="cpu", dtype="float32")
            for n in (n for n in names if metas[n].sharer["name"] == sharer_name):
                have = {r["example"] for r in records if r["checkpoint"] == n and r["fuser_id"] == metas[n].fuser_id}
                if set(sample_ids) <= have:
                    continue
                fid, losses = checkpoint_losses(n, sample, receiver, {sharer_name: sharer} if sharer else {},
                                                progress=True)
                records = [r for r in records if r["checkpoint"] != n] + [
                    {"checkpoint": n, "fuser_id": fid, "example": i, "loss": None if x is None else round(x, 6)}
                    for i, x in losses.items()]
                recs_path.parent.mkdir(parents=True, exist_ok=True)
                write_atomic(recs_path, "".join(json.dumps(r) + "\n" for r in records).encode(), durable=False)
            del sharer
    report = build(records, sample_ids, pool, args.limit, args.seed)
    status = results.write(out, report, render(report), records=records, plot=lambda path: plot(report, path),
                           echo=not args.json)
    if args.json:
        print(json.dumps(report, indent=1))
        return 0
    return status


if __name__ == "__main__":
    sys.exit(main())
