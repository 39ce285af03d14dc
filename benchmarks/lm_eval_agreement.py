"""Does c2c's option scoring agree with lm-evaluation-harness? The Receiver alone, the same questions.

    .venv/bin/python benchmarks/lm_eval_agreement.py --lm-eval-python /path/to/venv-with-lm-eval/bin/python

lm-eval (``pip install lm-eval`` in any venv with the same torch and transformers)
runs as a separate process on a local task file written here (no dataset hub):
the same 200 questions of ARC-Challenge dev (seed 0, the fuser report's subset)
and the same local model directory. c2c scores them with :func:`c2c.mc.score_options`.
Outputs benchmarks/results/lm_eval_agreement.{json,md} and per-question records
(``lm_eval_agreement.jsonl``).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
from tqdm import tqdm

from c2c.bench import results
from c2c.bench.stats import bootstrap_mean
from c2c.config import data_dir
from c2c.fuser.data import load_questions, subset
from c2c.mc import lm_eval_context, score_options
from c2c.runtime import zoo

RESULTS = Path(__file__).resolve().parent / "results"
TASK = """task: c2c_agreement
dataset_path: json
dataset_kwargs:
  data_files:
    test: {data}
test_split: test
output_type: multiple_choice
doc_to_text: "Question: {{{{question}}}}\\nAnswer:"
doc_to_target: "{{{{choices.label.index(answerKey)}}}}"
doc_to_choice: "{{{{choices.text}}}}"
metric_list:
  - metric: acc
    aggregation: mean
    higher_is_better: true
  - metric: acc_norm
    aggregation: mean
    higher_is_better: true
