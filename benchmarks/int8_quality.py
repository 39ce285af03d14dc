"""What the int8 dtype costs in answers: teacher-forced top-1 agreement with bf16 on the training corpora's prompts.

    .venv/bin/python benchmarks/int8_quality.py                        # Qwen2.5-Coder-0.5B, 200 prompts, 32 tokens

For each of ``--prompts`` distinct instructions of the training corpora (``$C2C_DATA/train``,
alpaca and dolly as :mod:`c2c.xmodel.streams` reads them; never an evaluation split), asked
as a chat with a system message:

- the bf16 runtime (the baseline a user would otherwise run: ``--dtype bfloat16``) answers
  greedily, ``--answer-tokens`` tokens, the end of turn allowed;
- the int8 runtime (``--dtype int8``) is teacher-forced along that answer: its prefill of the
  prompt, then one decode step per answer token (the int8 weights), and at each position its
  argmax is compared with bf16's greedy token.

Agreement is the share of answer positions that agree, pooled, with a 95% bootstrap interval
over prompts (positions of one prompt are not independent); ``exact`` is the share of prompts
whose whole answer int8 would have decoded identically. One record per prompt in ``OUT.jsonl``.
Outputs benchmarks/results/int8_quality.{json,md,jsonl} (or ``--out PREFIX``), with the machine.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"
SYSTEM = "You are a helpful assistant."
MAX_INSTRUCTION_CHARS = 1500


def paired_context_qa(bf16: Path, int8: Path) -> dict:
    """Per-question correctness of two context-QA runs (condition ``text``) paired by question id."""
    from c2c.bench.stats import bootstrap_mean

    def read(path: Path) -> dict[str, bool]:
        rows = (json.loads(line) for line in path.read_text().splitlines() if line.strip())
        return {r["id"]: bool(r["correct"]) for r in rows if r["condition"] == "text"}

    a, b = read(bf16), read(int8)
    ids = sorted(set(a) & set(b))
    if not ids:
        raise SystemExit(f"{bf16} and {int8} share no question of condition text")
    diffs = [int(b[i]) - int(a[i]) for i in ids]
    lo, hi = bootstrap_mean(diffs)
    return {"n": len(ids), "bf16": sum(a[i] for i in ids) / len(ids), "int8": sum(b[i] for i in ids) / len(ids),
            "difference": sum(diffs) / len(ids), "ci95": [lo, hi], "discordant": sum(d != 0 for d in diffs),
            "files": [bf16.name, int8.name]}


def ratio_interval(hits: list[int], totals: list[int], reps: int = 2000, seed: int = 0) -> tuple[float, float]:
    """95% percentile bootstrap interval of ``sum(hits) / sum(totals)``, resampling prompts."""
    import numpy as np

    h, t = np.asarray(hits, dtype=np.float64), np.asarray(totals, dtype=np.float64)
    idx = np.random.default_rng(seed).integers(0, len(h), size=(reps, len(h)))
    shares = h[idx].sum(1) / np.maximum(t[idx].sum(1), 1)
    return float(np.percentile(shares, 2.5)), float(np.percentile(shares, 97.5))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="Qwen2.5-Coder-0.5B-Instruct")
    ap.add_argument("--prompts", type=int, default=200)
    ap.add_argument("--answer-tokens", type=int, default=32)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", default=str(RESULTS / "int8_quality"))
    ap.add_argument("--context-qa", nargs=2, metavar=("BF16_JSONL", "INT8_JSONL"),
                    help="also pair two benchmarks/context_qa.py runs' records (the same questions, --dtype "
                         "bfloat16 and --dtype int8, condition text) into the result: accuracy of each and the "
                         "paired difference with its 95%% interval")
    ap.add_argument("--report-only", action="store_true",
                    help="write the report from OUT.jsonl's records (and --context-qa), loading no model")
    args = ap.parse_args()

    from c2c.bench import results

    if args.report_only:
        prev = json.loads(Path(args.out).with_suffix(".json").read_text())
        records = [json.loads(line) for line in Path(args.out).with_suffix(".jsonl").read_text().splitlines()
                   if line.strip()]
        meta = {k: prev[k] for k in ("model", "answer_tokens", "seed", "threads", "baseline", "int8", "seconds",
                                     "machine", "command", "created")}
        return report(records, meta, args, results)
    records, meta = measure(args)
    return report(records, meta, args, results)


def measure(args) -> tuple[list[dict], dict]:
    """One record per prompt, and what the report says of the run."""
    import torch
    from tqdm import tqdm

    from c2c.bench import results
    from c2c.runtime import zoo

    torch.set_num_threads(args.threads)
    full = zoo.load(args.model, dtype="bfloat16")
    q = zoo.load(args.model, dtype="int8")
    from c2c.xmodel.streams import instructions  # lazy: reads $C2C_DATA/train; too few is a ConfigError

    prompts = instructions(args.prompts, seed=args.seed, max_chars=MAX_INSTRUCTION_CHARS)
    records, t0 = [], time.perf_counter()
    with torch.inference_mode():
        for i, text in enumerate(tqdm(prompts, desc="prompts", file=sys.stderr)):
            chat = full.render_chat([{"role": "system", "content": SYSTEM}, {"role": "user", "content": text}],
                                    add_generation_prompt=True)
            ids = full.encode(chat)
            answer = list(full.generate(ids, max_new_tokens=args.answer_tokens).token_ids)
            logits, cache = q.prefill(ids)
            pred = [int(torch.argmax(logits))]
            for tok in answer[:-1]:
                logits, cache = q.prefill([tok], cache)                  # one-token step: the int8 weights
                pred.append(int(torch.argmax(logits)))
            agree = [int(a == b) for a, b in zip(pred, answer)]
            records.append({"i": i, "prompt_tokens": len(ids), "answer_tokens": len(answer),
                            "agree": sum(agree), "positions": len(agree), "exact": all(agree),
                            "first_disagreement": agree.index(0) if 0 in agree else None})
    return records, {"model": args.model, "answer_tokens": args.answer_tokens, "seed": args.seed,
                     "threads": args.threads, "baseline": str(full.engine_id), "int8": str(q.engine_id),
                     "seconds": time.perf_counter() - t0, "machine": results.machine(),
                     "command": "python benchmarks/int8_quality.py " + " ".join(sys.argv[1:]),
                     "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}


def report(records: list[dict], meta: dict, args, results) -> int:
    pooled = sum(r["agree"] for r in records) / max(1, sum(r["positions"] for r in records))
    weights = [r["positions"] for r in records]
    lo, hi = ratio_interval([r["agree"] for r in records], weights)
    exact = sum(r["exact"] for r in records)
    out = {**meta, "prompts": len(records), "agreement": pooled, "agreement_ci95": [lo, hi],
           "exact_answers": exact, "exact_share": exact / len(records), "positions": sum(weights),
           "acceptance": {"top1_agreement_ge_97pct": pooled >= 0.97}}
    qa_lines: list[str] = []
    if args.context_qa:
        out["context_qa"] = paired_context_qa(*map(Path, args.context_qa))
        c = out["context_qa"]
        out["acceptance"]["context_qa_within_2_points"] = abs(c["difference"]) <= 0.02
        qa_lines = ["## Context QA (benchmarks/context_qa.py, condition text, the same questions)", "",
                    "| | accuracy | 95% interval |", "|---|---:|---:|",
                    f"| bf16 | {100 * c['bf16']:.1f}% | |", f"| int8 | {100 * c['int8']:.1f}% | |",
                    f"| int8 − bf16 (paired, {c['n']} questions) | {100 * c['difference']:+.1f} points | "
                    f"{100 * c['ci95'][0]:+.1f} to {100 * c['ci95'][1]:+.1f} |",
                    f"| questions answered differently | {c['discordant']} | |", ""]
    m = out["machine"]
    md = "\n".join([
        "# int8 decode against bf16: teacher-forced top-1 agreement", "",
        f"`{out['command']}` — {out['created']}; {m.get('cpu')} ({m.get('cores')} cores; "
        f"{', '.join(m.get('bf16_flags') or []) or 'no bf16 flags'}), {out['threads']} threads.", "",
        f"{len(records)} distinct instructions of the training corpora, chat-rendered; bf16 answers greedily "
        f"({out['answer_tokens']} tokens at most); int8 is teacher-forced along each answer.", "",
        "| | value | 95% interval |", "|---|---:|---:|",
        f"| top-1 agreement (pooled over {out['positions']} positions) | **{100 * pooled:.2f}%** | "
        f"{100 * lo:.2f}–{100 * hi:.2f}% (bootstrap over prompts) |",
        f"| answers int8 decodes identically | {exact} of {len(records)} ({100 * exact / len(records):.0f}%) | |", "",
        f"Baseline `{out['baseline']}`; int8 `{out['int8']}`.", "", *qa_lines,
        "Acceptance: " + ", ".join(f"{k} {'yes' if v else 'NO'}" for k, v in out["acceptance"].items()), ""])
    return results.write(args.out, out, md, records=records)


if __name__ == "__main__":
    sys.exit(main())
