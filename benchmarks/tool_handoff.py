"""The seed's scenario with real tool calls: an analyst gathers evidence over 8 tool turns, a writer answers from it.

    nice .venv/bin/python benchmarks/tool_handoff.py                 # 8 episodes x 8 questions
    nice .venv/bin/python benchmarks/tool_handoff.py --episodes 1    # a quick look

A LangGraph graph of two nodes against a real ``c2c serve`` (Qwen2.5-Coder-0.5B-Instruct, bf16,
its defaults), both agents stock ``ChatOpenAI(...).bind_tools([read_document])``: one tool
catalogue and one team system prompt, so one shared prefix.

- **analyst** (one session): a private brief (a user turn named ``role``), a plan it writes itself
  (named ``scratch``), then 8 turns "Read document k." in ``tool_choice: auto``: the model's own
  call is parsed, run (a turn it answers without a call is asked again with ``tool_choice:
  required``, and counted), and its result (about 150 tokens of real prose with two planted facts,
  :mod:`c2c.bench.agent_episodes`) sent back with the call's id. Last, it states its findings; that
  request publishes the slice ``labels = ["user", "assistant", "read_document"]``: the requests,
  calls, tool results and conclusion, never the brief or the scratch turn (both private; the
  slice's K/V are recomputed without them, ``isolation: recompute``).
- **writer**, once per question (a fresh request each, as a graph's node makes it): the team's
  system prompt, then the question. Two arms on the same commit:
  ``cache`` attaches it in ``auto`` (its K/V are placed after the shared prefix) and ``text``
  attaches it in ``text`` (the server places the commit's text there as a user turn: the same
  content, read as text, which is what a text handoff gives the writer).

Timings: each writer request (client wall clock), and the handoff end to end per episode: every
writer request of the episode, plus, in the ``cache`` arm, the publish (the slice's isolated
recompute and the store write, which the server reports as ``publish_s``). The analyst's own work
(its tool loop and its final request, without the publish) is the same in both arms: it is reported
beside them, and the whole pipeline's ratio with it added to both. Answers: whether the reply holds the planted fact (SQuAD
normalization, whole words), with 95% Wilson intervals; the cache - text difference is paired, with
a 95% bootstrap interval over episodes.

Acceptance (issue #55): the cache path is at least 3x faster end to end (the handoff: the ratio of
the per-episode totals, median, and its interval); its answers are within the paired interval of
the text path's; every commit carries the tool results and the conclusion, never the private brief
or the scratch turn (read back from the store), and the record names the labels that went.

Outputs benchmarks/results/tool_handoff.{json,md,jsonl,png} (or --out PREFIX); the machine is recorded.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"
MODEL = "Qwen2.5-Coder-0.5B-Instruct"
SYSTEM = "You are an agent of a research team. The case file's documents are read with the read_document tool."
BRIEF = ("Private brief for the analyst (budget code {code}, not for the writer): read documents 1 to 8 of the case "
         "file, one per turn, with read_document, then state what you found.")
PLAN = "Before you start, write your plan in one sentence."
FINDINGS = "Stop calling tools. State the key facts you found, in at most three sentences."
LABELS = ["user", "assistant", "read_document"]
STEPS = 8


class Tokens:
    """The served model's tokenizer, for cutting the documents (:func:`c2c.bench.agent_episodes.build`)."""

    def __init__(self, path):
        from transformers import AutoTokenizer
        self.tok = AutoTokenizer.from_pretrained(path)

    def encode(self, text: str) -> list[int]:
        return self.tok.encode(text, add_special_tokens=False)

    def decode(self, ids) -> str:
        return self.tok.decode(ids)


