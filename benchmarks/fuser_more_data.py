"""Does more data help general pair (a)? Continue it and its matched control on instruction data neither saw.

``fuser_heldout.py`` finds general pair (a)'s training gap to its control falling with the examples
seen (the other general pairs' is flat or rising) but not yet below zero. This continues both
committed checkpoints, ``general_pair_a`` and ``general_control``, identically on the instruction
examples that no committed run drew and that the held-out set leaves out (about 600), for one
epoch at the end of their schedule (lr 1e-4 decaying to 1e-5, gate temperature 0.1, a fresh AdamW,
seed 0), then measures both on ``fuser_heldout.py``'s held-out set. More data helps if the
continued fuser's held-out loss minus the continued control's falls below the committed pair's.

Writes ``benchmarks/results/fuser_more_data.{json,md}`` and per-example records
``fuser_more_data.jsonl``. The continued checkpoints stay in ``C2C_HOME/fuser/runs/<name>_more``
(reproducible by this command, not committed). Usage (CPU; ~15 min precompute with the 1.5B Sharer,
~25 min training each, ~10 min held-out; resumable)::

    nice -n 10 .venv/bin/python benchmarks/fuser_more_data.py
    .venv/bin/python benchmarks/fuser_more_data.py --render-only
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from collections import Counter
from dataclasses import replace
from pathlib import Path

import fuser_heldout as ho

PAIR = ("general_pair_a", "general_control")
CONTINUE = {"lr": 1e-4, "warmup_steps": 0, "tau_start": 0.1, "tau_end": 0.1, "epochs": 1.0, "save_every": 10,
            "seed": 0}


def continuation_set(limit: int, seed: int):
    """The held-out pool less the held-out sample: what the continued runs train on."""
    from c2c.fuser.data import held_out

    sample = {ho.example_id(e) for e in ho.held_out_sample(limit, seed)[0]}
    return [e for e in held_out(ho.SOURCES, ho.committed_runs()) if ho.example_id(e) not in sample]


def continued_config(name: str, examples):
    from c2c.fuser import checkpoint as ckpt
    from c2c.fuser.train import TrainConfig

    cfg = TrainConfig.from_checkpoint(ckpt.read_meta(ho.COMMITTED / name))
    counts = Counter(e.source for e in examples)  # what the run trains on (passed in, not drawn by mixture)
    return replace(cfg, name=f"{name}_more", out_dir=f"runs/{name}_more", sources=dict(sorted(counts.items())),
                   **CONTINUE)


def log_copy(name: str) -> Path:
    """Where the continued run's training log is kept in the repository (its weights are not)."""
    return ho.RERUNS / f"{name}_more.train_log.jsonl"


def train_continued(name: str, examples, receiver, sharer) -> int:
    """Continue the committed checkpoint ``name`` on ``examples`` (resumes an interrupted continuation);
    returns how many it trained on (those whose context fits)."""
    from c2c.fuser.train import Trainer

    cfg = continued_config(name, examples)
    tr = Trainer(cfg, receiver=receiver, sharer=sharer, examples=examples)
    if tr.state.step == 0:
        tr.load_weights(ho.COMMITTED / name)
    tr.train()
    shutil.copyfile(cfg.out_path() / "train_log.jsonl", log_copy(name))
    return len(tr.tokens)


def render(report: dict) -> str:
    lines = ["# More data for general pair (a): continued on unseen instruction examples", "",
             f"`general_pair_a` and its matched control `general_control`, each continued identically on "
             f"{report['continued_on']} instruction examples no committed run drew ({report['steps']} steps: lr 1e-4 "
             "to 1e-5, gate temperature 0.1, fresh AdamW, seed 0), then scored on the "
             f"{report['held_out']} held-out examples of `fuser_heldout.md`. Fuser minus control, paired per example, "
             "95% bootstrap; **bold** where the interval clears zero.", "",
             "| | examples trained on | fuser loss | control loss | fuser - control |", "|---|---:|---:|---:|---:|"]
    for key, label in (("committed", "committed"), ("continued", "continued")):
        r = report[key]
        lines.append(f"| {label} | {r['examples']} | {r['fuser_loss']:.4f} | {r['control_loss']:.4f} | "
                     f"{ho.bold(r['diff'], r['diff_ci95'])} |")
    ch, tg = report["change"], report["training_gap"]
    lines += ["", f"Change of the gap with the extra data (continued minus committed, paired per example): "
              f"{ho.bold(ch['diff'], ch['ci95'])}. Training gap over the continuation (fuser minus control, same "
              f"batches): {ho._pm(tg['diff'], tg['ci95']) if tg else 'no log'}.", "",
              f"Verdict: {report['verdict']}", "",
              "Reproduce: `nice -n 10 .venv/bin/python benchmarks/fuser_more_data.py` (records in "
              "`fuser_more_data.jsonl`; `--render-only` rebuilds from them).", ""]
    return "\n".join(lines)


