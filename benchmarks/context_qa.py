"""Document QA with planted facts (c2c.bench.context_qa): the text baseline, and c2c's handoffs against it.

    .venv/bin/python benchmarks/context_qa.py                                   # 300 questions at 256 tokens
    .venv/bin/python benchmarks/context_qa.py --doc-tokens 1024 --conditions none,text,full

The Receiver (Qwen2.5-Coder-0.5B-Instruct, the pairs' Receiver) answers each question
greedily (at most ``--max-new-tokens``) under each condition, all on the same questions:

- ``none``: the question alone (the floor: the planted values are random);
- ``text``: the Receiver reads the document itself, then the question;
- ``full``: an analyst reads the document and hands its whole cache over;
- ``slice_recompute``: only the document's span, re-prefilled after the shared prefix;
- ``slice_positions``: only the document's span at its positions after the analyst's
  private role turn, re-positioned after the Receiver's own (approximate: it was
  computed after text the Receiver never saw).
- ``noise@S``: the ``full`` handoff with Gaussian noise of std ``S`` x each head's own
  std added to every K and V (:func:`c2c.trust.noise.add_noise`, seeded per question):
  what a noised (privacy) or damaged cache costs.
- ``repair@R``: slice repair. The analyst first reads another question's document
  (private), then this one; the document's span is sent at its positions (it attended
  to the other document), re-positioned after the Receiver's prefix and repaired with
  ratio ``R`` (:func:`c2c.runtime.repair.repair`: ``R`` of its tokens recomputed; 0 is
  the raw slice, 1 recomputes it all).
- ``lora_own`` / ``lora_coder`` / ``lora_base``: LoRA roles on the Receiver's base. The
  ``writer`` role (an adapter) answers after reading the document itself, or after
  adopting the whole cache of an analyst that read it under the ``coder`` adapter, or
  under the plain base: a cache made under another role, against the role's own prefill.
  The two adapters are trained once (fp32, ``--lora-steps``; Alpaca for ``coder``, Dolly
  for ``writer``, never LIMA, whose texts the documents come from) and kept in
  ``C2C_HOME/adapters``; their loss on 20 held-out texts before and after training is
  reported.

Handoffs go through ``SharedTransport`` (the analyst's very tensors: the byte path
gives the same tokens, ``tests/runtime/test_backends.py``). Accuracy is exact match
with 95% Wilson intervals; a condition is bold when its interval clears ``text``'s.
Per-question records go to ``OUT.jsonl`` as they are made; the same command resumes.

Outputs benchmarks/results/context_qa_<N>.{json,md,jsonl,png} (or --out PREFIX), then the summary
over every document length measured, benchmarks/results/context_qa.{json,md,png}: each
condition at each length, and the curves (noise against sigma, slice repair against r, the LoRA
roles' caches) against text (``--summary-only`` rewrites it alone). The planted facts'
documents come from LIMA, one of the fuser's training corpora; the facts themselves are new random
values, so nothing of a question is in any training data.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"
CONDITIONS = ("none", "text", "full", "slice_recompute", "slice_positions", "lora_own", "lora_coder", "lora_base")
FAMILIES = ("noise@", "repair@")  # followed by a number: noise@0.3, repair@0.25
LORA = {"lora_own": "writer", "lora_coder": "coder", "lora_base": None}  # condition -> who made the cache


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="Qwen2.5-Coder-0.5B-Instruct")
    ap.add_argument("--dtype", default=None, choices=["auto", "float32", "bfloat16", "int8"])
    ap.add_argument("--doc-tokens", type=int, default=256)
    ap.add_argument("--n", type=int, default=300)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--conditions", default=",".join(CONDITIONS))
    ap.add_argument("--max-new-tokens", type=int, default=10)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--lora-steps", type=int, default=150, help="training steps per role adapter (once)")
    ap.add_argument("--report-only", action="store_true",
                    help="write the report from the records as they are, computing nothing")
    ap.add_argument("--summary-only", action="store_true",
                    help="only rewrite context_qa.{json,md,png} from the context_qa_<N>.json files")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    if args.summary_only:
        return summary(RESULTS)
    out = Path(args.out or RESULTS / f"context_qa_{args.doc_tokens}")
    conditions = [c for c in args.conditions.split(",") if c]
    unknown = {c for c in conditions if c not in CONDITIONS and _family_value(c) is None}
    if unknown:
        ap.error(f"unknown conditions {sorted(unknown)}; use {','.join(CONDITIONS)}, noise@S (0 < S <= 10) "
                 "or repair@R (0 <= R <= 1)")

    import torch
    from tqdm import tqdm

    from c2c.artifact.prefix import SharedPrefix
    from c2c.bench import context_qa as cqa
    from c2c.bench.results import read_records, write
    from c2c.bench.stats import wilson
    from c2c.handoff import SharedTransport, hand_off
    from c2c.runtime import alloc, zoo
    from c2c.runtime.repair import repair
    from c2c.team.agent import Agent, Team
    from c2c.trust.noise import NoiseConfig, add_noise

    alloc.keep_large_buffers()
    torch.set_num_threads(args.threads)
    rt = zoo.load(args.model, dtype=args.dtype)
    questions = cqa.build(rt, args.n, args.doc_tokens, seed=args.seed)
    records_path = out.with_suffix(".jsonl")
    done = read_records(records_path)
    team = Team(shared=SharedPrefix.build(cqa.SYSTEM))
    role = "You are the analyst. Read the document for the team."
    lora = None
    if args.report_only:  # what the records hold, nothing computed (a condition may cover fewer questions)
        if any(c in LORA for c in conditions):
            lora = role_adapters(args.model, args.lora_steps, train=False)
    elif any(c in LORA for c in conditions if any((q.id, c) not in done for q in questions)):
        lora = role_adapters(args.model, args.lora_steps)
    from c2c.runtime import adapters

    def use(who: str | None) -> None:
        if who is None:
            adapters.detach(rt)
        else:
            adapters.attach(rt, lora["paths"][who], who)
    records_path.parent.mkdir(parents=True, exist_ok=True)
    t_start = time.perf_counter()
    with open(records_path, "a") as log:
        for q in tqdm([] if args.report_only else questions, desc=f"context QA, {args.doc_tokens}-token documents",
                      file=sys.stderr):
            todo = [c for c in conditions if (q.id, c) not in done]
            if not todo:
                continue
            analyst = distracted = None
            if any(c in ("full", "slice_recompute", "slice_positions") or c.startswith("noise@") for c in todo):
                analyst = Agent("analyst", rt, team, role=role)
                analyst.read("Document:\n" + q.document, label="doc", private=False)
            if any(c.startswith("repair@") for c in todo):  # read another question's document first
                other = questions[(questions.index(q) + 1) % len(questions)]
                distracted = Agent("analyst", rt, team, role=role)
                distracted.read("Earlier document:\n" + other.document, label="other", private=True)
                distracted.read("Document:\n" + q.document, label="doc", private=False)
            made = {}
            for c in todo:
                if c in LORA and LORA[c] not in made:  # an analyst reads the document under that role
                    use(LORA[c])
                    maker = Agent("analyst", rt, team, role=role)
                    maker.read("Document:\n" + q.document, label="doc", private=False)
                    made[LORA[c]] = maker.cache
                if c in LORA:
                    use("writer")
                elif lora is not None:
                    use(None)
                writer = Agent("writer", rt, team)
                t0 = time.perf_counter()
                if c == "lora_own":
                    writer.read("Document:\n" + q.document, label="doc", private=False)
                elif c in LORA:  # a cache made under another role (or none), adopted as it is
                    writer.adopt(made[LORA[c]], label="from:analyst")
                elif c == "text":
                    writer.read("Document:\n" + q.document, label="doc", private=False)
                elif c == "full":
                    hand_off(analyst, writer, mode="full", transport=SharedTransport())
                elif c.startswith("slice_"):
                    hand_off(analyst, writer, mode="slice", labels=("doc",), isolation=c.removeprefix("slice_"),
                             transport=SharedTransport())
                elif c.startswith("noise@"):
                    noisy = add_noise(analyst.cache, NoiseConfig(sigma=_family_value(c), seed=args.seed * 100003
                                                                 + questions.index(q)))
                    writer.attach_cache(noisy, fingerprint=analyst.fingerprint, prefix=analyst.prefix,
                                        source="analyst")
                elif c.startswith("repair@"):
                    piece, _ = distracted.export_cache(labels=("doc",), isolation="positions")
                    head = writer.cache
                    cache, _ = repair(rt, head, rt.reposition(piece, head.end), ratio=_family_value(c))
                    writer.adopt(cache, label="from:analyst")
                g = writer.respond("Question: " + q.question, max_new_tokens=args.max_new_tokens)
                rec = {"id": q.id, "condition": c, "answer": q.answer, "reply": g.text,
                       "correct": cqa.exact_match(g.text, q.answer), "seconds": time.perf_counter() - t0,
                       "context_tokens": writer.cache.seq_len - len(g.token_ids) + 1}
                done[q.id, c] = rec
                log.write(json.dumps(rec) + "\n")
                log.flush()
    by = {c: [done[q.id, c] for q in questions if (q.id, c) in done] for c in conditions}
    rows = {}
    for c, rs in by.items():
        k, n = sum(r["correct"] for r in rs), len(rs)
        lo, hi = wilson(k, n)
        rows[c] = {"correct": k, "n": n, "acc": k / n if n else 0.0, "ci95": [lo, hi],
                   "median_s": sorted(r["seconds"] for r in rs)[n // 2] if n else None}
    if lora is not None:
        adapters.detach(rt)
    text = rows.get("text")
    for c, r in rows.items():  # compared only on the same questions
        same = text is not None and c != "text" and r["n"] == text["n"]
        r["above_text"] = same and r["ci95"][0] > text["ci95"][1]
        r["below_text"] = same and r["ci95"][1] < text["ci95"][0]
    dtype = "int8" if getattr(rt, "int8", 0) else str(rt.dtype).replace("torch.", "")
    result = {"model": args.model, "dtype": dtype, "doc_tokens": args.doc_tokens,
              "n": args.n, "seed": args.seed, "max_new_tokens": args.max_new_tokens, "conditions": rows,
              "scoring": "exact match after SQuAD normalization of the reply's first line",
              "acceptance": {"text_well_above_50pct": text is not None and text["ci95"][0] > 0.5},
              **({"lora_training": lora["curves"]} if lora else {}),
              "machine": {"cpus": os.cpu_count(), "torch": torch.__version__},
              "seconds": time.perf_counter() - t_start,
              "command": "python benchmarks/context_qa.py " + " ".join(x for x in sys.argv[1:] if x != "--report-only"),
              "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
              "examples": [q.to_dict() | {"document": q.document[:300] + "..."} for q in questions[:3]]}
    status = write(out, result, markdown(result), plot=lambda path: plot(result, path))
    if args.out is None:
        summary(RESULTS)
    return status


def role_adapters(model: str, steps: int, *, train: bool = True) -> dict | None:
    """The ``coder`` and ``writer`` adapters (trained once, in fp32, if missing) and their training curves;
    with ``train=False``, None when they are missing."""
    from c2c.config import c2c_home, data_dir
    from c2c.runtime import adapters, zoo

    alpaca = json.loads((data_dir() / "train" / "alpaca_en_demo.json").read_text())
    dolly = [json.loads(line) for line in (data_dir() / "train" / "dolly_hhrlhf_train_small.jsonl").open()]
    texts = {"coder": [f"{r['instruction']}\n{r['input']}\n{r['output']}".strip() for r in alpaca[:220]],
             "writer": [r["response"] for r in dolly[:220] if r.get("response")]}
    root = c2c_home() / "adapters"
    paths, curves = {}, {}
    for i, (who, ts) in enumerate(texts.items()):
        path = root / f"{model}-ctx-{who}"
        if not (path / "adapter_model.safetensors").is_file():
            if not train:
                return None
            trainer = zoo.load(model, dtype="float32")
            curve = adapters.train(trainer, ts[:200], path, steps=steps, lr=2e-4, seed=i + 1, eval_texts=ts[200:])
            del trainer
        else:
            curve = json.loads((path / "c2c-training.json").read_text())
        paths[who] = path
        curves[who] = {k: v for k, v in curve.items() if k != "losses"}
    return {"paths": paths, "curves": curves}


def _family_value(c: str) -> float | None:
    """The number of ``noise@S`` / ``repair@R`` (None for anything else, or out of range)."""
    for f in FAMILIES:
        if c.startswith(f):
            try:
                v = float(c.removeprefix(f))
            except ValueError:
                return None
            ok = 0 < v <= 10 if f == "noise@" else 0 <= v <= 1
            return v if ok else None
    return None


def markdown(r: dict) -> str:
    lines = [f"# Context QA: planted facts in {r['doc_tokens']}-token documents ({r['model']}, {r['dtype']})", "",
             f"`{r['command']}` — {r['created']}. {r['n']} questions, the same for every condition; "
             f"greedy replies of at most {r['max_new_tokens']} tokens; {r['scoring']}. 95% Wilson intervals; "
             "**bold**: the interval lies above the text baseline's; *(below)*: it lies under it; otherwise the "
             "two cannot be told apart.", "",
             "| condition | correct | accuracy | 95% interval | median s per question |", "|---|---:|---:|---|---:|"]
    for c, x in r["conditions"].items():
        acc = f"{100 * x['acc']:.1f}%"
        acc = f"**{acc}**" if x.get("above_text") else (f"{acc} *(below)*" if x.get("below_text") else acc)
        med = f"{x['median_s']:.2f}" if x["median_s"] is not None else "—"
        lines.append(f"| {c} | {x['correct']}/{x['n']} | {acc} | {100 * x['ci95'][0]:.1f}–{100 * x['ci95'][1]:.1f}% "
                     f"| {med} |")
    short = [f"{c} ({x['n']})" for c, x in r["conditions"].items() if x["n"] < r["n"]]
    if short:
        lines.append(f"\nNot yet on all {r['n']} questions: {', '.join(short)}, on the first of them in order "
                     "(the run that makes them resumes from the records; they are not compared with text until then).")
    for who, c in r.get("lora_training", {}).items():
        lines.append(f"\nRole adapter `{who}`: loss on {c.get('eval_texts', 0)} held-out texts "
                     f"{c.get('eval_before', float('nan')):.3f} before and {c.get('eval_after', float('nan')):.3f} "
                     f"after {c['steps']} steps.")
    ex = r["examples"][0]
    lines += ["", f"Example: the fact \"{ex['fact']}\" is planted in real text (LIMA outputs); the question is "
              f"\"{ex['question']}\", the answer \"{ex['answer']}\". `none` is the floor (random values: no prior "
              "knowledge helps). Records: the `.jsonl` beside this file.", "", "## Acceptance", ""]
    for k, v in r["acceptance"].items():
        lines.append(f"- {k}: **{'PASS' if v else 'FAIL'}**")
    return "\n".join(lines) + "\n"


def plot(r: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(r["conditions"])
    accs = [100 * r["conditions"][c]["acc"] for c in names]
    err = [[100 * (r["conditions"][c]["acc"] - r["conditions"][c]["ci95"][0]) for c in names],
           [100 * (r["conditions"][c]["ci95"][1] - r["conditions"][c]["acc"]) for c in names]]
    fig, ax = plt.subplots(figsize=(7, 3.8))
    ax.bar(names, accs, yerr=err, capsize=4)
    ax.set_ylabel("exact match (%)")
    ax.set_ylim(0, 100)
    ax.set_title(f"Context QA, {r['doc_tokens']}-token documents, {r['model']}")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def summary(results: Path) -> int:
    """``context_qa.{json,md,png}``: every condition at every document length measured (the
    ``context_qa_<N>.json`` files in ``results``), the curves, and the task's acceptance."""
    from c2c.bench.results import write

    found = {p.stem.removeprefix("context_qa_"): p for p in results.glob("context_qa_*.json")}
    runs = {int(n): json.loads(found[n].read_text()) for n in sorted((n for n in found if n.isdigit()), key=int)}
    if not runs:
        print(f"no context_qa_<N>.json in {results}; run benchmarks/context_qa.py first", file=sys.stderr)
        return 2

    def measured(prefix: str) -> list[int]:  # the lengths with a curve on all of their questions
        return [n for n, r in runs.items() if any((c.startswith(prefix) or c == prefix) and x["n"] == r["n"]
                                                   for c, x in r["conditions"].items())]
    curves = {"slice_repair": measured("repair@"), "noise": measured("noise@"), "cross_adapter": measured("lora_coder")}
    result = {"lengths": {str(n): {k: r[k] for k in ("model", "dtype", "n", "seed", "command", "created",
                                                      "conditions")} | {"lora_training": r.get("lora_training")}
                          for n, r in runs.items()},
              "curves_at": curves,
              "acceptance": {"text_well_above_50pct": all(r["acceptance"].get("text_well_above_50pct")
                                                          for r in runs.values()),
                             **{f"{k}_curve": bool(v) for k, v in curves.items()}}}
    order = []
    for r in runs.values():
        order += [c for c in r["conditions"] if c not in order]
    lens = list(runs)
    lines = ["# Context QA: planted facts in real text, at every document length measured", "",
             f"Summary of {', '.join(f'`context_qa_{n}.md`' for n in lens)} (their commands, records and examples "
             "are there). Exact match, 95% Wilson intervals; **bold**: the interval lies above the text baseline's "
             "at that length; *(below)*: under it; otherwise the two cannot be told apart; — not measured. "
             "Conditions: `none` no document (the floor), `text` the Receiver reads the document, `full`/`slice_*` "
             "handoffs, `noise@S` the full handoff with K/V noise of S x each head's std, `repair@R` a slice that "
             "attended to another document, R of it recomputed, `lora_*` the writer role's own prefill against "
             "caches made under the coder role or the base.", "",
             "| condition | " + " | ".join(f"{n} tokens" for n in lens) + " |", "|---|" + "---:|" * len(lens)]
    for c in order:
        cells = []
        for n in lens:
            x = runs[n]["conditions"].get(c)
            if x is None:
                cells.append("—")
                continue
            acc = f"{100 * x['acc']:.1f}"
            acc = f"**{acc}**" if x.get("above_text") else (f"{acc} *(below)*" if x.get("below_text") else acc)
            part = "" if x["n"] == runs[n]["n"] else f", {x['n']} of {runs[n]['n']}"
            cells.append(f"{acc} ({100 * x['ci95'][0]:.0f}–{100 * x['ci95'][1]:.0f}{part})")
        lines.append(f"| {c} | " + " | ".join(cells) + " |")
    lines += ["", "Curves measured at: " + "; ".join(f"{k.replace('_', ' ')} {', '.join(map(str, v)) or 'none'}"
                                                  for k, v in curves.items()) + " tokens.", "", "## Acceptance", ""]
    lines += [f"- {k}: **{'PASS' if v else 'FAIL'}**" for k, v in result["acceptance"].items()]
    return write(results / "context_qa", result, "\n".join(lines) + "\n", plot=lambda path: summary_plot(runs, path))


