"""Many agents at once: `c2c serve` against `vllm serve` under 1, 2, 4 and 8 concurrent agents, and concurrent
two-agent handoff pipelines by cache and by text.

    bash scripts/setup_vllm.sh
    nice .venv/bin/python benchmarks/serve_concurrency.py                  # Qwen2.5-Coder-0.5B, bf16, 3 rounds
    nice .venv/bin/python benchmarks/serve_concurrency.py --rounds 1 --levels 1,8 --no-vllm

Three servers, each on the same two threads, started once and paused (SIGSTOP) while another runs, so that
exactly one server is awake at a time; each round runs every server's load in turn:

- ``c2c``: `c2c serve` with its defaults (decode steps batched, ``--max-batch 16``);
- ``c2c-1``: `c2c serve --max-batch 1`, one request per forward pass (what `c2c serve` did before batching);
- ``vllm``: plain `vllm serve` (no connector: what a user would run instead), ``--enforce-eager``, prefix
  caching off.

**Chat load**: L agents send a chat request at once (a barrier), each with a prompt of its own of about
``--prompt-tokens`` tokens, and take ``--max-tokens`` greedy tokens (end of turn banned by ``logit_bias``, so
exactly that many). One agent sends two requests, one after the other. Tokens/s is every completion token over
the wall time; p50 and p99 are of the requests' latencies.

**Pipelines** (`c2c serve` with its defaults only; vLLM's are ``benchmarks/vllm.py``): ``--pipelines`` at once, each running
``--per-pipeline`` back to back, by text and by cache in turn. Text: the analyst reads a 512-token document and
writes a ``--message-tokens`` message, the writer reads it and answers 16 tokens. Cache: the analyst reads the
document and publishes its session (a one-token reply), the writer continues its conversation, attaches the
commit (``full``) and answers 16 tokens.

The ratios are per round (the same round's runs), and the acceptance reads their median. Outputs
benchmarks/results/serve_concurrency.{json,md,png,jsonl} (or ``--out PREFIX``).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

import openai

RESULTS = Path(__file__).resolve().parent / "results"
MODEL = "Qwen2.5-Coder-0.5B-Instruct"
MESSAGE_PROMPT = "Write the facts of the material above that matter as a message for the writer."


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(int(q * len(xs)), len(xs) - 1)] if xs else float("nan")


class Server:
    """One server process: started once, paused while the others run."""

    def __init__(self, name: str, proc, pgroup: bool):
        self.name, self.proc, self.pgroup = name, proc, pgroup

    @property
    def pid(self) -> int:
        return self.proc.proc.pid

    def signal(self, sig: int) -> None:
        if self.pgroup:
            os.killpg(self.pid, sig)
        else:
            os.kill(self.pid, sig)

    def client(self) -> openai.OpenAI:
        return openai.OpenAI(base_url=self.proc.base_url, api_key="unused", max_retries=0, timeout=900)


def no_eos(model_dir: Path) -> dict[str, int]:
    ids: set[int] = set()
    for f in ("config.json", "generation_config.json"):
        p = model_dir / f
        if p.is_file():
            eos = json.loads(p.read_text()).get("eos_token_id")
            ids.update(eos if isinstance(eos, list) else [eos] if isinstance(eos, int) else [])
    return {str(i): -100 for i in ids}


def at_once(n: int, each: int, run) -> dict:
    """``n`` threads started together (a barrier), each calling ``run(i, k)`` ``each`` times back to back: the values
    ``run`` returned, each call's latency, the errors (counted, not raised) and the wall time."""
    values, lat, errors = [], [], []
    lock, barrier = threading.Lock(), threading.Barrier(n)

    def thread(i: int):
        barrier.wait()
        for k in range(each):
            t0 = time.perf_counter()
            try:
                value = run(i, k)
            except Exception as e:  # noqa: BLE001 - counted and reported
                with lock:
                    errors.append(repr(e)[:200])
                continue
            with lock:
                lat.append(time.perf_counter() - t0)
                values.append(value)

    t0 = time.perf_counter()
    threads = [threading.Thread(target=thread, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return {"values": values, "latencies": lat, "errors": errors, "wall_s": time.perf_counter() - t0}


def chat_load(server: Server, model: str, prompts: list[str], agents: int, max_tokens: int, bias: dict) -> dict:
    """``agents`` requests at once (one agent: two, one after the other)."""
    client = server.client()

    def one(i: int, k: int) -> int:
        r = client.chat.completions.create(model=model, messages=[{"role": "user", "content": prompts[(i + k) % len(prompts)]}],
                                           max_tokens=max_tokens, temperature=0, logit_bias=bias)
        return r.usage.completion_tokens

    got = at_once(agents, 2 if agents == 1 else 1, one)
    toks, lat, wall = got["values"], got["latencies"], got["wall_s"]
    return {"agents": agents, "requests": len(lat), "completion_tokens": sum(toks), "wall_s": wall,
            "tokens_per_s": sum(toks) / wall, "p50_s": pct(lat, 0.5), "p99_s": pct(lat, 0.99),
            "errors": len(got["errors"]), "first_errors": got["errors"][:3]}


def pipelines(server: Server, model: str, document: str, way: str, count: int, each: int, message_tokens: int,
              bias: dict, tag: str) -> dict:
    """``count`` pipelines at once, ``each`` back to back, ``way`` ``text`` or ``cache``."""
    from c2c.bench.handoff import QUESTION, SYSTEM

    client = server.client()
    sys_m, doc_m = {"role": "system", "content": SYSTEM}, {"role": "user", "content": "Material:\n" + document}
    q_m = {"role": "user", "content": QUESTION}

    def ask(messages, max_tokens, c2c, banned=True):
        return client.chat.completions.create(model=model, messages=messages, max_tokens=max_tokens, temperature=0,
                                              logit_bias=bias if banned else None, extra_body={"c2c": c2c})

    def run(i: int, k: int) -> str:
        s = f"{tag}-{way}-{i}-{k}"
        if way == "text":
            a = ask([sys_m, doc_m, {"role": "user", "content": MESSAGE_PROMPT}], message_tokens, {"session": s + "-a"})
            ask([sys_m, {"role": "user", "content": "Message from the analyst:\n" + a.choices[0].message.content},
                 q_m], 16, {"session": s + "-w"})
            return "text"
        a = ask([sys_m, doc_m], 1, {"session": s + "-a", "publish": {"stream": s}}, banned=False)
        pub = a.model_extra["c2c"]["publish"]
        w = ask([sys_m, doc_m, {"role": "assistant", "content": a.choices[0].message.content}, q_m], 16,
                {"session": s + "-w", "attach": [pub["commit"]], "mode": "full"})
        return w.model_extra["c2c"]["attach"][0]["path"]

    got = at_once(count, each, run)
    lat, wall = got["latencies"], got["wall_s"]
    return {"way": way, "pipelines": len(lat), "wall_s": wall, "per_s": len(lat) / wall, "p50_s": pct(lat, 0.5),
            "p99_s": pct(lat, 0.99), "errors": len(got["errors"]), "first_errors": got["errors"][:3],
            "paths": sorted(set(got["values"]))}


def agreement(model: str, dtype: str, prompts: list[str], steps: int) -> dict:
    """Greedy tokens of batched against single decode, in-process, on the benchmark's prompts: the share of
    generated tokens that agree, position by position (a sequence that diverges once disagrees after)."""
    from c2c.runtime import zoo

    rt = zoo.load(model, dtype=dtype)
    ids = [rt.encode(p)[:200] for p in prompts[:8]]

    def run(together: bool) -> list[list[int]]:
        seqs = [rt.stepper(None) for _ in ids]
        out = [[int(s.feed(p).argmax())] for s, p in zip(seqs, ids)]
        for _ in range(steps):
            logits = (rt.feed_together(seqs, [[o[-1]] for o in out]) if together
                      else [s.feed([o[-1]]) for s, o in zip(seqs, out)])
            for o, x in zip(out, logits):
                o.append(int(x.argmax()))
        return out

    a, b = run(False), run(True)
    same = sum(x == y for p, q in zip(a, b) for x, y in zip(p, q))
    first_diff = [next((k for k, (x, y) in enumerate(zip(p, q)) if x != y), None) for p, q in zip(a, b)]
    rt.close()
    return {"dtype": dtype, "sequences": len(ids), "tokens": sum(len(p) for p in a), "agree": same / sum(len(p) for p in a),
            "identical_sequences": sum(d is None for d in first_diff), "first_divergence": first_diff}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    ap.add_argument("--model", default=MODEL)
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--levels", default="1,2,4,8", help="concurrent agents, comma-separated (default 1,2,4,8)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--prompt-tokens", type=int, default=354)
    ap.add_argument("--pipelines", type=int, default=8, help="pipelines at once (0: none)")
    ap.add_argument("--per-pipeline", type=int, default=2)
    ap.add_argument("--message-tokens", type=int, default=128)
    ap.add_argument("--agreement-steps", type=int, default=48, help="decode steps of the batched/single check")
    ap.add_argument("--no-vllm", action="store_true")
    ap.add_argument("--out", default=str(RESULTS / "serve_concurrency"))
    args = ap.parse_args(argv)

    from c2c.bench import results
    from c2c.bench.handoff import corpus_text
    from c2c.runtime import zoo
    from c2c.testing.server_process import ServeProcess, make_home
    from c2c.testing.vllm import VllmProcess, vllm_python

    levels = [int(x) for x in args.levels.split(",")]
    m = results.machine()
    print(f"machine: {m['cpu']}, {m['cores']} cores, bf16 flags {m['bf16_flags']}", flush=True)
    model_dir = zoo.model_path(args.model)
    bias = no_eos(model_dir)
    corpus = corpus_text()
    words = corpus.split()
    tok = zoo.load(args.model, dtype="float32")   # its tokenizer cuts each prompt to --prompt-tokens tokens
    text = tok.encode(" ".join(words[:20_000]))
    prompts = [tok.decode(text[i * args.prompt_tokens:(i + 1) * args.prompt_tokens]) + "\n\nSummarize the text above."
               for i in range(16)]
    document = tok.decode(tok.encode(" ".join(words[40_000:41_000]))[:512])
    tok.close()

    agree = [agreement(args.model, d, prompts, args.agreement_steps)
             for d in dict.fromkeys(("float32", args.dtype))]
    for a in agree:
        print(f"batched vs single greedy ({a['dtype']}): {a['agree']:.1%} of {a['tokens']} tokens, "
              f"{a['identical_sequences']}/{a['sequences']} sequences identical", flush=True)

    env = {"C2C_THREADS": "2"}
    servers: list[Server] = []
    with tempfile.TemporaryDirectory(prefix="c2c-conc-") as tmp:
        root = Path(tmp)
        try:
            for name, extra in (("c2c", ()), ("c2c-1", ("--max-batch", "1"))):
                home = make_home(root / name)
                p = ServeProcess(home, "--model", args.model, "--dtype", args.dtype, "--store",
                                 f"sqlite:///{root / name / 'store.db'}", "--session-budget-mb", "4096",
                                 "--max-queue", "64", *extra, env=env).start()
                servers.append(Server(name, p, pgroup=False))
                servers[-1].signal(signal.SIGSTOP)
            if not args.no_vllm:
                if vllm_python() is None:
                    print("no .venv-vllm: run `bash scripts/setup_vllm.sh`, or pass --no-vllm", file=sys.stderr)
                    return 2
                p = VllmProcess(model_dir, root / "vllm-home", store="unused", domain="bench", name=args.model,
                                dtype=args.dtype, max_model_len=2048, kv_cache_gb=2, connector=False).start()
                servers.append(Server("vllm", p, pgroup=True))
                servers[-1].signal(signal.SIGSTOP)
            rounds = []
            for r in range(args.rounds):
                row: dict = {"round": r + 1, "chat": {}, "pipelines": {}}
                for s in servers:
                    s.signal(signal.SIGCONT)
                    try:
                        chat_load(s, args.model, prompts, 1, 4, bias)   # warm: the first request after a pause
                        row["chat"][s.name] = [chat_load(s, args.model, prompts, n, args.max_tokens, bias)
                                               for n in levels]
                        for c in row["chat"][s.name]:
                            print(f"round {r + 1} {s.name:6s} {c['agents']} agents: {c['tokens_per_s']:6.1f} tok/s, "
                                  f"p50 {c['p50_s']:.1f} s, p99 {c['p99_s']:.1f} s, errors {c['errors']}", flush=True)
                        if args.pipelines and s.name == "c2c":
                            row["pipelines"][s.name] = {
                                way: pipelines(s, args.model, document, way, args.pipelines, args.per_pipeline,
                                               args.message_tokens, bias, f"r{r}-{s.name}")
                                for way in (("text", "cache") if r % 2 == 0 else ("cache", "text"))}
                            for way, p in row["pipelines"][s.name].items():
                                print(f"round {r + 1} {s.name:6s} pipelines {way}: {p['per_s']:.3f}/s "
                                      f"p50 {p['p50_s']:.1f} s p99 {p['p99_s']:.1f} s paths {p['paths']} "
                                      f"errors {p['errors']}", flush=True)
                    finally:
                        s.signal(signal.SIGSTOP)
                rounds.append(row)
        finally:
            for s in servers:
                try:
                    s.signal(signal.SIGCONT)
                except ProcessLookupError:
                    pass
                s.proc.stop()

    out = summarize(args, m, levels, rounds, agree)
    return results.write(args.out, out, markdown(out), records=[
        {"round": row["round"], "server": name, "kind": "chat", **c} for row in rounds
        for name, cs in row["chat"].items() for c in cs] + [
        {"round": row["round"], "server": name, "kind": "pipelines", **p} for row in rounds
        for name, ps in row["pipelines"].items() for p in ps.values()], plot=lambda path: plot(out, path))


def summarize(args, machine: dict, levels: list[int], rounds: list[dict], agree: list[dict]) -> dict:
    names = list(rounds[0]["chat"])
    med = statistics.median

    def at(row, name, n):
        return next(c for c in row["chat"][name] if c["agents"] == n)

    table = {name: {n: {k: med(at(r, name, n)[k] for r in rounds) for k in ("tokens_per_s", "p50_s", "p99_s")}
                    for n in levels} for name in names}
    top, low = max(levels), min(levels)
    ratios = {}
    if "vllm" in names:
        ratios["throughput_vs_vllm"] = {n: med(at(r, "c2c", n)["tokens_per_s"] / at(r, "vllm", n)["tokens_per_s"]
                                              for r in rounds) for n in levels}
        ratios["p99_vs_vllm"] = {n: med(at(r, "c2c", n)["p99_s"] / at(r, "vllm", n)["p99_s"] for r in rounds)
                                 for n in levels}
    ratios["growth"] = {name: med(at(r, name, top)["tokens_per_s"] / at(r, name, low)["tokens_per_s"] for r in rounds)
                        for name in names}
    ratios["batched_vs_one_per_pass"] = {n: med(at(r, "c2c", n)["tokens_per_s"] / at(r, "c2c-1", n)["tokens_per_s"]
                                                for r in rounds) for n in levels}
    pipes = {}
    for name in ("c2c",):
        rs = [r["pipelines"][name] for r in rounds if name in r["pipelines"]]
        if rs:
            pipes[name] = {"text_per_s": med(p["text"]["per_s"] for p in rs),
                           "cache_per_s": med(p["cache"]["per_s"] for p in rs),
                           "ratio": med(p["cache"]["per_s"] / p["text"]["per_s"] for p in rs),
                           "cache_paths": sorted({x for p in rs for x in p["cache"]["paths"]}),
                           "errors": sum(p[w]["errors"] for p in rs for w in ("text", "cache"))}
    errors = sum(c["errors"] for r in rounds for cs in r["chat"].values() for c in cs)
    acc = {}
    if "vllm" in names:
        acc["throughput_ge_0.9x_vllm_at_8"] = ratios["throughput_vs_vllm"].get(8, 0) >= 0.9
        acc["p99_le_1.2x_vllm_at_8"] = ratios["p99_vs_vllm"].get(8, 99) <= 1.2
    acc["growth_ge_3x_1_to_8"] = ratios["growth"]["c2c"] >= 3.0
    if "c2c" in pipes:
        acc["cache_pipelines_ge_3x_text"] = pipes["c2c"]["ratio"] >= 3.0 and pipes["c2c"]["cache_paths"] == ["cache"]
    acc["fp32_greedy_agreement_100pct"] = next(a for a in agree if a["dtype"] == "float32")["agree"] == 1.0
    acc["no_errors"] = errors == 0 and all(p["errors"] == 0 for p in pipes.values())
    return {"benchmark": "serve_concurrency", "model": args.model, "dtype": args.dtype, "machine": machine,
            "command": "benchmarks/serve_concurrency.py " + " ".join(sys.argv[1:]), "args": vars(args),
            "levels": levels, "servers": names, "table": table, "ratios": ratios, "pipelines": pipes,
            "agreement": agree, "rounds": rounds, "acceptance": acc}


def markdown(o: dict) -> str:
    m = o["machine"]
    lines = [f"# Many agents at once: c2c serve and vllm serve ({o['model']}, {o['dtype']})", "",
             f"{m['cpu']}, {m['cores']} cores, bf16 flags: {', '.join(m['bf16_flags']) or 'none'}; "
             f"{o['args']['rounds']} rounds, servers in turns, one awake at a time. Each agent: a prompt of its own "
             f"({o.get('prompt_note') or str(o['args']['prompt_tokens']) + ' tokens of text'}), "
             f"{o['args']['max_tokens']} greedy tokens. "
             f"`{o['command']}`", "",
             "| server | agents | tokens/s | p50 s | p99 s |", "|---|---:|---:|---:|---:|"]
    for name, rows in o["table"].items():
        for n, v in rows.items():
            lines.append(f"| {name} | {n} | {v['tokens_per_s']:.1f} | {v['p50_s']:.1f} | {v['p99_s']:.1f} |")
    r = o["ratios"]
    lines += ["", "Median of the per-round ratios:", ""]
    if "throughput_vs_vllm" in r:
        lines += [f"- c2c / vllm throughput: " + ", ".join(f"{n} agents {v:.2f}x" for n, v in
                                                           r["throughput_vs_vllm"].items()),
                  f"- c2c / vllm p99: " + ", ".join(f"{n} agents {v:.2f}x" for n, v in r["p99_vs_vllm"].items())]
    lines += [f"- throughput growth from {min(o['levels'])} to {max(o['levels'])} agents: "
              + ", ".join(f"{k} {v:.2f}x" for k, v in r["growth"].items()),
              "- batched / one request per pass: " + ", ".join(f"{n} agents {v:.2f}x" for n, v in
                                                             r["batched_vs_one_per_pass"].items())]
    if o["pipelines"]:
        lines += ["", f"Two-agent pipelines, {o['args']['pipelines']} at once, {o['args']['per_pipeline']} each "
                  f"(message {o['args']['message_tokens']} tokens):", "",
                  "| server | text pipelines/s | cache pipelines/s | cache / text | cache path |", "|---|---:|---:|---:|---|"]
        for name, p in o["pipelines"].items():
            lines.append(f"| {name} | {p['text_per_s']:.3f} | {p['cache_per_s']:.3f} | {p['ratio']:.2f}x | "
                         f"{', '.join(p['cache_paths'])} |")
    lines += ["", "Greedy agreement, batched against single decode (8 sequences, in-process):", ""]
    for a in o["agreement"]:
        lines.append(f"- {a['dtype']}: {a['agree']:.1%} of {a['tokens']} tokens; {a['identical_sequences']}/"
                     f"{a['sequences']} sequences identical; first divergence at steps {a['first_divergence']}")
    lines += ["", "Acceptance:", ""] + [f"- {k}: {'yes' if v else 'NO'}" for k, v in o["acceptance"].items()]
    return "\n".join(lines) + "\n"


def plot(o: dict, path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a1, a2) = plt.subplots(1, 2, figsize=(10, 4))
    for name, rows in o["table"].items():
        xs = list(rows)
        a1.plot(xs, [rows[n]["tokens_per_s"] for n in xs], marker="o", label=name)
        a2.plot(xs, [rows[n]["p99_s"] for n in xs], marker="o", label=name)
    a1.set_xlabel("concurrent agents")
    a1.set_ylabel("completion tokens / s")
    a2.set_xlabel("concurrent agents")
    a2.set_ylabel("p99 latency, s")
    for a in (a1, a2):
        a.set_xscale("log", base=2)
        a.legend()
    fig.suptitle(f"{o['model']} {o['dtype']}: c2c serve vs vllm serve")
    fig.tight_layout()
    fig.savefig(path, dpi=120)


if __name__ == "__main__":
    sys.exit(main())