def graph(base_url: str, client, episode, arms: tuple[str, ...], *, code: str, max_tokens: int):
    """The LangGraph graph of one episode: analyst, then the writer's questions in every arm."""
    from typing import TypedDict

    from langchain_core.messages import AIMessage, HumanMessage, SystemMessage, ToolMessage, convert_to_openai_messages
    from langchain_core.tools import tool
    from langchain_openai import ChatOpenAI
    from langgraph.graph import END, START, StateGraph

    from c2c.testing.server_process import c2c_field

    @tool
    def read_document(doc_id: int) -> str:
        """Read one document of the case file by its number, 1 to 8."""
        k = int(doc_id)
        return episode.responses[k - 1] if 1 <= k <= len(episode.responses) else f"There is no document {doc_id}."

    tools = [read_document]
    session = f"analyst-{episode.id}-{code}"

    def model(c2c: dict | None = None, **kw):
        return ChatOpenAI(base_url=base_url, api_key="none", model=MODEL, temperature=0, max_tokens=64,
                          max_retries=0, timeout=600, extra_body={"c2c": c2c} if c2c else None).bind_tools(tools, **kw)

    def as_openai(messages):
        return convert_to_openai_messages(messages)

    class State(TypedDict, total=False):
        analyst: dict
        answers: list

    def analyst(state: State) -> State:
        t0 = time.perf_counter()
        messages = [SystemMessage(SYSTEM), HumanMessage(BRIEF.format(code=code), name="role"), HumanMessage(PLAN)]
        plan = model({"session": session}, tool_choice="none").invoke(messages)
        messages[-1:] = [HumanMessage(PLAN, name="scratch"), AIMessage(plan.content, name="scratch")]
        turns = []
        for k in range(1, STEPS + 1):
            messages.append(HumanMessage(f"Read document {k}."))
            reply = model({"session": session}).invoke(messages)   # tool_choice auto: the model's own call
            forced = not reply.tool_calls
            if forced:   # it answered without a call: ask again, a call required (its arguments are still its own)
                reply = model({"session": session}, tool_choice="required").invoke(messages)
            messages.append(reply)
            called = [c["args"].get("doc_id") for c in reply.tool_calls]
            for call in reply.tool_calls:
                messages.append(ToolMessage(read_document.invoke(call["args"]), tool_call_id=call["id"]))
            turns.append({"k": k, "calls": called, "forced": forced, "content": reply.content})
        t_loop = time.perf_counter() - t0
        messages.append(HumanMessage(FINDINGS))
        t1 = time.perf_counter()
        r = client.chat.completions.create(
            model=MODEL, messages=as_openai(messages), tools=[_schema(read_document)], tool_choice="none",
            temperature=0, max_tokens=96,
            extra_body={"c2c": {"session": session, "publish": {"stream": f"analyst-{episode.id}", "labels": LABELS}}})
        final_s = time.perf_counter() - t1
        f = c2c_field(r)
        return {"analyst": {"turns": turns, "loop_s": t_loop, "final_s": final_s, "publish": f["publish"],
                            "publish_s": f["timings"]["publish_s"], "conclusion": r.choices[0].message.content,
                            "prompt_tokens": r.usage.prompt_tokens}}

    def writer(state: State) -> State:
        commit = state["analyst"]["publish"]["commit"]
        answers = []
        for q in episode.questions:
            for arm in arms:
                messages = [{"role": "system", "content": SYSTEM},
                            {"role": "user", "content": f"Question about the analyst's documents: {q.question} "
                                                        "Reply with the answer only."}]
                t0 = time.perf_counter()
                r = client.chat.completions.create(
                    model=MODEL, messages=messages, tools=[_schema(read_document)], tool_choice="none",
                    temperature=0, max_tokens=max_tokens,
                    extra_body={"c2c": {"attach": [commit], "mode": "auto" if arm == "cache" else "text"}})
                wall = time.perf_counter() - t0
                att = c2c_field(r)["attach"][0]
                answers.append({"question": q.id, "arm": arm, "wall_s": wall, "used": att["used"],
                                "reason": att.get("reason"), "reply": r.choices[0].message.content or "",
                                "answer": q.answer, "prompt_tokens": r.usage.prompt_tokens,
                                "cached_tokens": (c2c_field(r).get("cached_tokens")),
                                "timings": c2c_field(r).get("timings")})
        return {"answers": answers}

    g = StateGraph(State)
    g.add_node("analyst", analyst)
    g.add_node("writer", writer)
    g.add_edge(START, "analyst")
    g.add_edge("analyst", "writer")
    g.add_edge("writer", END)
    return g.compile()


def _schema(fn) -> dict:
    from langchain_core.utils.function_calling import convert_to_openai_tool
    return convert_to_openai_tool(fn)


