"""The two-agent pipeline on one `vllm serve`, by text and by c2c's KV connector; and the connector's cost unused.

    bash scripts/setup_vllm.sh
    .venv/bin/python benchmarks/vllm.py                         # Qwen2.5-Coder-0.5B, bf16, N = 64,128,256
    .venv/bin/python benchmarks/vllm.py --model SmolLM2-135M-Instruct --dtype float32 --duration 30
    .venv/bin/python benchmarks/vllm.py --block-size 32           # vLLM's KV block size (default: its own)

One engine (c2c's converted safetensors of the zoo model, ``--enforce-eager``, prefix
caching off, so that the only cache a request gets is the one c2c hands it), one request
at a time unless said otherwise:

- **text**: the analyst reads the 512-token document and writes an N-token message
  (``ignore_eos``, so exactly N); the writer reads the message and answers 16 tokens.
- **cache**: the analyst reads the document and publishes its K/V (a one-token reply);
  the writer's prompt continues the analyst's conversation, attaches the commit
  (``full``) and answers 16 tokens: it prefills only its own question.
- **under load**: ``--concurrency`` pipelines at once for ``--duration`` seconds, each way:
  pipelines per second, p50 and p99 latency.
- **the connector unused**: decode throughput of one stream (a 16-token prompt, 128
  tokens) with the connector and its middleware loaded and no c2c fields, against a server
  without either: one server at a time, with both, without, the connector alone, the
  middleware alone, with both again (``--unused-only`` reruns just this into the results);
  every leg with the same ``VLLM_CPU_NUM_OF_RESERVED_CPU`` (``--reserved-cpus``), because vLLM
  reserves one more core for its engine when any KV connector is configured, and the cores
  vLLM bound its worker to, from each leg's log.

Outputs benchmarks/results/vllm.{json,md,png} (or --out PREFIX), with the CPU, whether it
has AMX, and the CPU attention kernel vLLM used (from the published commit's fingerprint).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx
from openai import OpenAI

from c2c.artifact.codec import Artifact
from c2c.bench import results
from c2c.bench.handoff import QUESTION, SYSTEM, corpus_text
from c2c.config import c2c_home
from c2c.store import open_store
from c2c.testing.vllm import VllmProcess

RESULTS = Path(__file__).resolve().parent / "results"
MESSAGE_PROMPT = "Write the facts of the material above that matter as a message for the writer."


def kv(r) -> dict:
    return ((r.model_extra or {}).get("kv_transfer_params") or {}).get("c2c") or {}


def pct(xs, q):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))] if xs else None


class Pipelines:
    """The two pipelines against one server."""

    def __init__(self, server: VllmProcess, document: str, answer_tokens: int):
        self.client = OpenAI(base_url=server.base_url, api_key="unused", max_retries=0, timeout=600)
        self.doc = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "Material:\n" + document}]
        self.k = answer_tokens
        self.n, self.lock = 0, threading.Lock()

    def ask(self, messages, max_tokens, c2c=None):
        body = {"ignore_eos": True}
        if c2c:
            body["kv_transfer_params"] = {"c2c": c2c}
        return self.client.chat.completions.create(model="m", messages=messages, max_tokens=max_tokens,
                                                   temperature=0, extra_body=body)

    def text(self, n: int) -> dict:
        t0 = time.perf_counter()
        a = self.ask(self.doc + [{"role": "user", "content": MESSAGE_PROMPT}], n)
        t1 = time.perf_counter()
        w = self.ask([self.doc[0], {"role": "user", "content": "Message from the analyst:\n"
                                    + a.choices[0].message.content}, {"role": "user", "content": QUESTION}], self.k)
        t2 = time.perf_counter()
        return {"s": t2 - t0, "analyst_s": t1 - t0, "writer_s": t2 - t1, "message_tokens": a.usage.completion_tokens,
                "writer_prompt_tokens": w.usage.prompt_tokens, "answer_tokens": w.usage.completion_tokens}

    def cache(self, stream: str) -> dict:
        # NOTE: each pipeline publishes on a stream of its own: a stream's next version supersedes the last,
        # so pipelines sharing one would find each other's commits stale
        with self.lock:
            self.n += 1
            stream = f"{stream}-{self.n}"
        t0 = time.perf_counter()
        a = self.ask(self.doc, 1, {"publish": {"stream": stream}})
        t1 = time.perf_counter()
        pub = kv(a)["publish"]
        messages = self.doc + [{"role": "assistant", "content": a.choices[0].message.content},
                               {"role": "user", "content": QUESTION}]
        w = self.ask(messages, self.k, {"attach": pub["commit"], "mode": "full"})
        t2 = time.perf_counter()
        rec = kv(w)["attach"]
        return {"s": t2 - t0, "analyst_s": t1 - t0, "writer_s": t2 - t1, "commit": pub["commit"],
                "commit_tokens": pub["tokens"], "commit_bytes": pub["bytes"], "publish_timings": pub["timings"],
                "attach_timings": rec["timings"], "path": rec["path"], "imported_tokens": rec["imported_tokens"],
                "writer_prompt_tokens": w.usage.prompt_tokens, "writer_cached_tokens":
                    w.usage.prompt_tokens_details.cached_tokens, "answer_tokens": w.usage.completion_tokens}

    def load(self, run, concurrency: int, duration: float) -> dict:
        """``concurrency`` threads running ``run()`` back to back for ``duration`` seconds."""
        lat, errors, lock = [], [], threading.Lock()
        stop = time.monotonic() + duration

        def worker():
            while time.monotonic() < stop:
                t0 = time.perf_counter()
                try:
                    run()
                except Exception as e:  # noqa: BLE001 - counted and reported
                    with lock:
                        errors.append(repr(e)[:200])
                    continue
                with lock:
                    lat.append(time.perf_counter() - t0)

        t0 = time.perf_counter()
        threads = [threading.Thread(target=worker) for _ in range(concurrency)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        wall = time.perf_counter() - t0
        return {"pipelines": len(lat), "wall_s": wall, "per_s": len(lat) / wall, "p50_s": pct(lat, 0.5),
                "p99_s": pct(lat, 0.99), "errors": len(errors), "first_errors": errors[:3]}

    def decode_once(self, tokens: int = 128) -> float:
        """One stream's decode throughput, tokens per second, over one ``tokens``-token reply."""
        t0 = time.perf_counter()
        r = self.ask([{"role": "user", "content": "Count slowly from one, in words."}], tokens)
        return r.usage.completion_tokens / (time.perf_counter() - t0)


