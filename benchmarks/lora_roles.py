"""LoRA roles on one base: how far a cache made under one role drifts under another, and what it does to answers.

    .venv/bin/python benchmarks/lora_roles.py --limit 50

1. Trains two small role adapters on Qwen2.5-Coder-0.5B-Instruct (once; reused from
   C2C_HOME/adapters): `coder` on Alpaca demo instructions, `writer` on LIMA
   answers (../shared/data/train; never on a reported split).
2. Divergence: caches of ARC-Challenge questions made under base / coder / writer,
   re-computed under each role at sampled positions (largest relative K/V error).
3. Answers: the `writer` role scores ARC-Challenge options (log-likelihood) from its
   own prefill, from a cache made under `coder`, and from one made under the base.

Writes benchmarks/results/lora_roles.{json,md}.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from pathlib import Path

import torch
from slice_repair import load_arc, option_logprobs, render  # noqa: E402
from tqdm import tqdm

from c2c.bench import results
from c2c.config import c2c_home, data_dir
from c2c.runtime import adapters, zoo
from c2c.team.roles import divergence

RESULTS = Path(__file__).resolve().parent / "results"
ROLES = ("base", "coder", "writer")


def training_texts() -> dict[str, list[str]]:
    alpaca = json.loads((data_dir() / "train" / "alpaca_en_demo.json").read_text())
    lima = json.loads((data_dir() / "train" / "lima.json").read_text())
    return {
        "coder": [f"{r['instruction']}\n{r['input']}\n{r['output']}".strip() for r in alpaca[:200]],
        "writer": [r["output"] for r in lima[:200] if r.get("output")],
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="Qwen2.5-Coder-0.5B-Instruct", help="base model")
    ap.add_argument("--steps", type=int, default=40, help="training steps per adapter")
    ap.add_argument("--limit", type=int, default=50, help="ARC-Challenge questions for the answer test")
    ap.add_argument("--samples", type=int, default=16, help="sampled positions per divergence probe")
    ap.add_argument("--out", default=str(RESULTS / "lora_roles"), help="output prefix")
    args = ap.parse_args()
    rt = zoo.load(args.model)
    root = c2c_home() / "adapters"
    texts = training_texts()
    curves = {}
    for role in ("coder", "writer"):
        path = root / f"{rt.name}-{role}"
        if not (path / "adapter_model.safetensors").is_file():
            curves[role] = adapters.train(rt, texts[role], path, steps=args.steps, seed={"coder": 1, "writer": 2}[role])
        else:
            curves[role] = json.loads((path / "c2c-training.json").read_text())
        curves[role] = {k: v for k, v in curves[role].items() if k != "losses"}
    qs = load_arc(data_dir() / "eval" / "arc_challenge" / "ARC-Challenge-Dev.jsonl", args.limit, seed=1)

    def use(role: str) -> None:
        if role == "base":
            adapters.detach(rt)
        else:
            adapters.attach(rt, root / f"{rt.name}-{role}", role)

    roles = ROLES
    # --- divergence matrix -------------------------------------------------
    rng = random.Random(0)
    div = {f"{a}->{b}": [] for a in roles for b in roles}
    for q in tqdm(qs[:10], desc="divergence", file=sys.stderr):
        stem, _, _ = render(q)
        ids = rt.encode(rt.render_turn("user", stem))
        for a in roles:
            use(a)
            _, cache = rt.prefill(ids)
            for b in roles:
                use(b)
                div[f"{a}->{b}"].append(divergence(rt, cache, args.samples, rng))
    div_mean = {k: sum(v) / len(v) for k, v in div.items()}
    # --- answers -----------------------------------------------------------
    conds = {"writer's own prefill": "writer", "cache made under coder": "coder", "cache made under base": "base"}
    stats = {c: {"correct": 0, "agree": 0, "kl": 0.0} for c in conds}
    for q in tqdm(qs, desc="answers", file=sys.stderr):
        stem, labels, gold = render(q)
        ids = rt.encode(rt.render_turn("user", stem))
        caches = {}
        for role in ("writer", "coder", "base"):
            use(role)
            caches[role] = rt.prefill(ids)[1]
        use("writer")
        ref = option_logprobs(rt, caches["writer"], labels)
        for c, role in conds.items():
            lp = option_logprobs(rt, caches[role], labels)
            s = stats[c]
            s["correct"] += labels[int(lp.argmax())] == gold
            s["agree"] += int(lp.argmax()) == int(ref.argmax())
            s["kl"] += float((ref.exp() * (ref - lp)).sum())
    adapters.detach(rt)
    n = len(qs)
    rows = [{"condition": c, "accuracy": s["correct"] / n, "agreement_with_own": s["agree"] / n,
             "mean_kl_from_own": s["kl"] / n} for c, s in stats.items()]
    cmd = ("python benchmarks/lora_roles.py " + " ".join(sys.argv[1:])).strip()
    result = {"command": cmd, "model": rt.name, "n": n, "training": curves, "divergence": div_mean, "answers": rows}
    return results.write(args.out, result, markdown(result))


def markdown(r: dict) -> str:
    div, roles = r["divergence"], ROLES
    md = [f"# LoRA roles on {r['model']}\n", f"Produced by `{r['command']}`.\n",
          "Training (next-token loss, first vs last quarter of steps): " + ", ".join(
              f"{role}: {c['first_loss']:.2f} → {c['last_loss']:.2f} in {c['steps']} steps"
              for role, c in r["training"].items()),
          "\n## Divergence (largest relative K/V error at sampled positions; rows: made under, cols: used under)\n",
          "| made \\ used | " + " | ".join(roles) + " |", "|---|" + "---:|" * len(roles)]
    md += [f"| {a} | " + " | ".join(f"{div[f'{a}->{b}']:.4f}" for b in roles) + " |" for a in roles]
    md += [f"\n## Answers of the writer role, ARC-Challenge dev (n={r['n']})\n",
           "| cache | accuracy | agreement with own prefill | mean KL(own‖cache) |", "|---|---:|---:|---:|"]
    md += [f"| {x['condition']} | {x['accuracy']:.3f} | {x['agreement_with_own']:.3f} | {x['mean_kl_from_own']:.4f} |"
           for x in r["answers"]]
    return "\n".join(md) + "\n"


if __name__ == "__main__":
    torch.manual_seed(0)
    raise SystemExit(main())