def commit_text(store_url: str, commit: str, tok: Tokens) -> dict:
    """What the commit carries, read back from the store: its kept text and its tokens, decoded."""
    from c2c.artifact import Artifact
    from c2c.store.url import open_store
    rec = open_store(store_url).in_domain("default").get(commit)
    header, _ = Artifact.peek(rec.data)
    kept = (header.extra.get("c2c.serve") or {}).get("text", "")
    return {"text": kept, "tokens_text": tok.decode(list(header.tokens or ())), "n_tokens": header.seq_len,
            "labels": dict(header.labels)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--episodes", type=int, default=8)
    ap.add_argument("--questions", type=int, default=8, help="writer questions per episode (default 8)")
    ap.add_argument("--doc-tokens", type=int, default=150, help="tokens of prose per tool result (default 150)")
    ap.add_argument("--max-tokens", type=int, default=16, help="the writer's answer budget (default 16)")
    ap.add_argument("--seed", type=int, default=55)
    ap.add_argument("--out", default=str(RESULTS / "tool_handoff"))
    args = ap.parse_args(argv)

    import openai

    from c2c.bench import agent_episodes
    from c2c.bench.context_qa import contains_answer
    from c2c.runtime import zoo
    from c2c.testing.server_process import ServeProcess, make_home

    tok = Tokens(zoo.model_path(MODEL))
    episodes = agent_episodes.build(tok, args.episodes, steps=STEPS, doc_tokens=args.doc_tokens, keep=STEPS,
                                    checkpoints={STEPS: (args.questions, 0)}, seed=args.seed)
    records, analysts, t_all = [], [], time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="c2c-tool-handoff-") as tmp:
        store = f"sqlite:///{Path(tmp) / 'store.db'}"
        proc = ServeProcess(make_home(Path(tmp)), "--model", MODEL, "--dtype", "bfloat16", "--store", store,
                            env={"C2C_THREADS": str(os.cpu_count() or 1)}).start()
        client = openai.OpenAI(base_url=proc.base_url, api_key="none", max_retries=0, timeout=600)
        try:
            for e, ep in enumerate(episodes):
                code = f"BX-{args.seed}{e:02d}7Q"
                arms = ("cache", "text") if e % 2 == 0 else ("text", "cache")   # in turns
                out = graph(proc.base_url, client, ep, arms, code=code, max_tokens=args.max_tokens).invoke({})
                a = out["analyst"]
                carried = commit_text(store, a["publish"]["commit"], tok)
                docs_called = sorted({int(c) for t in a["turns"] for c in t["calls"] if str(c).isdigit()})
                a.update(episode=ep.id, code=code, docs_called=docs_called,
                         tool_turns=sum(1 for t in a["turns"] if t["calls"]),
                         evidence_tokens=sum(len(tok.encode(ep.responses[k - 1])) for k in docs_called),
                         brief_out=code not in carried["text"] and code not in carried["tokens_text"],
                         scratch_out="plan" not in carried["text"].lower() or PLAN not in carried["text"],
                         results_in=all(ep.responses[k - 1][:60] in carried["text"] for k in docs_called),
                         conclusion_in=(a["conclusion"] or "")[:40] in carried["text"],
                         commit_tokens=carried["n_tokens"], commit_labels=carried["labels"])
                analysts.append(a)
                for r in out["answers"]:
                    r.update(episode=ep.id, correct=contains_answer(r["reply"], r["answer"]))
                    records.append(r)
                print(f"episode {e + 1}/{len(episodes)}: {a['tool_turns']} tool turns, {a['evidence_tokens']} "
                      f"evidence tokens, analyst {a['loop_s']:.1f} s; writer "
                      + ", ".join(f"{arm} {statistics.median(r['wall_s'] for r in out['answers'] if r['arm'] == arm):.2f} s"
                                  for arm in ("cache", "text")), flush=True)
        finally:
            proc.stop()
    return report(records, analysts, args, time.perf_counter() - t_all)


