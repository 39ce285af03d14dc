"""Cross-model cache maps (c2c.xmodel) on planted-fact document QA: does a mapped cache beat the source alone?

    python benchmarks/xmodel_map.py                                  # 0.5B -> 1.5B, 256-token documents, 300 questions
    python benchmarks/xmodel_map.py --doc-tokens 1024
    python benchmarks/xmodel_map.py --source Qwen2.5-Coder-1.5B-Instruct --target Qwen2.5-Coder-0.5B-Instruct
    python benchmarks/xmodel_map.py --calibrate                      # the map's calibration record (other questions)
    python benchmarks/xmodel_map.py --summary-only                   # xmodel_map.{json,md,png} from the runs so far

The task is c2c.bench.context_qa (a made-up fact planted in real text, exact match). On the same
questions, with the same shared system prompt (every agent holds its own model's cache of it):

- ``target``: the target model reads the document itself (its own prefill: the upper bound), timed;
- ``mapped``: the source reads the document; its cache, mapped (c2c.xmodel.map_cache, the target's
  own cache of the system prompt kept), is adopted by the target, which answers without prefilling
  the document; timed from the source's cache to the target's (mapping + attach);
- ``mapped_all``: the same with only the first token the target's own (the system prompt mapped too);
- ``source``: the source model answers from its own cache (the baseline a map must beat);
- ``text``: the source writes a note on the document (it does not know the question; at most
  ``--note-tokens``), the target reads the note and answers;
- ``none``: the target answers with no document (the floor: the values are random).

Exact match with 95% Wilson intervals; mapped against source and against target as paired
differences (bootstrap 95% interval over questions). The timing claim compares, question by
question in this one run, the target's prefill of the document with mapping + attaching it.

``--calibrate`` runs ``mapped``, ``source`` and ``target`` on questions of another seed (held out from
the reported ones) and writes the map's calibration record (c2c.xmodel.MapCalibration) beside the
map: whether the mapped target beats the source alone, with its interval.

Records go to ``benchmarks/results/xmodel_map/<SOURCE>--<TARGET>_<N>.jsonl`` as they are made (one line per
question and condition); the same command resumes. Run it niced on one thread on a shared machine; on K
free cores, start K processes together with ``--shard 0/K`` ... ``--shard K-1/K`` (each takes every K-th of
the questions still to do).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from statistics import median

RESULTS = Path(__file__).resolve().parent / "results"
ROOT = Path(__file__).resolve().parents[1]
CONDITIONS = ("target", "mapped", "mapped_all", "source", "text", "none")
CALIBRATION_CONDITIONS = ("target", "mapped", "source")
UP = ("Qwen2.5-Coder-0.5B-Instruct", "Qwen2.5-Coder-1.5B-Instruct")
# NOTE: phrased as a question, as the shared system prompt asks for answers only (an instruction to "write a note"
# got "No other words." from the 0.5B); on 5 development documents (seed 5) 3 of its notes held the planted fact.
NOTE = ("Question: What specific facts does the document state (names, numbers, codes, days, places, colors)? "
        "List each one as a short sentence, one per line.")


def map_path(source: str, target: str) -> Path:
    return ROOT / "checkpoints" / "xmodel" / f"{source}--{target}.c2cmap"


def run_name(source: str, target: str, doc_tokens: int, calibrate: bool = False) -> str:
    return f"{source}--{target}_{doc_tokens}" + ("_calibration" if calibrate else "")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--source", default=UP[0], help="the model whose cache is mapped")
    ap.add_argument("--target", default=UP[1], help="the model that continues from the mapped cache")
    ap.add_argument("--map", default=None, help="the map file (default: checkpoints/xmodel/SOURCE--TARGET.c2cmap)")
    ap.add_argument("--doc-tokens", type=int, default=256)
    ap.add_argument("--n", type=int, default=None, help="questions (default 300; 100 with --calibrate)")
    ap.add_argument("--seed", type=int, default=None, help="question seed (default 0; 1 with --calibrate)")
    ap.add_argument("--conditions", default=None, help=f"comma-separated subset of {','.join(CONDITIONS)}")
    ap.add_argument("--calibrate", action="store_true", help="write the map's calibration record (held-out seed)")
    ap.add_argument("--max-new-tokens", type=int, default=10)
    ap.add_argument("--note-tokens", type=int, default=64, help="text: most tokens of the source's note")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--shard", default="0/1", metavar="I/K",
                    help="compute only every K-th of the questions still to do, from the I-th: K processes "
                         "started together on K cores share one run (the report reads all its records)")
    ap.add_argument("--dtype", default=None, choices=["auto", "float32", "bfloat16"])
    ap.add_argument("--report-only", action="store_true", help="report the records as they are, computing nothing")
    ap.add_argument("--summary-only", action="store_true", help="only rewrite xmodel_map.{json,md,png}")
    ap.add_argument("--out-dir", default=str(RESULTS), help="results folder (records in OUT_DIR/xmodel_map/)")
    args = ap.parse_args()
    out_dir = Path(args.out_dir)
    if args.summary_only:
        return summary(out_dir)
    n = args.n or (100 if args.calibrate else 300)
    seed = args.seed if args.seed is not None else (1 if args.calibrate else 0)
    conditions = [c for c in (args.conditions or ",".join(CALIBRATION_CONDITIONS if args.calibrate else CONDITIONS))
                  .split(",") if c]
    if set(conditions) - set(CONDITIONS):
        ap.error(f"unknown conditions {sorted(set(conditions) - set(CONDITIONS))}")
    shard, _, shards = args.shard.partition("/")
    if not (shard.isdigit() and shards.isdigit() and int(shard) < int(shards)):
        ap.error(f"--shard must be I/K with 0 <= I < K, e.g. 0/2 (got {args.shard!r})")
    shard, shards = int(shard), int(shards)

    import torch
    from tqdm import tqdm

    from c2c.artifact.prefix import SharedPrefix
    from c2c.bench import context_qa as cqa
    from c2c.bench.results import read_records
    from c2c.runtime import alloc, zoo
    from c2c.team.agent import Agent, Team
    from c2c.xmodel import load, map_cache

    alloc.keep_large_buffers()
    torch.set_num_threads(args.threads)
    S, T = zoo.load(args.source, dtype=args.dtype), zoo.load(args.target, dtype=args.dtype)
    mpath = Path(args.map) if args.map else map_path(S.name, T.name)
    xmap = load(mpath)
    questions = cqa.build(T, n, args.doc_tokens, seed=seed)
    name = run_name(S.name, T.name, args.doc_tokens, args.calibrate)
    records_path = out_dir / "xmodel_map" / f"{name}.jsonl"
    records_path.parent.mkdir(parents=True, exist_ok=True)
    done = read_records(records_path, keep=lambda r: r.get("map_id") == xmap.id)  # another map's are not this run's
    team = Team(shared=SharedPrefix.build(cqa.SYSTEM))
    team.prefix_cache(S), team.prefix_cache(T)  # computed once, as every agent of a team holds them
    t_start = time.perf_counter()
    with open(records_path, "a") as log:
        todo_questions = [q for q in questions if any((q.id, c) not in done for c in conditions)]
        mine = [] if args.report_only else todo_questions[shard::shards]
        for q in tqdm(mine, desc=f"{S.name} -> {T.name}, {args.doc_tokens} tokens", file=sys.stderr):
            todo = [c for c in conditions if (q.id, c) not in done]
            if not todo:
                continue
            doc = "Document:\n" + q.document
            question = "Question: " + q.question
            reader = Agent("source", S, team)
            t0 = time.perf_counter()
            reader.read(doc, label="doc", private=False)
            source_prefill_s = time.perf_counter() - t0
            doc_cache = reader.cache
            for c in todo:
                extra: dict = {}
                if c in ("source", "text"):
                    agent = Agent("source", S, team)
                    agent.adopt(doc_cache, label="doc")
                    if c == "text":
                        note = agent.respond(NOTE, max_new_tokens=args.note_tokens, label="note")
                        writer = Agent("target", T, team)
                        t0 = time.perf_counter()
                        writer.read("Notes from a colleague who read the document:\n" + note.text, label="note")
                        extra = {"note": note.text, "note_tokens": len(note.token_ids),
                                 "read_s": time.perf_counter() - t0}
                        agent = writer
                else:
                    agent = Agent("target", T, team)
                    t0 = time.perf_counter()
                    if c == "target":
                        agent.read(doc, label="doc", private=False)
                    elif c in ("mapped", "mapped_all"):
                        prefix = team.prefix_cache(T) if c == "mapped" else None
                        cache = map_cache(xmap, doc_cache, source=S, target=T, prefix=prefix)
                        agent.adopt(cache, label="from:source")
                    if c != "none":
                        extra = {"context_s": time.perf_counter() - t0}
                g = agent.respond(question, max_new_tokens=args.max_new_tokens)
                rec = {"id": q.id, "condition": c, "answer": q.answer, "reply": g.text,
                       "correct": cqa.exact_match(g.text, q.answer), "doc_tokens": doc_cache.seq_len,
                       "source_prefill_s": source_prefill_s, "map_id": xmap.id, **extra}
                done[q.id, c] = rec
                log.write(json.dumps(rec) + "\n")
                log.flush()
    if shards > 1:  # the other shards' records, written while this one ran
        done |= read_records(records_path, keep=lambda r: r.get("map_id") == xmap.id)
    records = [done[q.id, c] for q in questions for c in conditions if (q.id, c) in done]
    result = report(records, conditions, n=n)
    result |= {"source": S.name, "target": T.name, "map": str(mpath.relative_to(ROOT)) if mpath.is_relative_to(ROOT)
               else str(mpath), "map_id": xmap.id, "map_r2": {"k": xmap.r2("k"), "v": xmap.r2("v")},
               "layer_mapping": {"k": xmap.layer_sources("k"), "v": xmap.layer_sources("v")},
               "doc_tokens": args.doc_tokens, "n": n, "seed": seed, "calibration": args.calibrate,
               "max_new_tokens": args.max_new_tokens, "note_tokens": args.note_tokens,
               "dtype": str(T.dtype).replace("torch.", ""), "threads": args.threads,
               "machine": {"cpus": os.cpu_count(), "torch": torch.__version__},
               "seconds": time.perf_counter() - t_start,
               "command": "python benchmarks/xmodel_map.py " + " ".join(_without_shard(sys.argv[1:])),
               "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
               "example": questions[0].to_dict() | {"document": questions[0].document[:300] + "..."}}
    (out_dir / "xmodel_map" / f"{name}.json").write_text(json.dumps(result, indent=2))
    if args.calibrate:
        rec = calibration(result, task=f"context_qa doc_tokens={args.doc_tokens} seed={seed}")
        if rec is not None:
            from c2c.xmodel.calibration import record_path

            rec.save(record_path(mpath))  # where MapOffer.load and `c2c serve --map` look for it
            print(rec.reason)
    return summary(out_dir)


def _without_shard(argv: list[str]) -> list[str]:
    """The command as a reader would rerun it: no --report-only, no --shard (the records are the same)."""
    out, skip = [], False
    for x in argv:
        if skip:
            skip = False
        elif x == "--shard":
            skip = True
        elif x != "--report-only" and not x.startswith("--shard="):
            out.append(x)
    return out


# ----------------------------------------------------------------------------- numbers
def report(records: list[dict], conditions: list[str], *, n: int) -> dict:
    """Accuracy per condition (Wilson 95%), paired differences, and the timing claim, from the records."""
    from c2c.bench.stats import bootstrap_mean, wilson

    by: dict[str, dict[str, dict]] = {c: {} for c in conditions}
    for r in records:
        by.setdefault(r["condition"], {})[r["id"]] = r
    rows = {}
    for c in conditions:
        rs = list(by[c].values())
        k, m = sum(bool(r["correct"]) for r in rs), len(rs)
        lo, hi = wilson(k, m)
        rows[c] = {"correct": k, "n": m, "acc": k / m if m else 0.0, "ci95": [lo, hi]}
        secs = [r["context_s"] for r in rs if "context_s" in r]
        if secs:
            rows[c]["median_context_s"] = median(secs)
    paired = {}
    for a, b in (("mapped", "source"), ("mapped", "target"), ("mapped_all", "source"), ("text", "source"),
                 ("mapped", "text"), ("source", "none")):
        if a in by and b in by:
            ids = [i for i in by[a] if i in by[b]]
            if ids:
                d = [float(by[a][i]["correct"]) - float(by[b][i]["correct"]) for i in ids]
                lo, hi = bootstrap_mean(d)
                paired[f"{a}-{b}"] = {"n": len(ids), "diff": sum(d) / len(d), "ci95": [lo, hi],
                                      "clears_zero": lo > 0, "below_zero": hi < 0}
    speed = None
    if "target" in by and "mapped" in by:
        ids = [i for i in by["mapped"] if i in by["target"]]
        if ids:
            ratios = [by["target"][i]["context_s"] / by["mapped"][i]["context_s"] for i in ids]
            pre = median(by["target"][i]["context_s"] for i in ids)
            mp = median(by["mapped"][i]["context_s"] for i in ids)
            speed = {"n": len(ids), "median_prefill_s": pre, "median_map_attach_s": mp,
                     "median_speedup": median(ratios), "min_speedup": min(ratios), "speedup_of_medians": pre / mp}
    retained = None
    if rows.get("target", {}).get("correct") and rows.get("mapped", {}).get("n"):
        retained = rows["mapped"]["acc"] / rows["target"]["acc"]
    complete = all(rows[c]["n"] == n for c in conditions)
    return {"conditions": rows, "paired": paired, "speed": speed, "mapped_over_target_accuracy": retained,
            "complete": complete, "scoring": "exact match after SQuAD normalization of the reply's first line"}


def calibration(result: dict, *, task: str):
    """The map's :class:`~c2c.xmodel.MapCalibration` from a calibration run's result (None without the pair)."""
    from c2c.xmodel import MapCalibration

    p = result["paired"].get("mapped-source")
    if p is None:
        return None
    rows, m = result["conditions"], p["n"]
    if rows["mapped"]["n"] != m or rows["source"]["n"] != m:
        return None  # counts must be over the same questions; finish the run first
    target_k = rows["target"]["correct"] if rows.get("target", {}).get("n") == m else -1
    return MapCalibration(map_id=result["map_id"], task=task, n=m, mapped_correct=rows["mapped"]["correct"],
                          source_correct=rows["source"]["correct"], target_correct=target_k,
                          diff_ci95=tuple(p["ci95"]))


# ----------------------------------------------------------------------------- summary
def summary(out_dir: Path) -> int:
    """``xmodel_map.{json,md,png}``: every run in ``OUT_DIR/xmodel_map/`` (the reported seed), with the acceptance."""
    from c2c.bench.results import write

    runs = {}
    for p in sorted((out_dir / "xmodel_map").glob("*.json")):
        r = json.loads(p.read_text())
        runs[p.stem] = r
    main_runs = {k: r for k, r in runs.items() if not r.get("calibration")}
    if not main_runs:
        print(f"no runs in {out_dir / 'xmodel_map'}; run benchmarks/xmodel_map.py first", file=sys.stderr)
        return 2
    up_1024 = [r for r in main_runs.values() if (r["source"], r["target"]) == UP and r["doc_tokens"] == 1024]
    speed = up_1024[0]["speed"] if up_1024 else None
    five = {"target", "mapped", "source", "text", "none"}

    def runs_of(pair, *, complete: bool) -> dict[int, dict]:
        return {r["doc_tokens"]: r for r in main_runs.values() if (r["source"], r["target"]) == pair
                and five <= set(r["conditions"]) and (r["complete"] or not complete)}

    acceptance = {  # the issue's: escalation (UP) is the main direction, on every question at 256 and 1024 tokens
        "map_attach_5x_faster_than_prefill_at_1024": bool(speed and speed["median_speedup"] >= 5),
        "main_direction_five_conditions_on_all_questions_at_256_and_1024":
            {256, 1024} <= set(runs_of(UP, complete=True)),
        "reverse_direction_reported": bool(runs_of(UP[::-1], complete=False)),
    }
    result = {"runs": {k: {x: r[x] for x in ("source", "target", "doc_tokens", "n", "seed", "map_id", "conditions",
                                             "paired", "speed", "mapped_over_target_accuracy", "complete",
                                             "command", "created", "layer_mapping", "map_r2")}
                       for k, r in runs.items()},
              "acceptance": acceptance}
    lines = ["# Cross-model cache maps on planted-fact document QA", "",
             "A source model reads a document; its KV-cache, mapped by a closed-form ridge map (RoPE out, per-layer "
             "linear maps from the source layer and its neighbours, the target's RoPE back in; `c2c.xmodel`), is "
             "adopted by the target model, which answers a question about the document without reading it. "
             "Exact match (c2c.bench.context_qa), 95% Wilson intervals; paired differences with bootstrap 95% "
             "intervals over the same questions. Per-question records: `xmodel_map/*.jsonl` beside this file.", ""]
    for k, r in main_runs.items():
        lines += _run_markdown(r)
    for k, r in runs.items():
        if r.get("calibration"):
            p = r["paired"].get("mapped-source")
            lines += [f"Calibration record ({r['source']} -> {r['target']}, {r['doc_tokens']} tokens, seed {r['seed']}, "
                      f"{p['n'] if p else 0} questions held out from the reported ones): mapped - source "
                      + (f"{100 * p['diff']:+.1f} points (95% {100 * p['ci95'][0]:+.1f} to {100 * p['ci95'][1]:+.1f}): "
                         f"the mapped path is **{'earned' if p['clears_zero'] else 'not earned'}**." if p else "not measured"),
                      ""]
    lines += ["## Acceptance", ""] + [f"- {k}: **{'PASS' if v else 'FAIL'}**" for k, v in acceptance.items()]
    try:
        plot(main_runs, out_dir / "xmodel_map.png")
    except ImportError:
        pass
    return write(out_dir / "xmodel_map", result, "\n".join(lines) + "\n")


def _run_markdown(r: dict) -> list[str]:
    rows, paired = r["conditions"], r["paired"]
    lines = [f"## {r['source']} -> {r['target']}, {r['doc_tokens']}-token documents", "",
             f"`{r['command']}`, {r['created']}; map `{r['map_id'][:12]}…`; {r['n']} questions (seed {r['seed']}).", "",
             "| condition | correct | accuracy | 95% interval | median s to the target's context |",
             "|---|---:|---:|---|---:|"]
    for c, x in rows.items():
        med = f"{x['median_context_s']:.2f}" if "median_context_s" in x else "—"
        lines.append(f"| {c} | {x['correct']}/{x['n']} | {100 * x['acc']:.1f}% | "
                     f"{100 * x['ci95'][0]:.1f}–{100 * x['ci95'][1]:.1f}% | {med} |")
    short = [c for c, x in rows.items() if x["n"] < r["n"]]
    if short:
        counts = ", ".join(f"{c} ({rows[c]['n']})" for c in short)
        lines.append(f"\nNot yet on all {r['n']} questions: {counts} (the run resumes from its records).")
    lines.append("")
    ms = paired.get("mapped-source")
    if ms:
        verdict = ("beats the source alone" if ms["clears_zero"] else
                   "is worse than the source alone" if ms["below_zero"] else
                   "cannot be told apart from the source alone")
        lines.append(f"- **The mapped cache {verdict}**: mapped - source = {100 * ms['diff']:+.1f} points "
                     f"(95% {100 * ms['ci95'][0]:+.1f} to {100 * ms['ci95'][1]:+.1f}, {ms['n']} questions).")
    mt = paired.get("mapped-target")
    if mt:
        ret = r.get("mapped_over_target_accuracy")
        lines.append(f"- Against the target's own prefill: {100 * mt['diff']:+.1f} points "
                     f"(95% {100 * mt['ci95'][0]:+.1f} to {100 * mt['ci95'][1]:+.1f})"
                     + (f"; the mapped cache keeps {100 * ret:.0f}% of the target's accuracy." if ret is not None else "."))
    for key, label in (("mapped_all-source", "Mapping the system prompt too (`mapped_all`)"),
                       ("text-source", "Text (a note by the source)"), ("mapped-text", "Mapped against text")):
        p = paired.get(key)
        if p:
            lines.append(f"- {label}: {key.replace('-', ' - ')} = {100 * p['diff']:+.1f} points "
                         f"(95% {100 * p['ci95'][0]:+.1f} to {100 * p['ci95'][1]:+.1f}).")
    sp = r.get("speed")
    if sp:
        lines.append(f"- Time to the target's context, same run, {sp['n']} questions: own prefill median "
                     f"{sp['median_prefill_s']:.2f} s, map + attach median {sp['median_map_attach_s']:.3f} s: "
                     f"**{sp['median_speedup']:.1f}x** faster (median of per-question ratios; slowest question "
                     f"{sp['min_speedup']:.1f}x).")
    k_r2, v_r2 = r["map_r2"]["k"], r["map_r2"]["v"]
    lines += [f"- Map fit (held-out tokens): key R² {min(k_r2):.2f}–{max(k_r2):.2f} (mean {sum(k_r2) / len(k_r2):.2f}), "
              f"value R² {min(v_r2):.2f}–{max(v_r2):.2f} (mean {sum(v_r2) / len(v_r2):.2f}) over the target's layers.",
              ""]
    return lines


def plot(runs: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(runs), figsize=(4.2 * len(runs), 3.8), sharey=True, squeeze=False)
    for ax, (k, r) in zip(axes[0], runs.items()):
        names = list(r["conditions"])
        x = [r["conditions"][c] for c in names]
        ax.bar(names, [100 * c["acc"] for c in x], capsize=3,
               yerr=[[100 * (c["acc"] - c["ci95"][0]) for c in x], [100 * (c["ci95"][1] - c["acc"]) for c in x]],
               color=["C0" if c in ("mapped", "mapped_all") else "C7" for c in names])
        ax.set_title(f"{_short(r['source'])} -> {_short(r['target'])}, {r['doc_tokens']} tokens", fontsize=9)
        ax.tick_params(axis="x", rotation=35, labelsize=8)
    axes[0][0].set_ylabel("exact match (%)")
    axes[0][0].set_ylim(0, 100)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _short(model: str) -> str:
    """``Qwen2.5-Coder-0.5B-Instruct`` -> ``0.5B``; other names as they are."""
    return next((p for p in model.split("-") if p.endswith("B") and p[:-1].replace(".", "").isdigit()), model)


if __name__ == "__main__":
    sys.exit(main())