def build(records: list[dict], sample_ids: list[str], heldout_records: list[dict], trained: tuple[int, int],
          logs: tuple[Path, Path]) -> dict:
    """``trained``: the examples the committed fuser trained on, and those the continuation added."""
    import numpy as np
    from c2c.bench.stats import bootstrap_mean

    from fuser_report import loss_audit, read_train_log

    def losses(recs, name):
        return {r["example"]: r["loss"] for r in recs if r["checkpoint"] == name and r["loss"] is not None}

    before = [losses(heldout_records, n) for n in PAIR]
    after = [losses(records, f"{n}_more") for n in PAIR]
    ids = [i for i in sample_ids if all(i in d for d in before + after)]
    out = {"held_out": len(ids), "continued_on": trained[1]}
    gaps = {}
    for key, (f, c) in (("committed", before), ("continued", after)):
        fv, cv = np.array([f[i] for i in ids]), np.array([c[i] for i in ids])
        gaps[key] = fv - cv
        out[key] = {"examples": trained[0] + (trained[1] if key == "continued" else 0),
                    "fuser_loss": float(fv.mean()), "control_loss": float(cv.mean()),
                    "diff": float(gaps[key].mean()), "diff_ci95": bootstrap_mean(gaps[key], reps=4000)}
    ch = gaps["continued"] - gaps["committed"]
    out["change"] = {"diff": float(ch.mean()), "ci95": bootstrap_mean(ch, reps=4000)}
    f, c = (read_train_log(p) for p in logs)
    audit = loss_audit(f, c)
    out["steps"] = audit["steps"] if audit else 0
    out["training_gap"] = {"diff": audit["diff"], "ci95": audit["ci95"]} if audit else None
    lo, hi = out["change"]["ci95"]
    below = out["continued"]["diff_ci95"][1] < 0
    out["verdict"] = (
        ("the extra data moves the fuser's held-out loss below its control's" if below else
         "the extra data lowers the fuser's held-out gap to its control, but not below the control") if hi < 0 else
        "the extra data does not measurably change the fuser's held-out gap to its control" if lo <= 0 else
        "the extra data widens the fuser's held-out gap to its control")
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--limit", type=int, default=300, help="fuser_heldout.py's held-out examples (kept out of training)")
    ap.add_argument("--seed", type=int, default=0, help="fuser_heldout.py's seed")
    ap.add_argument("--threads", type=int, default=1, help="torch CPU threads (default 1: a background job)")
    ap.add_argument("--results", default=str(ho.RESULTS), help="folder of the outputs")
    ap.add_argument("--render-only", action="store_true", help="only rebuild json and markdown from records")
    args = ap.parse_args(argv)

    from c2c._io import write_atomic
    from c2c.bench import results
    from c2c.fuser import checkpoint as ckpt

    out = Path(args.results) / "fuser_more_data"
    recs_path = out.with_suffix(".jsonl")
    records = ho.read_records(recs_path)
    sample, _ = ho.held_out_sample(args.limit, args.seed)
    cont = continuation_set(args.limit, args.seed)
    runs = [continued_config(n, cont).out_path() for n in PAIR]
    if not args.render_only:
        import torch
        from c2c.runtime import zoo

        torch.set_num_threads(args.threads)
        metas = {n: ckpt.read_meta(ho.COMMITTED / n) for n in PAIR}
        receiver = zoo.load(metas[PAIR[0]].receiver["name"], device="cpu", dtype="float32")
        sharer = zoo.load(metas[PAIR[0]].sharer["name"], device="cpu", dtype="float32")
        for n, run in zip(PAIR, runs):
            is_control = metas[n].sharer["name"] == ckpt.SELF
            added = train_continued(n, cont, receiver, None if is_control else sharer)
            fid, losses = ho.checkpoint_losses(n, sample, receiver, {} if is_control else
                                               {metas[n].sharer["name"]: sharer}, progress=True, path=run)
            records = [r for r in records if r["checkpoint"] != f"{n}_more"] + [
                {"checkpoint": f"{n}_more", "fuser_id": fid, "example": i, "loss": None if x is None else round(x, 6),
                 "trained_on": added} for i, x in losses.items()]
            recs_path.parent.mkdir(parents=True, exist_ok=True)
            write_atomic(recs_path, "".join(json.dumps(r) + "\n" for r in records).encode(), durable=False)
    heldout = ho.read_records(Path(args.results) / "fuser_heldout.jsonl")
    added = {r.get("trained_on") for r in records if r["checkpoint"] == f"{PAIR[0]}_more"}
    trained = (ckpt.read_meta(ho.COMMITTED / PAIR[0]).train["examples"], max(added - {None}, default=0))
    report = build(records, [ho.example_id(e) for e in sample], heldout, trained,
                   tuple(log_copy(n) for n in PAIR))
    return results.write(out, report, render(report), records=records)


if __name__ == "__main__":
    sys.exit(main())