def report(records: list[dict], analysts: list[dict], args, wall_s: float) -> int:
    from c2c.bench import results
    from c2c.bench.stats import bootstrap_mean, wilson

    m = results.machine()
    by_ep: dict[str, dict] = {}
    for r in records:
        by_ep.setdefault(r["episode"], {}).setdefault(r["arm"], []).append(r)
    episodes = []
    for a in analysts:
        arms = by_ep[a["episode"]]
        text_total = sum(r["wall_s"] for r in arms["text"])
        cache_total = a["publish_s"] + sum(r["wall_s"] for r in arms["cache"])
        analyst_s = a["loop_s"] + a["final_s"] - a["publish_s"]   # the same work in both arms
        diff = statistics.mean(c["correct"] - t["correct"] for c, t in zip(arms["cache"], arms["text"]))
        episodes.append({"episode": a["episode"], "text_s": text_total, "cache_s": cache_total,
                         "ratio": text_total / cache_total, "diff": diff,
                         "analyst_s": analyst_s,
                         "with_loop_ratio": (analyst_s + text_total) / (analyst_s + cache_total)})
    arm_rows = {}
    for arm in ("cache", "text"):
        rs = [r for r in records if r["arm"] == arm]
        k = sum(r["correct"] for r in rs)
        arm_rows[arm] = {"n": len(rs), "correct": k, "acc": k / len(rs), "wilson": wilson(k, len(rs)),
                         "wall_median_s": statistics.median(r["wall_s"] for r in rs),
                         "used": sorted({r["used"] for r in rs}),
                         "prompt_tokens_median": statistics.median(r["prompt_tokens"] for r in rs)}
    ratios = [e["ratio"] for e in episodes]
    # the same per-episode ratio when the writer asks only its first q questions (the publish is paid once)
    qmax = min(len(by_ep[a["episode"]]["text"]) for a in analysts)
    by_q = []
    for q in range(1, qmax + 1):
        rq = [sum(r["wall_s"] for r in by_ep[a["episode"]]["text"][:q])
              / (a["publish_s"] + sum(r["wall_s"] for r in by_ep[a["episode"]]["cache"][:q])) for a in analysts]
        by_q.append({"questions": q, "ratio_median": statistics.median(rq), "ratios": rq})
    per_question = [t["wall_s"] / c["wall_s"] for a in analysts
                    for c, t in zip(by_ep[a["episode"]]["cache"], by_ep[a["episode"]]["text"])]
    diff_ci = bootstrap_mean([e["diff"] for e in episodes]) if len(episodes) > 1 else (None, None)
    ratio_ci = bootstrap_mean(ratios) if len(ratios) > 1 else (None, None)
    acc = {
        "cache_ge_3x_faster_end_to_end": statistics.median(ratios) >= 3.0,
        "answers_within_paired_interval": diff_ci[0] is not None and diff_ci[0] <= 0 <= diff_ci[1],
        "cache_used_every_time": arm_rows["cache"]["used"] == ["full"] or arm_rows["cache"]["used"] == ["slice"],
        "at_least_8_tool_turns": all(a["tool_turns"] >= 8 for a in analysts),
        "at_least_1k_evidence_tokens": all(a["evidence_tokens"] >= 1000 for a in analysts),
        "minimized": all(a["brief_out"] and a["scratch_out"] and a["results_in"] and a["conclusion_in"]
                         for a in analysts),
    }
    out = {"benchmark": "tool_handoff", "model": MODEL, "dtype": "bfloat16", "machine": m,
           "command": "benchmarks/tool_handoff.py " + " ".join(sys.argv[1:]), "args": vars(args), "wall_s": wall_s,
           "labels": LABELS, "arms": arm_rows, "episodes": episodes, "analysts": analysts,
           "ratio_median": statistics.median(ratios), "ratio_ci": ratio_ci, "by_questions": by_q,
           "per_question_ratio_median": statistics.median(per_question), "diff_ci": diff_ci,
           "acceptance": acc}
    out = json.loads(json.dumps(out, default=str))  # argparse's Paths and numpy scalars as JSON
    return results.write(args.out, out, markdown(out), records=[json.loads(json.dumps(r, default=str)) for r in records],
                         plot=lambda path: plot(out, path))