"""


def run_lm_eval(python: str, model_dir: Path, questions, work: Path, threads: int) -> dict[str, dict]:
    """Per question id: lm-eval's option log-likelihoods and its acc / acc_norm for it."""
    data = work / "questions.jsonl"
    with open(data, "w") as f:
        for q in questions:
            f.write(json.dumps({"id": q.id, "question": q.question, "answerKey": q.answer,
                                "choices": {"text": [t for _, t in q.options], "label": [lab for lab, _ in q.options]}})
                    + "\n")
    (work / "tasks").mkdir(exist_ok=True)
    (work / "tasks" / "c2c_agreement.yaml").write_text(TASK.format(data=data))
    env = dict(os.environ, HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", OMP_NUM_THREADS=str(threads))
    cmd = [python, "-m", "lm_eval", "--model", "hf", "--model_args", f"pretrained={model_dir},dtype=float32",
           "--tasks", "c2c_agreement", "--include_path", str(work / "tasks"), "--device", "cpu",
           "--batch_size", "1", "--log_samples", "--output_path", str(work / "out")]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if proc.returncode != 0:
        raise SystemExit(f"lm-eval failed:\n{proc.stderr[-3000:]}")
    samples = next((work / "out").rglob("samples_c2c_agreement*.jsonl"))
    out = {}
    for line in samples.read_text().splitlines():
        s = json.loads(line)
        ll = [float(r[0]) for r in s["filtered_resps"]]
        out[s["doc"]["id"]] = {"loglik": ll, "acc": s["acc"], "acc_norm": s["acc_norm"]}
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--lm-eval-python", required=True, help="python of a venv that has lm-eval installed")
    ap.add_argument("--model", default="Qwen2.5-Coder-0.5B-Instruct", help="zoo model (the Receiver)")
    ap.add_argument("--data", default=None, help="ARC-style jsonl (default: ARC-Challenge dev in C2C_DATA)")
    ap.add_argument("--limit", type=int, default=200, help="questions (a seeded random subset)")
    ap.add_argument("--seed", type=int, default=0, help="subset seed (the fuser report uses 0)")
    ap.add_argument("--threads", type=int, default=1, help="torch threads for both scorers")
    ap.add_argument("--out", default=str(RESULTS / "lm_eval_agreement"), help="output path prefix")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    path = Path(args.data) if args.data else data_dir() / "eval" / "arc_challenge" / "ARC-Challenge-Dev.jsonl"
    qs = subset(load_questions(path), args.limit, args.seed)
    rt = zoo.load(args.model)
    t0 = time.perf_counter()
    ours = {}
    for q in tqdm(qs, desc="c2c", unit="q"):
        sc = score_options(rt, lm_eval_context(q.question), [t for _, t in q.options])
        gold = q.labels.index(q.answer)
        ours[q.id] = {"loglik": list(sc.loglik), "acc": float(sc.acc_choice == gold),
                      "acc_norm": float(sc.norm_choice == gold)}
    ours_s = time.perf_counter() - t0
    with tempfile.TemporaryDirectory(prefix="c2c-lm-eval-") as work:
        t0 = time.perf_counter()
        theirs = run_lm_eval(args.lm_eval_python, zoo.model_path(args.model), qs, Path(work), args.threads)
        theirs_s = time.perf_counter() - t0
    records, max_dll = [], 0.0
    for q in qs:
        a, b = ours[q.id], theirs[q.id]
        d = max(abs(x - y) for x, y in zip(a["loglik"], b["loglik"]))
        max_dll = max(max_dll, d)
        records.append({"id": q.id, "answer": q.answer, "c2c": a, "lm_eval": b, "max_abs_loglik_diff": d})
    summary = {}
    for m in ("acc", "acc_norm"):
        mine, base = [r["c2c"][m] for r in records], [r["lm_eval"][m] for r in records]
        summary[m] = {"c2c": 100 * sum(mine) / len(mine), "c2c_ci": [100 * x for x in bootstrap_mean(mine)],
                      "lm_eval": 100 * sum(base) / len(base), "lm_eval_ci": [100 * x for x in bootstrap_mean(base)],
                      "same_verdict": sum(x == y for x, y in zip(mine, base))}
    result = {"command": "python benchmarks/lm_eval_agreement.py --lm-eval-python PYTHON", "model": args.model,
              "data": str(path.relative_to(data_dir())) if path.is_relative_to(data_dir()) else path.name,
              "n": len(qs), "seed": args.seed, "summary": summary, "max_abs_loglik_diff": max_dll,
              "seconds": {"c2c": ours_s, "lm_eval": theirs_s},
              "acceptance": {"acc within 2 points of lm-eval": abs(summary["acc"]["c2c"] - summary["acc"]["lm_eval"]) <= 2,
                             "acc_norm within 2 points": abs(summary["acc_norm"]["c2c"] - summary["acc_norm"]["lm_eval"]) <= 2}}
    return results.write(args.out, result, table(result), records=records)


def table(r: dict) -> str:
    s = r["summary"]
    lines = ["# Option scoring: c2c against lm-evaluation-harness", "", f"Command: `{r['command']}`", "",
             f"{r['model']} alone, {r['n']} questions of `{r['data']}` (seed {r['seed']}), fp32 CPU. Both score "
             "each option as the continuation of `Question: ...\\nAnswer:`; intervals are 95% bootstrap.", "",
             "| metric | c2c | lm-eval | same verdict per question |", "|---|---:|---:|---:|"]
    for m in ("acc", "acc_norm"):
        x = s[m]
        lines.append(f"| {m} | {x['c2c']:.1f} ({x['c2c_ci'][0]:.1f}-{x['c2c_ci'][1]:.1f}) | {x['lm_eval']:.1f} "
                     f"({x['lm_eval_ci'][0]:.1f}-{x['lm_eval_ci'][1]:.1f}) | {x['same_verdict']} / {r['n']} |")
    lines += ["", f"Largest difference of an option's log-likelihood between the two: {r['max_abs_loglik_diff']:.2e} nats.",
              f"Time: c2c {r['seconds']['c2c']:.0f} s, lm-eval {r['seconds']['lm_eval']:.0f} s (including its start-up).",
              "", "Acceptance: " + ", ".join(f"{k}: {'PASS' if v else 'FAIL'}" for k, v in r["acceptance"].items()), ""]
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