LEGS = ((True, True), (False, False), (True, False), (False, True), (True, True))  # (connector, middleware)


def unused_cost(model: Path, root: Path, store: str, args, repeats: int = 9) -> dict:
    """Decode throughput of one stream on a server with the connector and its middleware loaded (no c2c fields
    sent), then without either, with the connector alone, with the middleware alone, and with both again (the
    first and last legs: a drift of the machine shows as their difference), one server at a time: vLLM's CPU
    workers bind and spin on the cores, so two servers up at once measure each other. The middle legs tell
    which of the two a difference comes from."""
    legs = []
    for i, (connector, middleware) in enumerate(LEGS):
        # like for like: vLLM reserves one more core for the engine when any KV connector is configured (a NIXL
        # P/D provision); on 2 cores that reserves none, and the worker runs 2 threads instead of 1. So every leg
        # gets the same reservation, and its log's thread binding is recorded.
        srv = VllmProcess(model, root / f"home-unused-{i}", store=store, domain="bench", name="m", dtype=args.dtype,
                          kv_cache_gb=2, max_model_len=4096, connector=connector, middleware=middleware,
                          extra_args=block_args(args),
                          env={"VLLM_CPU_NUM_OF_RESERVED_CPU": str(args.reserved_cpus)}).start()
        try:
            p = Pipelines(srv, "", args.answer_tokens)
            p.ask([{"role": "user", "content": "Say hi."}], 4)
            p.decode_once()  # warm-up
            load = os.getloadavg()[0]
            runs = [p.decode_once() for _ in range(repeats)]
            legs.append({"connector": connector, "middleware": middleware, "tokens_per_s": statistics.median(runs),
                         "runs": runs, "load_avg": [load, os.getloadavg()[0]], "worker_cores": worker_cores(srv)})
        finally:
            srv.stop()
        print(f"unused: connector={connector} middleware={middleware} {legs[-1]['tokens_per_s']:.2f} tokens/s",
              file=sys.stderr, flush=True)
    with_rate = (legs[0]["tokens_per_s"] + legs[-1]["tokens_per_s"]) / 2
    return {"legs": legs, "reserved_cpus": args.reserved_cpus,
            "same_worker_cores": len({str(x["worker_cores"]) for x in legs}) == 1, "with_connector_tokens_per_s": with_rate, "without_tokens_per_s": legs[1]["tokens_per_s"],
            "connector_only_tokens_per_s": legs[2]["tokens_per_s"], "middleware_only_tokens_per_s": legs[3]["tokens_per_s"],
            "drift": legs[-1]["tokens_per_s"] / legs[0]["tokens_per_s"] - 1,
            "cost": 1 - with_rate / legs[1]["tokens_per_s"]}


