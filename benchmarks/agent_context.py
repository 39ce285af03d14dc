"""Agent-managed context: what dropping old tool responses from a served cache saves, and what it costs in answers.

    .venv/bin/python benchmarks/agent_context.py                 # 16 episodes x 16 questions, the default model
    .venv/bin/python benchmarks/agent_context.py --episodes 2    # a quick look

A tool-using agent (:mod:`c2c.bench.agent_episodes`, seeded): 16 steps, each one tool
response of about 300 tokens of real prose with two planted facts. The policy
(:class:`c2c.client.context_policy.ContextWindow`, the helper clients use) keeps the last 8 tool
responses, so drops begin at step 9. Questions at steps 6, 12 and 16 ask for facts of
recent (kept) responses, and at 12 and 16 also of dropped ones. Conditions, all on the same
episodes, each step through the code ``c2c serve`` runs for a request (render, the session's
edit :func:`c2c.conversation.editing.apply`, prefix reuse :func:`c2c.conversation.reuse.prepare`, then a
one-pass prefill of what is left, the fastest text path):

- ``keep``: nothing dropped (the context grows);
- ``text_drop``: the dropped responses are deleted from the history, the server reuses its
  cache up to the first deleted message and re-prefills the rest: exact;
- ``cache_drop_gaps``: dropped from the cache, the positions left open;
- ``cache_drop``: dropped from the cache and re-positioned;
- ``repair_first16`` / ``repair_ratio20``: ``cache_drop`` with repair ``first:16`` / ``ratio:0.2``.

Per step: time to first token (the edit, the reuse and the prefill until the first token's
logits), tokens prefilled, tokens recomputed, and the session's K/V bytes. Per question: the
reply, scored by whether it holds the answer (SQuAD normalization, whole words:
:func:`c2c.bench.context_qa.contains_answer`; the model often answers in a sentence) and,
recorded too, by exact match. Accuracy
has 95% Wilson intervals; the difference against ``text_drop`` on the same questions is paired,
with a 95% interval from a bootstrap over episodes (questions of one episode share a context).

Outputs benchmarks/results/agent_context.{json,md,jsonl,png} (the jsonl: one record per question and
condition); the machine is recorded. Per-episode records (steps and answers) go to
agent_context.episodes.jsonl as they are made, and the same command resumes.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"
CONDITIONS = {  # name -> the edit each request sends (None: no edit)
    "keep": None,
    "text_drop": None,
    "cache_drop_gaps": {"reposition": False, "repair": "none"},
    "cache_drop": {"reposition": True, "repair": "none"},
    "repair_first16": {"reposition": True, "repair": "first:16"},
    "repair_ratio20": {"reposition": True, "repair": "ratio:0.2"},
}


def run_episode(rt, ep, condition: str, *, keep: int, max_new_tokens: int) -> dict:
    """One episode under one condition: per-step costs and per-question answers."""
    from c2c.bench.agent_episodes import ask
    from c2c.bench.context_qa import contains_answer, exact_match
    from c2c.client.context_policy import ContextPolicy, ContextWindow
    from c2c.conversation import editing as context_edit
    from c2c.conversation.editing import EditSpec
    from c2c.conversation.render import Message, render
    from c2c.conversation.reuse import prepare

    window = ContextWindow(ContextPolicy(keep_tool_responses=keep))
    cache, held, dropped = None, (), frozenset()
    steps, answers = [], []
    for k in range(1, len(ep.calls) + 1):
        full = [Message(role=m["role"], content=m["content"]) for m in ep.messages(k)]
        instr = window.edit([m.to_dict() for m in full])
        drop = tuple(instr["drop"]) if instr else ()
        t0 = time.perf_counter()
        recomputed = repositioned = 0
        if condition == "keep":
            msgs, held_cache, kept_index = full, cache, tuple(range(len(full)))
        elif condition == "text_drop":
            kept_index = tuple(i for i in range(len(full)) if i not in set(drop))
            msgs, held_cache = [full[i] for i in kept_index], cache
        else:
            spec = EditSpec(drop=drop, **CONDITIONS[condition])
            edited = context_edit.apply(rt, cache, full, spec, dropped_before=dropped, held=held)
            msgs, held_cache, kept_index = list(edited.kept), edited.cache, edited.kept_index
            if edited.step is not None:
                recomputed, repositioned = edited.step.recomputed, edited.step.repositioned
            repositioned += edited.closed
        rendering = render(rt, msgs)
        prepared = prepare(rt, held_cache, rendering)
        _, cache = rt.prefill(list(prepared.pending), prepared.cache)
        ttft = time.perf_counter() - t0
        held = context_edit.held_messages(rendering, kept_index, 0)
        dropped = frozenset(drop)
        steps.append({"step": k, "ttft_s": ttft, "prefilled": prepared.prefilled + len(prepared.pending),
                      "reused": prepared.reused, "recomputed": recomputed, "repositioned": repositioned,
                      "prompt_tokens": len(rendering), "positions": cache.end, "kv_bytes": cache.nbytes,
                      "dropped_messages": len(drop)})
        for q in (q for q in ep.questions if q.step == k):
            qr = render(rt, msgs + [Message(role="user", content=ask(q.question))])
            p = prepare(rt, cache, qr)
            gen = rt.generate(list(p.pending), p.cache, max_new_tokens=max_new_tokens)
            answers.append({"id": q.id, "episode": ep.id, "condition": condition, "step": q.step, "kind": q.kind,
                            "source": q.source, "answer": q.answer, "reply": gen.text,
                            "correct": contains_answer(gen.text, q.answer),
                            "exact": exact_match(gen.text, q.answer)})
    return {"episode": ep.id, "condition": condition, "steps": steps, "answers": answers}


def paired_interval(diffs_by_episode: dict[str, list[float]], reps: int = 4000, seed: int = 0) -> tuple[float, float]:
    """95% interval of the mean paired difference, resampling whole episodes."""
    import numpy as np

    eps = list(diffs_by_episode.values())
    rng = np.random.default_rng(seed)
    means = []
    for _ in range(reps):
        pick = rng.integers(0, len(eps), size=len(eps))
        vals = [d for i in pick for d in eps[i]]
        means.append(sum(vals) / len(vals))
    return float(np.quantile(means, 0.025)), float(np.quantile(means, 0.975))


def summarize(records: list[dict], conditions: list[str], keep: int) -> dict:
    """Per condition: accuracy (kept questions; kept ones asked once drops began, after step ``keep``; dropped
    ones), paired differences against text_drop, and the per-step costs."""
    from c2c.bench.stats import wilson

    by_cond = {c: [r for r in records if r["condition"] == c] for c in conditions}
    out = {}
    base = {(a["id"]): a["correct"] for r in by_cond.get("text_drop", []) for a in r["answers"]}
    for c, recs in by_cond.items():
        if not recs:
            continue
        row = {"episodes": len(recs)}
        for kind, pick in (("kept", lambda a: a["kind"] == "kept"),
                           ("kept_after_drops", lambda a: a["kind"] == "kept" and a["step"] > keep),
                           ("dropped", lambda a: a["kind"] == "dropped")):
            ans = [a for r in recs for a in r["answers"] if pick(a)]
            k = sum(a["correct"] for a in ans)
            row[kind] = {"n": len(ans), "correct": k, "acc": k / len(ans) if ans else None,
                         "ci95": wilson(k, len(ans))}
            paired: dict[str, list[float]] = {}
            for a in ans:
                if a["id"] in base:
                    paired.setdefault(a["episode"], []).append(float(a["correct"]) - float(base[a["id"]]))
            if paired and c != "text_drop":
                flat = [d for v in paired.values() for d in v]
                row[kind]["diff_vs_text_drop"] = sum(flat) / len(flat)
                row[kind]["diff_ci95"] = paired_interval(paired)
                row[kind]["discordant"] = {"better": sum(d > 0 for d in flat), "worse": sum(d < 0 for d in flat)}
        steps = {}
        for r in recs:
            for s in r["steps"]:
                steps.setdefault(s["step"], []).append(s)
        row["ttft_s_by_step"] = {k: statistics.median(x["ttft_s"] for x in v) for k, v in sorted(steps.items())}
        row["prefilled_per_episode"] = statistics.mean(sum(s["prefilled"] for s in r["steps"]) for r in recs)
        row["recomputed_per_episode"] = statistics.mean(sum(s["recomputed"] for s in r["steps"]) for r in recs)
        row["repositioned_per_episode"] = statistics.mean(sum(s["repositioned"] for s in r["steps"]) for r in recs)
        last = [r["steps"][-1] for r in recs]
        row["kv_bytes_last_step"] = statistics.mean(s["kv_bytes"] for s in last)
        row["positions_last_step"] = statistics.mean(s["positions"] for s in last)
        out[c] = row
    return out


def markdown(result: dict) -> str:
    s, m = result["summary"], result["machine"]
    n16 = max(int(k) for k in s["text_drop"]["ttft_s_by_step"])
    lines = [f"# Agent-managed context: {result['model']} ({result['dtype']}), {result['episodes']} episodes x "
             f"{result['steps']} steps, window of {result['keep']} tool responses",
             "", f"Machine: {m['cpu']}, {m['cores']} cores, bf16 flags {m['bf16_flags']}; torch threads "
             f"{result['threads']}. Command: `{result['command']}`.", "",
             "Accuracy: the reply holds the answer (normalized, whole words), with 95% Wilson intervals; `diff` is paired against text_drop on the same "
             "questions, with a 95% interval from a bootstrap over episodes; **bold**: the interval excludes 0.", "",
             f"| condition | kept acc | kept after drops | diff vs text_drop (after drops) | dropped acc | "
             f"TTFT step {n16} s | text_drop / this at step {n16} | prefilled tok / episode | recomputed | "
             "K/V MB at the end |",
             "|---|---|---|---|---|---:|---:|---:|---:|---:|"]
    t16 = s["text_drop"]["ttft_s_by_step"][n16]
    for c, r in s.items():
        def acc(x):
            return f"{x['acc']:.1%} ({x['ci95'][0]:.1%}-{x['ci95'][1]:.1%}) n={x['n']}" if x["n"] else "-"
        ka = r["kept_after_drops"]
        if "diff_vs_text_drop" in ka:
            lo, hi = ka["diff_ci95"]
            d = f"{ka['diff_vs_text_drop'] * 100:+.1f} pts ({lo * 100:+.1f}..{hi * 100:+.1f})"
            d = f"**{d}**" if lo > 0 or hi < 0 else d
        else:
            d = "-"
        tt = r["ttft_s_by_step"][n16]
        lines.append(f"| {c} | {acc(r['kept'])} | {acc(ka)} | {d} | {acc(r['dropped'])} | {tt:.3f} | "
                     f"{t16 / tt:.2f}x | {r['prefilled_per_episode']:.0f} | {r['recomputed_per_episode']:.0f} | "
                     f"{r['kv_bytes_last_step'] / 2**20:.1f} |")
    lines += ["", "Median time to first token by step (s):", "",
              "| step | " + " | ".join(s) + " |", "|---:|" + "---:|" * len(s)]
    for k in s["text_drop"]["ttft_s_by_step"]:
        lines.append(f"| {k} | " + " | ".join(f"{r['ttft_s_by_step'][k]:.3f}" for r in s.values()) + " |")
    lines += ["", "Acceptance:", ""] + [f"- {k}: {'yes' if v else 'NO'}" for k, v in result["acceptance"].items()]
    lines += ["", result["verdict"]]
    return "\n".join(lines) + "\n"


def plot(result: dict):
    def draw(path: Path) -> None:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        s = result["summary"]
        fig, (a1, a2) = plt.subplots(1, 2, figsize=(12, 4.5))
        for c, r in s.items():
            ks = [int(k) for k in r["ttft_s_by_step"]]
            a1.plot(ks, list(r["ttft_s_by_step"].values()), marker="o", ms=3, label=c)
        a1.set_xlabel("step"), a1.set_ylabel("time to first token, s (median)"), a1.set_yscale("log")
        a1.axvline(result["keep"] + 0.5, color="grey", lw=0.8, ls=":")
        a1.legend(fontsize=8), a1.set_title("time to first token per step")
        names = list(s)
        for off, kind, color in ((-0.2, "kept_after_drops", "tab:blue"), (0.2, "dropped", "tab:orange")):
            acc = [s[c][kind]["acc"] or 0 for c in names]
            lo = [a - s[c][kind]["ci95"][0] for a, c in zip(acc, names)]
            hi = [s[c][kind]["ci95"][1] - a for a, c in zip(acc, names)]
            a2.bar([i + off for i in range(len(names))], acc, 0.4, yerr=[lo, hi], capsize=3, color=color,
                   label={"kept_after_drops": "kept (steps 12, 16)", "dropped": "dropped"}[kind])
        a2.set_xticks(range(len(names)), names, rotation=25, ha="right", fontsize=8)
        a2.set_ylabel("reply holds the answer (95% CI)"), a2.legend(fontsize=8), a2.set_title("answers")
        fig.tight_layout()
        fig.savefig(path, dpi=110)
        plt.close(fig)
    return draw


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                 epilog="example: .venv/bin/python benchmarks/agent_context.py --episodes 2",
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=None, help="zoo name (default: the embedded default model)")
    ap.add_argument("--dtype", default=None, help="default: the runtime's (bf16 where the CPU has it)")
    ap.add_argument("--episodes", type=int, default=16)
    ap.add_argument("--steps", type=int, default=16)
    ap.add_argument("--keep", type=int, default=8, help="tool responses the policy keeps")
    ap.add_argument("--doc-tokens", type=int, default=300)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--max-new-tokens", type=int, default=8)
    ap.add_argument("--conditions", default=",".join(CONDITIONS))
    ap.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    ap.add_argument("--out", default=str(RESULTS / "agent_context"))
    args = ap.parse_args(argv)
    conditions = args.conditions.split(",")
    unknown = [c for c in conditions if c not in CONDITIONS]
    if unknown or "text_drop" not in conditions:
        ap.error(f"conditions are {', '.join(CONDITIONS)} (text_drop is the baseline and required); got {unknown}")

    import torch

    from c2c.bench import agent_episodes
    from c2c.bench.results import machine, write
    from c2c.runtime import zoo

    if args.threads:
        torch.set_num_threads(args.threads)
    rt = zoo.load(args.model or zoo.DEFAULT_MODEL, dtype=args.dtype)
    episodes = agent_episodes.build(rt, args.episodes, steps=args.steps, doc_tokens=args.doc_tokens,
                                    keep=args.keep, seed=args.seed)
    log = Path(args.out + ".episodes.jsonl")
    log.parent.mkdir(parents=True, exist_ok=True)  # resumable per (episode, condition); PREFIX.jsonl gets the answers
    tag = {"model": rt.name, "dtype": str(rt.dtype), "seed": args.seed, "steps": args.steps, "keep": args.keep,
           "doc_tokens": args.doc_tokens}
    done = {}
    if log.is_file():
        for line in log.read_text().splitlines():
            r = json.loads(line)
            if r.get("tag") == tag:
                done[r["episode"], r["condition"]] = r
    try:
        from tqdm import tqdm
    except ImportError:  # pragma: no cover
        tqdm = None
    todo = [(ep, c) for ep in episodes for c in conditions if (ep.id, c) not in done]
    bar = tqdm(total=len(todo), desc="episodes x conditions", file=sys.stderr) if tqdm else None
    with log.open("a") as f:
        for ep, c in todo:  # conditions interleaved per episode: the machine's drift hits all alike
            rec = {"tag": tag, **run_episode(rt, ep, c, keep=args.keep, max_new_tokens=args.max_new_tokens)}
            f.write(json.dumps(rec) + "\n")
            f.flush()
            done[ep.id, c] = rec
            if bar:
                bar.update(1)
    if bar:
        bar.close()
    records = [done[ep.id, c] for ep in episodes for c in conditions]
    summary = summarize(records, conditions, args.keep)
    last = str(args.steps) if str(args.steps) in summary["text_drop"]["ttft_s_by_step"] else args.steps
    t_text = summary["text_drop"]["ttft_s_by_step"][last]

    def holds(c: str) -> bool:
        ka = summary[c]["kept_after_drops"]
        if "diff_vs_text_drop" not in ka:
            return False
        return (abs(ka["diff_vs_text_drop"]) <= 0.03 + 1e-12 or ka["diff_vs_text_drop"] > 0) and \
            ka["diff_ci95"][0] > -0.05

    cache_ok = "cache_drop" in summary and holds("cache_drop")
    best = None
    if not cache_ok:
        for c in ("repair_first16", "repair_ratio20"):
            if c in summary and holds(c):
                best = c
                break
    ratio = t_text / summary["cache_drop"]["ttft_s_by_step"][last] if "cache_drop" in summary else 0.0
    acceptance = {
        f"cache_drop TTFT at step {args.steps} >= 5x shorter than text_drop": ratio >= 5,
        "cache_drop kept accuracy within 3 points of text_drop, paired interval above -5 points"
        + ("" if cache_ok or best is None else f" (not met; {best} meets it)"): cache_ok or best is not None,
    }
    verdict = (f"At step {args.steps}, cache_drop's time to first token is {ratio:.1f}x shorter than text_drop's. "
               + ("Its accuracy on kept facts holds within the bar." if cache_ok else
                  f"Its accuracy on kept facts does not hold the bar; {best or 'no repair level'} does."))
    result = {"model": rt.name, "dtype": str(rt.dtype).replace("torch.", ""), "episodes": len(episodes),
              "steps": args.steps, "keep": args.keep, "doc_tokens": args.doc_tokens, "seed": args.seed,
              "questions": sum(len(ep.questions) for ep in episodes), "threads": torch.get_num_threads(),
              "command": "benchmarks/agent_context.py " + " ".join(argv if argv is not None else sys.argv[1:]),
              "machine": machine(), "summary": summary, "ttft_ratio_last_step": ratio, "acceptance": acceptance,
              "verdict": verdict, "episodes_generated": [ep.to_dict() for ep in episodes]}
    answers = [a for r in records for a in r["answers"]]
    return write(args.out, result, markdown(result), records=answers, plot=plot(result))


if __name__ == "__main__":
    sys.exit(main())