def markdown(o: dict) -> str:
    m, a = o["machine"], o["arms"]
    ci = o["ratio_ci"]
    d = o["diff_ci"]
    lines = [f"# A tool-using analyst hands off to a writer: cache against text ({o['model']}, {o['dtype']})", "",
             f"Machine: {m.get('cpu')}, {m.get('cores')} cores, bf16 flags {m.get('bf16_flags')}. "
             f"Command: `{o['command']}`. LangGraph graph against a real `c2c serve`; {len(o['analysts'])} episodes, "
             f"{a['cache']['n']} writer questions per arm; arms in turns. Wall time {o['wall_s'] / 60:.1f} min.", "",
             "| arm | accuracy (95% Wilson) | writer request, median s | prompt tokens, median | handoff used |",
             "|---|---|---:|---:|---|"]
    for arm in ("text", "cache"):
        r = a[arm]
        lines.append(f"| {arm} | {r['acc']:.1%} ({r['wilson'][0]:.1%}-{r['wilson'][1]:.1%}) n={r['n']} | "
                     f"{r['wall_median_s']:.2f} | {r['prompt_tokens_median']:.0f} | {', '.join(r['used'])} |")
    lines += ["", "Per episode (the handoff end to end: every writer request, and the publish in the cache arm; "
                  "`with analyst`: the analyst's own work, the same in both arms, added to both):", "",
              "| episode | tool turns (forced) | evidence tokens | commit tokens | analyst s | publish s | text s | cache s | "
              "text / cache | with analyst | cache - text correct |", "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for e, an in zip(o["episodes"], o["analysts"]):
        forced = sum(1 for t in an["turns"] if t["forced"])
        lines.append(f"| {e['episode']} | {an['tool_turns']} ({forced}) | {an['evidence_tokens']} | {an['commit_tokens']} | "
                     f"{e['analyst_s']:.1f} | {an['publish_s']:.2f} | {e['text_s']:.2f} | {e['cache_s']:.2f} | "
                     f"{e['ratio']:.2f}x | {e['with_loop_ratio']:.2f}x | {e['diff']:+.2f} |")
    ratio = f"{o['ratio_median']:.2f}x" + (f" (mean {statistics.mean(e['ratio'] for e in o['episodes']):.2f}x, 95% "
                                           f"{ci[0]:.2f}-{ci[1]:.2f})" if ci[0] is not None else "")
    if ci[0] is not None and ci[0] >= 3:
        ratio = f"**{ratio}**"
    diff = f"{d[0]:+.2f}..{d[1]:+.2f}" if d[0] is not None else "n/a (one episode)"
    lines += ["", f"Handoff end to end, text / cache: {ratio}. Cache - text accuracy, paired over episodes: "
                  f"{diff}. One writer request alone (no publish counted), text / cache, median: "
                  f"{o['per_question_ratio_median']:.2f}x.", "",
              "The publish is paid once per handoff, each writer request saves a prefill: the ratio by how many "
              "questions the writer asks (its first q, same runs):", "",
              "| questions | " + " | ".join(str(b["questions"]) for b in o["by_questions"]) + " |",
              "|---|" + "---:|" * len(o["by_questions"]),
              "| text / cache, median | " + " | ".join(f"{b['ratio_median']:.2f}x" for b in o["by_questions"]) + " |",
              "",
              f"Published labels: {o['labels']} (the brief is a user turn named `role`, the plan a turn named "
              "`scratch`: private, never in the slice). Read back from the store, every commit: brief out "
              f"{all(x['brief_out'] for x in o['analysts'])}, scratch out {all(x['scratch_out'] for x in o['analysts'])}, "
              f"tool results in {all(x['results_in'] for x in o['analysts'])}, conclusion in "
              f"{all(x['conclusion_in'] for x in o['analysts'])}.", "", "Acceptance:", ""]
    lines += [f"- {k}: {'yes' if v else 'no'}" for k, v in o["acceptance"].items()]
    return "\n".join(lines) + "\n"


def plot(o: dict, path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, (ax, bx) = plt.subplots(1, 2, figsize=(11, 3.8))
    qs = [b["questions"] for b in o["by_questions"]]
    for i in range(len(o["episodes"])):
        bx.plot(qs, [b["ratios"][i] for b in o["by_questions"]], color="0.8", lw=1)
    bx.plot(qs, [b["ratio_median"] for b in o["by_questions"]], "o-", color="C1", label="median over episodes")
    bx.axhline(3, ls="--", color="0.4", lw=1)
    bx.axhline(1, ls=":", color="0.4", lw=1)
    bx.set_xlabel("writer questions per handoff")
    bx.set_ylabel("text / cache, end to end")
    bx.legend(fontsize=8)
    eps = o["episodes"]
    x = range(len(eps))
    ax.bar([i - 0.2 for i in x], [e["text_s"] for e in eps], 0.4, label="text handoff")
    ax.bar([i + 0.2 for i in x], [e["cache_s"] for e in eps], 0.4, label="cache handoff")
    ax.set_xticks(list(x), [e["episode"] for e in eps], rotation=30, fontsize=7)
    ax.set_ylabel("handoff end to end, s")
    ax.set_title(f"analyst (8 tool turns) -> writer, {o['model']}")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)


if __name__ == "__main__":
    sys.exit(main())
