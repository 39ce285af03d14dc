"""Accuracy vs calibrated K/V noise on ARC-Challenge (dev), continuing from a noisy question cache.

    .venv/bin/python benchmarks/trust_noise.py                       # Qwen2.5-Coder-0.5B, 100 questions (~5 min)
    .venv/bin/python benchmarks/trust_noise.py --n 20 --sigmas 0,0.5  # quick look
    .venv/bin/python benchmarks/trust_noise.py --data ../shared/data/eval/arc_easy/ARC-Easy-Dev.jsonl \
        --out benchmarks/results/trust_noise_arc_easy     # an easier split, where the clean model is well above chance

Outputs benchmarks/results/trust_noise.{json,md,png} (or --out PREFIX).

For each question the system prompt and the user turn (question and lettered
choices) are prefilled into a cache; :func:`c2c.trust.noise.add_noise` adds
Gaussian noise of std ``sigma x`` each head's own std to every K and V; then
the choices are scored *from the noisy cache* by :func:`c2c.mc.score_options`, as
continuations of the assistant's opening ``"Answer:"``: their labels (``--scoring
label``: summed log-likelihood of ``" A"``, as lm-eval scores letters) or their texts
(``--scoring text``: log-likelihood per character, lm-eval's ``acc_norm``; 4-5x slower).
The data is read from
``../shared/data/eval/arc_challenge`` (``--data``); nothing is copied.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch
from tqdm import tqdm

from c2c.bench import results
from c2c.bench.stats import wilson
from c2c.config import data_dir
from c2c.mc import OptionScores, score_options
from c2c.runtime import zoo
from c2c.trust.noise import NoiseConfig, add_noise

RESULTS = Path(__file__).resolve().parent / "results"
DATA = data_dir() / "eval" / "arc_challenge" / "ARC-Challenge-Dev.jsonl"
SYSTEM = "You are a careful science tutor. Answer multiple-choice questions with the label of the correct choice."


def load_questions(path: Path, n: int) -> list[dict]:
    out = []
    with open(path) as f:
        for line in f:
            d = json.loads(line)
            choices = d["question"]["choices"]
            labels = [c["label"] for c in choices]
            if d["answerKey"] not in labels:
                continue
            out.append({"id": d["id"], "stem": d["question"]["stem"], "labels": labels,
                        "texts": [c["text"] for c in choices], "answer": labels.index(d["answerKey"])})
            if len(out) == n:
                break
    return out


def prompt_ids(rt, q: dict) -> list[int]:
    body = q["stem"] + "\n" + "\n".join(f"{lab}. {t}" for lab, t in zip(q["labels"], q["texts"]))
    text = rt.render_turn("system", SYSTEM) + rt.render_turn("user", body)
    return list(rt.bos_ids) + rt.encode(text)


def score(rt, cache, q: dict, scoring: str, lead: str) -> OptionScores:
    """Each choice (its label, or its text) scored as the continuation of ``lead`` after ``cache``."""
    return score_options(rt, lead, q["labels"] if scoring == "label" else q["texts"], past=cache)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="Qwen2.5-Coder-0.5B-Instruct", help="zoo model")
    ap.add_argument("--data", type=Path, default=DATA, help="ARC-Challenge dev JSONL (read in place)")
    ap.add_argument("--n", type=int, default=100, help="questions (the first N of the dev split)")
    ap.add_argument("--sigmas", default="0,0.05,0.1,0.2,0.5,1.0", help="noise levels, fractions of per-head std")
    ap.add_argument("--scoring", choices=["label", "text"], default="label", help="score choice labels or texts")
    ap.add_argument("--threads", type=int, default=1,
                    help="torch CPU threads (1: the 2-core machine is shared, and 2 OpenMP threads spin under load)")
    ap.add_argument("--out", default=str(RESULTS / "trust_noise"), help="output path prefix")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    sigmas = [float(s) for s in args.sigmas.split(",")]
    rt = zoo.load(args.model)
    qs = load_questions(args.data, args.n)
    lead = rt.generation_prompt() + "Answer:"
    metric = "acc" if args.scoring == "label" else "norm"
    per = {s: {"correct": 0, "gold_logprob": 0.0, "same_as_clean": 0} for s in sigmas}
    t0 = time.perf_counter()
    for i, q in enumerate(tqdm(qs, desc="questions", file=sys.stderr)):
        _, cache = rt.prefill(prompt_ids(rt, q))
        clean_pick = None
        for s in sigmas:
            noisy = add_noise(cache, NoiseConfig(sigma=s, seed=i))
            sc = score(rt, noisy, q, args.scoring, lead)
            pick = sc.choice(metric)
            norm = sc.distribution(metric)                                    # (n_choices,) over the choices
            per[s]["correct"] += int(pick == q["answer"])
            per[s]["gold_logprob"] += float(norm[q["answer"]])
            if clean_pick is None:
                clean_pick = pick
            per[s]["same_as_clean"] += int(pick == clean_pick)
    n = len(qs)
    rows = []
    for s in sigmas:
        k = per[s]["correct"]
        lo, hi = wilson(k, n)
        rows.append({"sigma": s, "accuracy": k / n, "ci95": [lo, hi], "correct": k, "n": n,
                     "mean_gold_logprob": per[s]["gold_logprob"] / n,
                     "agreement_with_sigma0": per[s]["same_as_clean"] / n})
    chance = sum(1 / len(q["labels"]) for q in qs) / n
    cmd = ("python benchmarks/trust_noise.py " + " ".join(sys.argv[1:])).strip()
    result = {"command": cmd, "model": rt.name, "data": str(args.data), "questions": n, "scoring": args.scoring, "threads": args.threads,
              "chance": chance, "seconds": time.perf_counter() - t0, "rows": rows}
    return results.write(args.out, result, table(result), plot=lambda path: plot(result, path))


def table(r: dict) -> str:
    lines = [f"# Accuracy vs K/V noise: {r['model']}, {Path(r['data']).stem} (first {r['questions']}), "
             f"{r['scoring']} scoring",
             "", f"Command: `{r['command']}`", "",
             f"Noise std = sigma x each head's own std, on every K and V of the question cache. "
             f"Chance = {r['chance']:.3f}. {r['seconds']:.0f} s in all.", "",
             "| sigma | accuracy | 95% CI | mean log p(gold) over choices | same pick as sigma=0 |",
             "|---:|---:|---|---:|---:|"]
    lines += [f"| {x['sigma']:g} | {x['accuracy']:.3f} ({x['correct']}/{x['n']}) | "
              f"[{x['ci95'][0]:.3f}, {x['ci95'][1]:.3f}] | {x['mean_gold_logprob']:.3f} | "
              f"{x['agreement_with_sigma0']:.3f} |" for x in r["rows"]]
    clean = r["rows"][0]
    if clean["sigma"] == 0 and clean["ci95"][0] <= r["chance"] + 0.05:
        lines += ["", f"NOTE: the clean model is close to chance here ({clean['accuracy']:.2f} vs {r['chance']:.2f}), "
                  "so accuracy cannot resolve the effect of noise; the last two columns can: how much the "
                  "gold answer's log-likelihood drops, and how often the noisy cache changes the model's pick."]
    return "\n".join(lines) + "\n"


def plot(r: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    xs = [x["sigma"] for x in r["rows"]]
    fig, ax = plt.subplots(figsize=(6, 4))
    ax.errorbar(xs, [x["accuracy"] for x in r["rows"]],
                yerr=[[x["accuracy"] - x["ci95"][0] for x in r["rows"]], [x["ci95"][1] - x["accuracy"] for x in r["rows"]]],
                marker="o", capsize=3, label="accuracy (95% CI)")
    ax.plot(xs, [x["agreement_with_sigma0"] for x in r["rows"]], marker="s", ls="--", label="same pick as sigma=0")
    ax.axhline(r["chance"], color="grey", ls=":", label="chance")
    ax.set_xscale("symlog", linthresh=0.05)
    ax.set_xlabel("noise sigma (fraction of per-head std)")
    ax.set_ylim(0, 1)
    ax.set_title(f"{r['model']}, {Path(r['data']).stem}, n={r['questions']}", fontsize=9)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


if __name__ == "__main__":
    sys.exit(main())