def summary_plot(runs: dict[int, dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import NullFormatter

    roles = [c for c in ("none", "text", "full", "slice_positions", "lora_own", "lora_coder", "lora_base")
             if any(c in r["conditions"] for r in runs.values())]
    fig, axes = plt.subplots(1, 3, figsize=(13, 3.8), sharey=True)
    for n, r in runs.items():
        conds = r["conditions"]
        text = conds.get("text")
        for ax, prefix, label in ((axes[0], "noise@", "noise sigma (x head std)"),
                                  (axes[1], "repair@", "slice repair ratio r")):
            pts = sorted((_family_value(c), x) for c, x in conds.items() if c.startswith(prefix)
                         and _family_value(c) is not None and x["n"] == r["n"])
            if pts:
                xs = [p for p, _ in pts]
                ax.errorbar(xs, [100 * x["acc"] for _, x in pts], marker="o", capsize=3, label=f"{n} tokens",
                            yerr=[[100 * (x["acc"] - x["ci95"][0]) for _, x in pts],
                                  [100 * (x["ci95"][1] - x["acc"]) for _, x in pts]])
                if text:
                    ax.axhline(100 * text["acc"], ls="--", lw=1, color=ax.lines[-1].get_color(),
                               label=f"text, {n} tokens")
            ax.set_xlabel(label)
        off = 0.8 / len(runs) * (list(runs).index(n) - (len(runs) - 1) / 2)
        axes[2].bar([i + off for i in range(len(roles))],
                    [100 * conds[c]["acc"] if c in conds else float("nan") for c in roles], width=0.8 / len(runs),
                    label=f"{n} tokens")
    axes[2].set_xticks(range(len(roles)), roles, rotation=30, ha="right")
    axes[0].set_xscale("log")
    sigmas = sorted({_family_value(c) for r in runs.values() for c in r["conditions"] if c.startswith("noise@")}
                    - {None})
    axes[0].xaxis.set_minor_formatter(NullFormatter())
    if sigmas:
        axes[0].set_xticks(sigmas, [f"{s:g}" for s in sigmas])
    axes[0].set_ylabel("exact match (%)")
    axes[0].set_ylim(0, 100)
    for ax, title in zip(axes, ("K/V noise", "slice repair", "handoffs and LoRA roles")):
        ax.set_title(title)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    sys.exit(main())