def worker_cores(server: VllmProcess) -> list[int] | None:
    """The cores vLLM bound its CPU worker's OpenMP threads to, from the server's log (``core ids=[...]``)."""
    found = re.findall(r"local_rank=0, core ids=\[([0-9, ]*)\]", server.log())
    return [int(x) for x in found[-1].split(",") if x.strip()] if found else None


def portable(cmd: list[str], model: Path, root: Path, name: str) -> list[str]:
    """The server's command line without this machine's paths: the model as ``$C2C_HOME/models/NAME``, the
    run's temporary folder as ``$RUN``."""
    return [a.replace(str(model), f"$C2C_HOME/models/{name}").replace(str(root), "$RUN") for a in cmd]


def document_of(server: VllmProcess, n: int) -> str:
    """About ``n`` tokens of real text, cut with the server's own tokenizer."""
    root = server.base_url.rsplit("/v1", 1)[0]
    ids = httpx.post(f"{root}/tokenize", json={"model": "m", "prompt": corpus_text()[: n * 8],
                                               "add_special_tokens": False}, timeout=60).json()["tokens"]
    return httpx.post(f"{root}/detokenize", json={"model": "m", "tokens": ids[:n]}, timeout=60).json()["prompt"]


def block_args(args) -> tuple[str, ...]:
    """vLLM's ``--block-size`` when one is asked for (vLLM's default otherwise)."""
    return ("--block-size", str(args.block_size)) if args.block_size else ()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="Qwen2.5-Coder-0.5B-Instruct")
    ap.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    ap.add_argument("--block-size", type=int, default=None,
                    help="vLLM's KV block size (default: vLLM's own; its CPU kernels want a multiple of 32)")
    ap.add_argument("--lengths", default="64,128,256")
    ap.add_argument("--context-tokens", type=int, default=512)
    ap.add_argument("--answer-tokens", type=int, default=16)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--duration", type=float, default=60.0)
    ap.add_argument("--load-length", type=int, default=256, help="message tokens of the text pipelines under load")
    ap.add_argument("--out", default=str(RESULTS / "vllm"))
    ap.add_argument("--reserved-cpus", type=int, default=1,
                    help="VLLM_CPU_NUM_OF_RESERVED_CPU for every leg of the unused cost (default 1: vLLM's own "
                         "reservation without a connector; with one it reserves a core more)")
    ap.add_argument("--unused-only", action="store_true",
                    help="measure only the connector's unused cost, into the existing results file")
    ap.add_argument("--render", action="store_true", help="rewrite the .md and .png from the .json, measuring nothing")
    args = ap.parse_args()
    model = c2c_home() / "models" / args.model
    root = Path(tempfile.mkdtemp(prefix="c2c-vllm-bench-"))
    store = f"sqlite:///{root}/store"
    if args.render:
        return finish(json.loads(Path(args.out).with_suffix(".json").read_text()), args)
    if args.unused_only:
        out = json.loads(Path(args.out).with_suffix(".json").read_text())
        out["unused"] = unused_cost(model, root, store, args)
        return finish(out, args)
    out: dict = {"model": args.model, "dtype": args.dtype, "block_size": args.block_size,
                 "context_tokens": args.context_tokens,
                 "answer_tokens": args.answer_tokens, "repeats": args.repeats, "machine": results.machine(), "points": []}
    server = VllmProcess(model, root / "home", store=store, domain="bench", name="m", dtype=args.dtype,
                         kv_cache_gb=2, max_model_len=4096, extra_args=block_args(args))
    out["flags"] = portable(server.cmd[1:], model, root, args.model)
    server.start()
    try:
        p = Pipelines(server, document_of(server, args.context_tokens), args.answer_tokens)
        p.text(8)  # the first requests warm vLLM's lazy paths
        p.cache("warmup")
        for n in [int(x) for x in args.lengths.split(",")]:
            texts = [p.text(n) for _ in range(args.repeats)]
            caches = [p.cache(f"bench-{n}") for _ in range(args.repeats)]
            row = {"message_tokens_asked": n, "text": texts[len(texts) // 2], "cache": caches[len(caches) // 2],
                   "text_s": statistics.median(t["s"] for t in texts),
                   "cache_s": statistics.median(c["s"] for c in caches)}
            row["ratio"] = row["text_s"] / row["cache_s"]
            out["points"].append(row)
            print(f"N={n}: text {row['text_s']:.2f}s cache {row['cache_s']:.2f}s ratio {row['ratio']:.2f}",
                  file=sys.stderr, flush=True)
        with open_store(store) as s:
            fp = Artifact.decode(s.in_domain("bench").get(out["points"][0]["cache"]["commit"]).data).header.fingerprint
        out["engine"] = str(fp.backend)
        n = args.load_length
        out["load"] = {"concurrency": args.concurrency, "duration_s": args.duration, "message_tokens": n,
                       "text": p.load(lambda: p.text(n), args.concurrency, args.duration),
                       "cache": p.load(lambda: p.cache("bench-load"), args.concurrency, args.duration)}
        out["load"]["ratio"] = out["load"]["cache"]["per_s"] / max(out["load"]["text"]["per_s"], 1e-9)
        print(f"load: {out['load']['text']['per_s']:.3f} vs {out['load']['cache']['per_s']:.3f} pipelines/s",
              file=sys.stderr, flush=True)
    finally:
        server.stop()
    out["unused"] = unused_cost(model, root, store, args)
    return finish(out, args)


def finish(out: dict, args) -> int:
    at256 = next((x for x in out["points"] if x["message_tokens_asked"] == 256), None)
    out["acceptance"] = {"cache_5x_at_256": None if at256 is None else at256["ratio"] >= 5,
                         "load_3x": out["load"]["ratio"] >= 3, "unused_le_5pct": out["unused"]["cost"] <= 0.05}
    return results.write(Path(args.out), out, markdown(out), plot=lambda png: plot(out, png))


def markdown(out: dict) -> str:
    m = out["machine"]
    lines = [f"# The two-agent pipeline on vLLM: text vs c2c's KV connector ({out['model']}, {out['dtype']})", "",
             f"CPU: {m['cpu']} ({m['cores']} cores; AMX-BF16 {'yes' if m['amx_bf16'] else 'no'}; load average "
             f"at start {m['load_avg'][0]:.1f}). Engine: `{out.get('engine', '?')}`.", "",
             f"Flags: `{' '.join(out['flags'][1:])}`", "",
             f"Document {out['context_tokens']} tokens, answer {out['answer_tokens']} tokens, median of "
             f"{out['repeats']} runs.", "",
             "| message tokens | text s | cache s | text / cache | text: analyst / writer s | "
             "cache: analyst (+publish) / writer (+attach) s | imported |", "|---|---|---|---|---|---|---|"]
    for p in out["points"]:
        t, c = p["text"], p["cache"]
        lines.append(f"| {p['message_tokens_asked']} | {p['text_s']:.2f} | {p['cache_s']:.2f} | {p['ratio']:.2f}x | "
                     f"{t['analyst_s']:.2f} / {t['writer_s']:.2f} | {c['analyst_s']:.2f} / {c['writer_s']:.2f} | "
                     f"{c['imported_tokens']} of {c['writer_prompt_tokens']} |")
    ld = out["load"]
    lines += ["", f"Under load ({ld['concurrency']} pipelines at once, {ld['duration_s']:.0f} s each way, "
                  f"{ld['message_tokens']}-token messages):", "",
              "| | pipelines/s | p50 s | p99 s | errors |", "|---|---|---|---|---|"]
    for k in ("text", "cache"):
        x = ld[k]
        lines.append(f"| {k} | {x['per_s']:.3f} | {x['p50_s'] or 0:.2f} | {x['p99_s'] or 0:.2f} | {x['errors']} |")
    u = out["unused"]
    lines += ["", f"Cache / text under load: {ld['ratio']:.2f}x.", "",
              "The connector unused (one stream decoding 128 tokens, no c2c fields; one server at a time, in the "
              f"order below; median of {len(u['legs'][0]['runs'])} runs each):", "",
              "| leg | KV connector | API middleware | decode tokens/s | load average | worker cores |",
              "|---|---|---|---|---|---|",
              *(f"| {i + 1} | {'yes' if x['connector'] else 'no'} | {'yes' if x['middleware'] else 'no'} | "
                f"{x['tokens_per_s']:.2f} | {x['load_avg'][0]:.1f} | {x.get('worker_cores', 'not recorded')} |"
                for i, x in enumerate(u["legs"])), "",
              *([f"Every leg ran with `VLLM_CPU_NUM_OF_RESERVED_CPU={u['reserved_cpus']}`"
                 f"{', and vLLM bound its worker to the same cores in each' if u.get('same_worker_cores') else ''}"
                 ". Without it the legs differ in more than c2c: vLLM 0.32 reserves one more core for its engine "
                 "when any KV connector is configured (`vllm/utils/ompmultiprocessing.py`, a provision for NIXL's "
                 "prefill/decode split); on 2 cores that reservation covers every core, so vLLM reserves none and "
                 "its worker runs 2 threads where it runs 1 without a connector. Runs before this flag compared "
                 "those two layouts, and their 'cost' was negative.", ""] if "reserved_cpus" in u else []),
              f"With both loaded: {u['with_connector_tokens_per_s']:.2f} tokens/s (the mean of the first and last "
              f"legs; drift between them {100 * u['drift']:+.1f}%), {u['without_tokens_per_s']:.2f} without: cost "
              f"**{100 * u['cost']:.1f}%**. The middle legs load one part alone: the connector alone "
              f"{u['connector_only_tokens_per_s']:.2f}, the middleware alone {u['middleware_only_tokens_per_s']:.2f}.",
              "",
              *(["A negative cost: this vLLM decoded faster with c2c loaded than without it, in legs whose worker "
                 "threads were not pinned alike (see above).", ""] if u["cost"] < -0.05 and "reserved_cpus" not in u
                else []),
              "Acceptance: " + ", ".join(f"{k} {'yes' if v else 'NO'}" for k, v in out["acceptance"].items()), ""]
    return "\n".join(lines)


def plot(out: dict, png: Path) -> None:
    try:
        import matplotlib  # lazy: plotting is optional (the plot extra)

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt  # lazy: as above
    except ImportError:
        return
    ns = [p["message_tokens_asked"] for p in out["points"]]
    fig, ax = plt.subplots(figsize=(6, 3.5))
    w = 0.38
    ax.bar([i - w / 2 for i in range(len(ns))], [p["text_s"] for p in out["points"]], w, label="text")
    ax.bar([i + w / 2 for i in range(len(ns))], [p["cache_s"] for p in out["points"]], w, label="c2c cache")
    ax.set_xticks(range(len(ns)), [str(n) for n in ns])
    ax.set_xlabel("message tokens")
    ax.set_ylabel("pipeline seconds")
    ax.set_title(f"vLLM {out['model']} ({out['dtype']})")
    ax.legend()
    fig.tight_layout()
    fig.savefig(png, dpi=120)


if __name__ == "__main__":
    sys.exit(main())
