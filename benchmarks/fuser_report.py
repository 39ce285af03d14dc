"""Heterogeneous C2C report, scored as lm-evaluation-harness scores: every condition, causal controls, records.

Writes ``benchmarks/results/fuser.{json,md,png}`` and per-question records under
``benchmarks/results/fuser_records/`` (committed: any number of the report can be
recomputed from them). The conditions, the scoring and the latency are
:mod:`c2c.bench.harness`'s: lm-eval's ``Question: ...\\nAnswer:`` context with each option's
text as the continuation (``acc`` and ``acc_norm``), for the Receiver, the Sharer, t2t (a
hint), t2t_choice (the Sharer's chosen option), c2c, its matched control, and c2c fed another
question's or a zeroed Sharer cache; plus the oracle max(receiver, sharer) and c2c/Sharer
agreement. Intervals are 95% bootstrap over questions; c2c is compared with every other
condition by the paired bootstrap of the per-question difference, and **bold** means that
interval lies above zero.

Each benchmark is one fixed random subset (``--limit``, ``--seed``) of a reported split,
never trained on. The Receiver sits at chance on all four of #16's benchmarks under this
scoring, so ARC-Easy test, where it does not, is reported beside them for every fuser and
control that never trained on ARC-Easy (the general ones), and is never pooled.
A (pair, kind) is the pair's fuser of that training kind: ``general``
(instruction data only, the paper's way) or ``task-tuned`` (mostly multiple-choice questions,
in a chat prompt that lists the options and answered with a label; this report's plain
``Question:``/``Answer:`` context, with option texts as continuations, is new to both kinds).
Records that do not depend on the fuser (receiver, sharer, t2t, t2t_choice) are kept once per
pair and benchmark, tagged with the two models' weight digests and the hint length; the
others per kind, tagged with the fuser's id, and the control's with its id: records made
with other models, checkpoints or settings are never mixed in. Every run resumes from them.
Latency is measured in each pass (base, fused, control) by that pass; run them under the same
settings (the default: one thread, nice) for the c2c/t2t comparison to mean something;
``benchmarks/fuser_latency.py`` checks that by timing every condition in one process on the same questions.

Usage (CPU, background, one thread; at --limit 200, pair (b)'s base pass, shared by both kinds, takes
~35-50 min per benchmark, then fused and control ~17 min per benchmark and kind; pair (a) about twice that)::

    nice -n 10 .venv/bin/python benchmarks/fuser_report.py --pair b --kind general \\
        --checkpoint checkpoints/fuser/general_pair_b --control checkpoints/fuser/general_control
    nice -n 10 .venv/bin/python benchmarks/fuser_report.py --pair b --kind task-tuned \\
        --checkpoint checkpoints/fuser/pair_b --control checkpoints/fuser/control
    .venv/bin/python benchmarks/fuser_report.py --render-only
    .venv/bin/python benchmarks/fuser_report.py --audit RUN/train_log.jsonl checkpoints/fuser/control_a/train_log.jsonl
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

from c2c.bench import results
from c2c.bench.fuser_records import BASE, BENCHMARKS, CONTROL, FUSED, Records, record_file

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
# The four that #16 names, pooled and judged. The Receiver sits at chance on all four under lm-eval scoring, so
# ARC-Easy, where it does not, is reported beside them, never pooled, and only for a fuser (and control) that
# never trained on it: the task-tuned fusers drew multiple-choice examples from ARC-Easy.
POOLED = ("ARC-Challenge dev", "OpenBookQA", "MMLU val", "C-Eval val")
HELD_OUT_UNLESS_TRAINED = {"ARC-Easy test": "arc_easy"}  # benchmark -> the training source that would spoil it
KINDS = ("general", "task-tuned")
SHOWN = ("receiver", "sharer", "oracle", "t2t", "t2t_choice", "c2c", "control", "c2c_other", "c2c_zero")
CHANCE = dict.fromkeys(BENCHMARKS, 0.25)  # four options each


def benchmarks_for(sources: dict | None) -> tuple[str, ...]:
    """The benchmarks a fuser trained on ``sources`` (its config's ``train.sources``) is reported on: the four
    pooled ones, plus each held-out one that it (and its control) never trained on."""
    used = set(sources or {})
    return POOLED + tuple(b for b, src in HELD_OUT_UNLESS_TRAINED.items() if src not in used)


def pair_folder(root: Path, pair: str) -> Path:
    """Where a pair's records live (:mod:`c2c.bench.fuser_records`)."""
    return root / "fuser_records" / f"pair_{pair}"


def records_path(root: Path, pair: str, bench: str, group: str | None) -> Path:
    """``group``: None (the fuser-free conditions), a kind (its fuser's), or ``KIND.control``."""
    return record_file(pair_folder(root, pair), bench, group)


def run_store(root: Path, m: dict) -> Records:
    """The records of one (pair, kind) of ``runs.json`` (``m``: its entry)."""
    return Records(folder=pair_folder(root, m["pair"]), kind=m["kind"], base_tag=m.get("base_tag"),
                   fuser_id=m["fuser_id"], control_id=m.get("control_id"))


def meta_path(root: Path) -> Path:
    return root / "fuser_records" / "runs.json"


def load_meta(root: Path) -> dict:
    """``runs.json``: each (pair, kind)'s fuser, control, settings and questions (empty before the first run)."""
    path = meta_path(root)
    return json.loads(path.read_text()) if path.is_file() else {"runs": {}}


def update_meta(path: Path, key: str, run: dict) -> dict:
    """Write this run's entry into ``runs.json`` under a lock, keeping what other runs wrote."""
    import fcntl

    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.with_suffix(".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        meta = json.loads(path.read_text()) if path.is_file() else {"runs": {}}
        old = meta["runs"].get(key)
        if old and all(old.get(k) == run.get(k) for k in ("fuser_id", "limit", "seed", "base_tag")):
            # NOTE: two runs of one pair (say --groups base and --groups fused on two cores) each hold the
            # benchmarks they have reached so far; keep the other's, so neither drops a benchmark from the report
            run["questions"] = {**old.get("questions", {}), **run.get("questions", {})}
        meta["runs"][key] = run
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(meta, indent=1, sort_keys=True))
        os.replace(tmp, path)
    return meta


def run_records(root: Path, m: dict, bench: str) -> list[dict]:
    """One (pair, kind)'s records on one benchmark (``m``: its ``runs.json`` entry), the three passes joined per
    question, in the subset's order; only records made with its models, fuser, control and settings."""
    return run_store(root, m).read(bench, m["questions"][bench])


def build_report(root: Path, meta: dict) -> dict:
    """Summaries per (pair, kind) and benchmark from the records, pooled over complete benchmarks."""
    from c2c.bench.harness import summarize

    report = {"pairs": {}}
    for key, m in sorted(meta.get("runs", {}).items()):
        benches, pooled = {}, []
        for bench, ids in m["questions"].items():
            recs = run_records(root, m, bench)
            complete = len(recs) == len(ids) and all(set(BASE + FUSED + CONTROL) <= set(r["cond"]) for r in recs)
            benches[bench] = summarize(recs) | {"complete": complete, "of": len(ids)}
            benches[bench]["receiver_above_chance"] = above_chance(benches[bench], CHANCE[bench])
            if complete and bench in POOLED:
                pooled += recs
        pooled_s = summarize(pooled) | {"benchmarks": sum(b["complete"] for n, b in benches.items() if n in POOLED)}
        pooled_s["receiver_above_chance"] = above_chance(pooled_s, 0.25)
        report["pairs"][key] = {**m, "benchmarks": benches, "pooled": pooled_s,
                                "training_audit": training_audit(m.get("fuser_id"), m.get("control_id"))}
    return report


def above_chance(summary: dict, chance: float) -> dict[str, bool]:
    """Per metric: does the Receiver's 95% interval lie above chance? Where it does not, a gain over
    the Receiver is a gain over a model that knows nothing measurable there, and means little."""
    r = summary.get("conditions", {}).get("receiver")
    return {m: bool(r and r[f"{m}_ci95"][0] > chance) for m in ("acc", "norm")}


def acceptance(report: dict) -> dict:
    """#16's bars for general pair (a), on the pooled four benchmarks (absent until they are complete)."""
    run = report["pairs"].get("a/general")
    if not run or run["pooled"].get("benchmarks", 0) < len(POOLED):
        return {"general_pair_a": "not measured yet"}
    p, c = run["pooled"]["paired"], run["pooled"]["conditions"]
    return {"c2c_beats_receiver_by_3_points_and_clears": p["receiver"]["acc"]["diff"] >= 0.03
            and p["receiver"]["acc"]["clears"],
            **{f"c2c_clears_{x}": p[x]["acc"]["clears"] for x in ("control", "t2t", "c2c_other", "c2c_zero")},
            "c2c_latency_2x_below_t2t": c["t2t"]["latency_s"] >= 2 * c["c2c"]["latency_s"]}


def _cell(row: dict | None, paired: dict | None, metric: str) -> str:
    if row is None:
        return "–"
    lo, hi = row[f"{metric}_ci95"]
    text = f"{100 * row[metric]:.1f} ({100 * lo:.0f}–{100 * hi:.0f})"
    return f"**{text}**" if paired and paired[metric]["clears"] else text


def markdown(report: dict) -> str:
    lines = ["# Heterogeneous C2C, scored as lm-evaluation-harness scores", "",
             "Generated by `benchmarks/fuser_report.py` from the per-question records in `fuser_records/`. "
             "Each cell: accuracy in % (95% bootstrap interval). Context `Question: ...\\nAnswer:`, each option's "
             "text as the continuation, as lm-eval's ARC and OpenBookQA tasks do (`c2c.bench.harness`; agreement "
             "with lm-eval itself: `lm_eval_agreement.md`). A c2c cell is **bold** only where the paired bootstrap "
             "interval of (c2c − that condition) lies above zero, for the condition named in the paired table. "
             "Chance is 25% on every benchmark: a condition whose interval holds 25% knows nothing measurable "
             "there. † marks a row where the Receiver's own interval holds chance: there a c2c gain over it is a "
             "gain over a model that knows nothing measurable on the task, and the row means little. ‡ marks "
             "ARC-Easy test, where the Receiver is above chance: reported only for fusers (and controls) that never "
             "trained on ARC-Easy, and never pooled: the pooled row and the acceptance are over the four named "
             "benchmarks.", ""]
    for key, run in report["pairs"].items():
        lines += [f"## Pair {run['pair']}, {run['kind']}: {run['sharer']} → {run['receiver']}", "",
                  f"Fuser `{run['fuser_id'][:12]}` (step {run['step']}; {run['checkpoint_name']}), control "
                  f"`{(run.get('control_id') or '–')[:12]}`; {run['limit']} questions per benchmark (seed "
                  f"{run['seed']}); Sharer hint {run['hint_tokens']} tokens.", ""]
        if run.get("gates"):
            g = run["gates"]
            shut = sorted((k for k, v in g.items() if not v), key=lambda k: (k[0], int(k[1:])))
            lines += [f"Learned gates: {len(g) - len(shut)} of {len(g)} open"
                      + (f"; closed: {', '.join(shut)}" if shut else "") + " (`k12`: the keys of Receiver layer 12).",
                      ""]
        for metric, title in (("acc", "acc"), ("norm", "acc_norm")):
            lines += [f"**{title}**", "", "| benchmark | n | " + " | ".join(SHOWN) + " |",
                      "|---|---:|" + "---:|" * len(SHOWN)]
            rows = list(run["benchmarks"].items()) + [(f"pooled ({run['pooled'].get('benchmarks', 0)} complete)",
                                                       run["pooled"])]
            for bench, s in rows:
                if not s.get("n"):
                    lines.append(f"| {bench} | 0 | " + " | ".join("–" for _ in SHOWN) + " |")
                    continue
                cells = []
                for c in SHOWN:
                    paired = None
                    if c == "c2c":  # bold c2c only when it clears the Receiver
                        paired = s.get("paired", {}).get("receiver")
                    cells.append(_cell(s["conditions"].get(c), paired, metric))
                n = s["n"] if s.get("complete", True) else f"{s['n']}/{s['of']}"
                mark = ("" if s.get("receiver_above_chance", {}).get(metric, True) else " †") + (
                    " ‡" if bench in HELD_OUT_UNLESS_TRAINED else "")
                lines.append(f"| {bench}{mark} | {n} | " + " | ".join(cells) + " |")
            lines.append("")
        pooled = run["pooled"]
        if pooled.get("paired"):
            lines += ["**c2c against each condition** (pooled; paired difference in points, 95% bootstrap interval; "
                      "**bold**: above zero, *italic*: below)", "",
                      "| against | acc diff | acc_norm diff |", "|---|---:|---:|"]
            for c, d in pooled["paired"].items():
                cells = []
                for m in ("acc", "norm"):
                    x = d[m]
                    t = f"{100 * x['diff']:+.1f} ({100 * x['ci95'][0]:+.1f}, {100 * x['ci95'][1]:+.1f})"
                    cells.append(f"**{t}**" if x["clears"] else (f"*{t}*" if x["below"] else t))
                lines.append(f"| {c} | " + " | ".join(cells) + " |")
            cond = pooled["conditions"]
            lat = " · ".join(f"{c} {1000 * cond[c]['latency_s']:.0f} ms" for c in ("receiver", "sharer", "t2t",
                                                                                  "t2t_choice", "c2c", "control")
                             if c in cond)
            lines += ["", f"Latency per question (pooled mean, one process, one after another, every condition on the "
                          f"same runtime: transformers, float32, {run.get('threads', 1)} thread, nice; t2t's hint is "
                          f"not run on llama.cpp here, which decodes faster): {lat}.", ""]
            lines += agreement_lines(pooled, "pooled")
            for bench, b in run["benchmarks"].items():  # the held-out split where the Receiver is above chance
                if bench in HELD_OUT_UNLESS_TRAINED and b.get("complete"):
                    lines += agreement_lines(b, bench)
        t = run.get("training_audit")
        if t:
            lines += [f"Training audit (the fuser's loss minus its matched control's on the same batches, per step; "
                      f"95% bootstrap): {t['diff']:+.4f} ({t['ci95'][0]:+.4f}, {t['ci95'][1]:+.4f}) over {t['steps']} "
                      f"steps, {t['second_half']['diff']:+.4f} ({t['second_half']['ci95'][0]:+.4f}, "
                      f"{t['second_half']['ci95'][1]:+.4f}) over the last {t['second_half']['steps']}. Below zero "
                      "would mean the Sharer's cache lowers the loss on the training data itself.", ""]
        audit = cache_audit(pooled if pooled.get("cache_delta") else next(
            (b for b in run["benchmarks"].values() if b.get("cache_delta")), {}))
        if audit:
            lines += [audit, ""]
    lines += ["## Acceptance (#16, general pair (a), pooled over the four benchmarks)", ""]
    for k, v in acceptance(report).items():
        lines.append(f"- {k}: **{v if isinstance(v, str) else ('PASS' if v else 'FAIL')}**")
    return "\n".join(lines) + "\n"


def agreement_lines(summary: dict, where: str) -> list[str]:
    """Each condition's agreement with the Sharer's choice, and c2c's shift beyond the others' (paired)."""
    agree, shift = summary.get("sharer_agreement"), summary.get("sharer_agreement_shift", {})
    if not agree:
        return []
    rates = " · ".join(f"{c} {100 * a['rate']:.1f}%" for c, a in agree.items())
    cells = []
    for c, d in shift.items():
        t = f"{100 * d['diff']:+.1f} ({100 * d['ci95'][0]:+.1f}, {100 * d['ci95'][1]:+.1f})"
        cells.append(f"{c} **{t}**" if d["clears"] else f"{c} {t}")
    beyond = [c for c in ("receiver", "control", "c2c_other", "c2c_zero") if c in shift]
    verdict = ""
    if beyond:
        verdict = (f" Against {', '.join(beyond)}: c2c " + (
            "moves toward the Sharer beyond all of them, as a handoff of what the Sharer read would."
            if all(shift[c]["clears"] for c in beyond) else
            "does not move toward the Sharer beyond all of them, so this does not show the fuser carrying the "
            "Sharer's choice over."))
    return [f"Agreement with the Sharer's choice ({where}, acc): {rates}. c2c's agreement minus each one's, paired (points; "
            f"bold where it clears zero): {' · '.join(cells)}.{verdict} t2t_choice is told the Sharer's option.", ""]


def read_train_log(path: Path) -> dict[int, float]:
    """Per-step training loss from a ``train_log.jsonl`` (a resumed run logs a redone step again: the last counts)."""
    log = {}
    for line in path.read_text().splitlines():
        x = json.loads(line)
        log[int(x["step"])] = float(x["loss"])
    return log


def training_log(fuser_id: str | None) -> dict[int, float]:
    """Per-step training loss of the committed checkpoint with this fuser id (``train_log.jsonl`` beside it)."""
    for cfg in sorted((ROOT / "checkpoints" / "fuser").glob("*/config.json")) if fuser_id else []:
        try:
            if json.loads(cfg.read_text()).get("fuser_id") != fuser_id:
                continue
            return read_train_log(cfg.parent / "train_log.jsonl")
        except (OSError, ValueError, KeyError):
            return {}
    return {}


def training_audit(fuser_id: str | None, control_id: str | None) -> dict | None:
    """The fuser's training loss minus its matched control's, step by step: the same examples in the same
    order, so the difference is paired. Below zero: the Sharer's cache helps on the training data itself."""
    return loss_audit(training_log(fuser_id), training_log(control_id))


def loss_audit(f: dict[int, float], c: dict[int, float]) -> dict | None:
    """Mean per-step loss difference ``f - c`` over their common steps, with 95% bootstrap intervals
    (all steps, and the second half); None without a common step."""
    from c2c.bench.stats import bootstrap_mean

    steps = sorted(set(f) & set(c))
    if not steps:
        return None
    d = [f[s] - c[s] for s in steps]
    late = d[len(d) // 2:]
    return {"steps": len(steps), "diff": sum(d) / len(d), "ci95": bootstrap_mean(d, reps=4000),
            "second_half": {"steps": len(late), "diff": sum(late) / len(late), "ci95": bootstrap_mean(late, reps=4000)}}


def cache_audit(summary: dict) -> str:
    """One sentence from ``cache_delta``: how far fusion moves the Receiver's cache, and how much of
    that follows what the Sharer read."""
    d = {k: v["mean"] for k, v in summary.get("cache_delta", {}).items()}
    if "c2c~receiver" not in d:
        return ""
    n = summary["cache_delta"]["c2c~receiver"]["n"]
    parts = [f"fusion moves the Receiver's cache by {100 * d['c2c~receiver']:.1f}% of its norm"]
    if "control~receiver" in d:
        parts.append(f"the control by {100 * d['control~receiver']:.1f}%")
    for k, what in (("c2c~c2c_other", "another question's Sharer cache"), ("c2c~c2c_zero", "a zeroed one")):
        if k in d:
            parts.append(f"feeding {what} moves c2c's fused cache by {100 * d[k]:.1f}%")
    return (f"Cache audit (mean over {n} questions; Frobenius norm of the difference over every layer's K and V, "
            "relative to the Receiver cache's): " + "; ".join(parts) + ".")


def plot_panels(report: dict) -> list[tuple[str, dict]]:
    """(title, summary) per panel of ``fuser.png``: each run's pooled benchmarks, then each held-out benchmark it
    has records on (shown apart, never pooled)."""
    panels = []
    for run in report["pairs"].values():
        if run["pooled"].get("n"):
            p = run["pooled"]
            panels.append((f"pair {run['pair']}, {run['kind']}, pooled over {p['benchmarks']} of {len(POOLED)} "
                           f"benchmarks (n={p['n']})", p))
        for bench in HELD_OUT_UNLESS_TRAINED:
            b = run["benchmarks"].get(bench, {})
            if b.get("n") and b.get("conditions"):
                panels.append((f"pair {run['pair']}, {run['kind']}, {bench} (n={b['n']}, held out)", b))
    return panels


def _plot(report: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = plot_panels(report)
    if not panels:
        return
    cols = min(3, len(panels))  # a grid, not one wide strip, once there are many runs
    rows = -(-len(panels) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(5.5 * cols, 3.8 * rows), squeeze=False)
    for ax in axes.flat[len(panels):]:
        ax.set_visible(False)
    for ax, (title, summary) in zip(axes.flat, panels):
        cond = summary["conditions"]
        names = [c for c in SHOWN if c in cond]
        accs = [100 * cond[c]["acc"] for c in names]
        err = [[100 * (cond[c]["acc"] - cond[c]["acc_ci95"][0]) for c in names],
               [100 * (cond[c]["acc_ci95"][1] - cond[c]["acc"]) for c in names]]
        ax.bar(names, accs, yerr=err, capsize=3, color=["C1" if c == "c2c" else "C0" for c in names])
        ax.axhline(25, color="grey", lw=0.8, ls="--")
        ax.set_ylabel("acc (%), 95% CI")
        ax.set_title(title, fontsize=9)
        ax.tick_params(axis="x", rotation=40, labelsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def write_all(root: Path, meta: dict) -> dict:
    report = build_report(root, meta)
    report["acceptance"] = acceptance(report)
    # NOTE: the status is not returned: the acceptance is #16's research bar, and failing it is a finding
    results.write(root / "fuser", report, markdown(report), plot=lambda path: _plot(report, path), echo=False)
    return report


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pair", help="pair label: a, b or c")
    ap.add_argument("--kind", choices=KINDS, help="how the fuser was trained")
    ap.add_argument("--checkpoint", help="the pair's fuser checkpoint directory")
    ap.add_argument("--control", help="its matched control fuser's checkpoint directory (without it, the control "
                                      "is left for a later run; the benchmark is not complete until then)")
    ap.add_argument("--limit", type=int, default=200, help="questions per benchmark (fixed random subset)")
    ap.add_argument("--seed", type=int, default=0, help="seed of the subset")
    ap.add_argument("--benchmarks", default="",
                    help="comma-separated subset of the benchmarks (default: the four pooled ones, plus ARC-Easy "
                         "test where neither the fuser nor its control trained on ARC-Easy)")
    ap.add_argument("--hint-tokens", type=int, default=32, help="t2t: most tokens the Sharer writes (one or two sentences)")
    ap.add_argument("--threads", type=int, default=1, help="torch CPU threads (default 1: a background job)")
    ap.add_argument("--results", default=str(RESULTS), help="folder of fuser.json, fuser.md and the records")
    ap.add_argument("--groups", default="base,fused,control",
                    help="which passes to run: base (the fuser-free conditions), fused (c2c and its causal controls), "
                         "control (the matched control); e.g. fused,control on a second core while another run "
                         "makes the base records of the same pair")
    ap.add_argument("--render-only", action="store_true", help="only rebuild json, markdown and plot from records")
    ap.add_argument("--audit", nargs=2, metavar=("FUSER_LOG", "CONTROL_LOG"),
                    help="only print the training audit (JSON) of two train_log.jsonl files, e.g. a run whose "
                         "weights were not committed against its matched control's log")
    args = ap.parse_args(argv)

    if args.audit:
        try:
            logs = [read_train_log(Path(p)) for p in args.audit]
        except (OSError, ValueError, KeyError) as e:
            ap.error(f"--audit needs two train_log.jsonl files (one JSON line per step with 'step' and 'loss'): {e}")
        audit = loss_audit(*logs)
        if audit is None:
            ap.error("--audit: the two logs share no step")
        print(json.dumps(audit, indent=2))
        return 0

    root = Path(args.results)
    meta = load_meta(root)  # re-read when written
    if args.render_only:
        write_all(root, meta)
        return 0
    if not (args.pair and args.kind and args.checkpoint):
        ap.error("--pair, --kind and --checkpoint are required (or --render-only)")
    groups_run = {g.strip() for g in args.groups.split(",") if g.strip()}
    if not groups_run or groups_run - {"base", "fused", "control"}:
        ap.error(f"--groups takes base, fused and/or control, not {args.groups!r}")
    asked = [b.strip() for b in args.benchmarks.split(",") if b.strip()]
    unknown = [b for b in asked if b not in BENCHMARKS]
    if unknown:
        ap.error(f"unknown benchmarks {unknown}; choose from {', '.join(BENCHMARKS)}")

    import torch

    torch.set_num_threads(args.threads)
    from c2c.bench.harness import HarnessEvaluator
    from c2c.fuser.data import data_root, load_questions, subset
    from c2c.fuser.infer import FusedReceiver

    fused = FusedReceiver.load([args.checkpoint])
    link = fused.links[0]
    control = None
    if args.control:
        control = FusedReceiver.load([args.control], receiver=fused.receiver)
        if not control.links[0].meta.is_control:
            ap.error(f"{args.control} is not a control fuser (its Sharer is {control.links[0].sharer_name!r}, "
                     "not the Receiver)")
    sources = {**link.meta.train.get("sources", {}), **(control.links[0].meta.train.get("sources", {}) if control
                                                          else {})}
    allowed = benchmarks_for(sources)
    spoiled = [b for b in asked if b not in allowed]
    if spoiled:
        ap.error(f"{spoiled}: the fuser or its control trained on {HELD_OUT_UNLESS_TRAINED[spoiled[0]]!r}, so its "
                 "accuracy there is not held out; leave it out of --benchmarks")
    benches = asked or list(allowed)
    ev = HarnessEvaluator(fused.receiver, sharer=link.sharer, fused=fused, control=control,
                          hint_tokens=args.hint_tokens)
    key = f"{args.pair}/{args.kind}"
    run = meta["runs"].get(key)
    base_tag = {"receiver_w": fused.receiver.weights_digest[:16], "sharer_w": link.sharer.weights_digest[:16],
                "hint_tokens": args.hint_tokens}
    if run and (run["fuser_id"], run["limit"], run["seed"], run.get("base_tag")) != (
            link.meta.fuser_id, args.limit, args.seed, base_tag):
        print(f"{key}: a new checkpoint or subset; its old records stay on disk but are no longer used",
              file=sys.stderr)
        run = None
    run = run or {"pair": args.pair, "kind": args.kind, "questions": {}, "control_id": None}
    if control is not None:
        run["control_id"] = control.links[0].meta.fuser_id
    run |= {"gates": {k: int(v) for k, v in link.fuser.gates().items()}}  # the learned layer selection
    run |= {"fuser_id": link.meta.fuser_id, "base_tag": base_tag, "receiver": fused.receiver.name,
            "sharer": link.sharer_name,
            "step": link.meta.step,
            "checkpoint_name": Path(args.checkpoint).name, "limit": args.limit, "seed": args.seed,
            "hint_tokens": args.hint_tokens, "threads": args.threads}
    root_data = data_root()
    store = run_store(root, run)
    conditions = [c for g, conds in (("base", BASE), ("fused", FUSED), ("control", CONTROL if control else ()))
                  if g in groups_run for c in conds]
    for bench in benches:
        qs = subset(load_questions(root_data / BENCHMARKS[bench]), args.limit, args.seed)
        run["questions"][bench] = [q.id for q in qs]
        meta = update_meta(meta_path(root), key, run)
        t0 = time.perf_counter()
        store.run(ev, bench, qs, conditions, extra={"threads": args.threads})
        report = write_all(root, meta)
        s = report["pairs"][key]["benchmarks"][bench]["conditions"]
        print(f"{bench} ({time.perf_counter() - t0:.0f} s): "
              + ", ".join(f"{c} {100 * s[c]['acc']:.1f}" for c in SHOWN if c in s), file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
