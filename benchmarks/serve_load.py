"""Load and faults: concurrent agents hand off caches between two `c2c serve` processes sharing one Redis;
and two tenants on one server (``--two-tenant``).

    .venv/bin/python benchmarks/serve_load.py                  # 16 clients, 120 s, tiny-qwen2
    .venv/bin/python benchmarks/serve_load.py --duration 30 --clients 4
    .venv/bin/python benchmarks/serve_load.py --two-tenant     # SmolLM2-135M, 2 x 90 s

Every client thread (the openai client, no retries) loops: publish a short analyst
session on one server, then attach the acknowledged commit on the other server (mode
auto) as a writer; both with max_tokens <= 8. Redis runs with appendonly yes and
appendfsync always. At 1/3 of the run redis-server is restarted (SIGTERM, then started
on the same port and directory); at 2/3 one `c2c serve` is SIGKILLed and started again on
the same port. Every response is recorded (status, latency, commit); afterwards every
acknowledged commit is read back from the store and a sample through both servers' HTTP.

Outputs benchmarks/results/serve_load.{json,md} (or --out PREFIX).

``--two-tenant``: one `c2c serve` (a real zoo model, ``--model``), two trust domains.
Tenant ``short`` sends one short request (max_tokens 8, a session, every 4th one
published) every ``--pace`` seconds, alone for ``--phase`` seconds, then for another
``--phase`` seconds while tenant ``flood`` runs ``--flooders`` clients (one agent each)
sending long requests (max_tokens 128, each published) back to back. End-of-turn tokens
are banned, so every request generates exactly max_tokens. Afterwards every acknowledged
commit is read back through ``GET /v1/c2c/commits/{id}`` with its owner's token. Reports
the short tenant's p50/p99 alone and under flood, 5xx, and the machine's load.

NOTE: the short tenant is a light one: alone it keeps the model busy a fraction of the
time (reported as its model share). A tenant that kept the model busy all the time alone
gets half of it under a fair flood, so its latency doubles whatever the scheduler.
Outputs benchmarks/results/serve_two_tenant.{json,md} (or --out PREFIX).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import signal
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path

import httpx
import openai

sys.path.insert(0, str(Path(__file__).resolve().parent))
from serve import RESULTS, TOKENS, Serve, c2c_field, make_home, write_tokens  # noqa: E402

from c2c.bench import results  # noqa: E402

SYSTEM = {"role": "system", "content": "You are one agent of a two-agent team. Be brief."}
QUESTION = {"role": "user", "content": "What happened, in a few words?"}


def pct(xs, q):
    if not xs:
        return None
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(q * (len(xs) - 1))))]


class Recorder:
    def __init__(self, t0: float):
        self.t0, self.rows, self.events = t0, [], []
        self.lock = threading.Lock()

    def event(self, name: str, **kw) -> None:
        with self.lock:
            self.events.append({"t": time.perf_counter() - self.t0, "event": name, **kw})
            print(f"[{self.events[-1]['t']:7.2f}s] {name} {kw or ''}", file=sys.stderr, flush=True)

    def add(self, row: dict) -> None:
        with self.lock:
            self.rows.append(row)


def call(rec: Recorder, client: openai.OpenAI, server: int, kind: str, messages, c2c: dict, max_tokens: int):
    t0 = time.perf_counter()
    row = {"t": t0 - rec.t0, "server": server, "kind": kind, "status": None, "error": None, "commit": None,
           "used": None}
    body = None
    try:
        raw = client.chat.completions.with_raw_response.create(
            model="tiny-qwen2", messages=messages, max_tokens=max_tokens, temperature=0, extra_body={"c2c": c2c})
        row["status"] = raw.status_code
        body = raw.parse()
        f = c2c_field(body)
        row["commit"] = (f.get("publish") or {}).get("commit")
        row["used"] = ",".join(a["path"] for a in f.get("attach") or []) or None
    except openai.APIStatusError as e:
        row["status"] = e.status_code
        b = e.body if isinstance(e.body, dict) else {}
        row["error"] = f"{b.get('c2c_error') or b.get('code') or type(e).__name__}: {str(b.get('message', e))[:200]}"
    except openai.APIConnectionError as e:  # includes APITimeoutError: no HTTP status at all
        row["error"] = f"{type(e).__name__}: {str(e.__cause__ or e)[:200]}"
    row["latency_s"] = time.perf_counter() - t0
    rec.add(row)
    return row


def client_loop(i: int, servers: list[Serve], rec: Recorder, deadline: float, max_tokens: int) -> None:
    clients = [{a: s.client(a, timeout=30) for a in ("analyst", "writer")} for s in servers]
    k = 0
    while time.perf_counter() < deadline:
        src = (i + k) % 2
        dst = 1 - src
        evidence = {"role": "user", "name": "evidence", "content": f"Evidence {i}.{k}: deploy {k} failed on host {i}."}
        r = call(rec, clients[src]["analyst"], src, "publish", [SYSTEM, evidence],
                 {"session": f"a{i}-{k}", "publish": {"stream": f"load-{i}"}}, max_tokens)
        if r["commit"] and time.perf_counter() < deadline:
            call(rec, clients[dst]["writer"], dst, "attach", [SYSTEM, QUESTION],
                 {"session": f"w{i}-{k}", "attach": [r["commit"]], "mode": "auto"}, max_tokens)
        elif r["status"] is None:
            time.sleep(0.05)  # connection refused: the server is down; do not spin
        k += 1


def window(rows, start, end):
    return [r for r in rows if r["t"] + r["latency_s"] >= start and r["t"] <= end]


def summarize(rows):
    ok = [r for r in rows if r["status"] == 200]
    return {"requests": len(rows), "ok": len(ok),
            "status": dict(Counter(str(r["status"]) for r in rows if r["status"] is not None)),
            "connection_errors": sum(r["status"] is None for r in rows),
            "errors": dict(Counter(r["error"].split(":")[0] for r in rows if r["error"])),
            "p50_ms": None if not ok else 1e3 * pct([r["latency_s"] for r in ok], 0.5),
            "p99_ms": None if not ok else 1e3 * pct([r["latency_s"] for r in ok], 0.99)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--duration", type=float, default=120.0)
    ap.add_argument("--clients", type=int, default=16)
    ap.add_argument("--max-tokens", type=int, default=8, choices=range(1, 9), metavar="1..8")
    ap.add_argument("--out", default=None, help="output prefix (default results/serve_load or serve_two_tenant)")
    ap.add_argument("--two-tenant", action="store_true", help="the two-tenant run (see above) instead")
    ap.add_argument("--model", default="SmolLM2-135M-Instruct", help="--two-tenant: the zoo model served")
    ap.add_argument("--phase", type=float, default=90.0, help="--two-tenant: seconds of each phase")
    ap.add_argument("--pace", type=float, default=2.0, help="--two-tenant: seconds between short requests")
    ap.add_argument("--flooders", type=int, default=3, help="--two-tenant: concurrent long-request clients")
    ap.add_argument("--flood-prompt-words", type=int, default=0, metavar="W",
                    help="--two-tenant: the flood sends long prompts of about W words (a new session each: all "
                         "prefilled) instead of long answers; its max_tokens is then 8 unless --flood-max-tokens")
    ap.add_argument("--flood-max-tokens", type=int, default=None, help="--two-tenant: the flood's max_tokens")
    ap.add_argument("--backend", default=None, choices=["transformers", "llama.cpp"],
                    help="--two-tenant: the server's --backend (default: the server's default, transformers)")
    ap.add_argument("--prefill-chunk", type=int, default=None, metavar="N",
                    help="--two-tenant: the server's --prefill-chunk (default: the server's default)")
    args = ap.parse_args()
    if args.two_tenant:
        return two_tenant(args)
    args.out = args.out or str(RESULTS / "serve_load")

    from c2c.store import open_store
    from c2c.testing import RedisServer

    root = Path(tempfile.mkdtemp(prefix="c2c-serve-load-"))
    redis = RedisServer(root / "redis", appendonly=True, appendfsync="always").start()
    url = redis.url(domain="research")
    home = make_home(root)
    tokens = write_tokens(root / "tokens.json")
    sargs = ("--model", "tiny-qwen2", "--tokens", str(tokens), "--store", url)
    servers = [Serve(home, *sargs, log_dir=root) for _ in range(2)]
    for s in servers:
        s.start()
    t0 = time.perf_counter()
    rec = Recorder(t0)
    deadline = t0 + args.duration
    threads = [threading.Thread(target=client_loop, args=(i, servers, rec, deadline, args.max_tokens), daemon=True)
               for i in range(args.clients)]
    rec.event("clients start", clients=args.clients)
    for t in threads:
        t.start()
    chaos: dict = {}
    try:
        time.sleep(max(0.0, t0 + args.duration / 3 - time.perf_counter()))
        rec.event("redis stop")
        chaos["redis_stop"] = time.perf_counter() - t0
        redis.stop()
        rec.event("redis stopped")
        redis.start()
        chaos["redis_up"] = time.perf_counter() - t0
        rec.event("redis up", port=redis.port)
        time.sleep(max(0.0, t0 + 2 * args.duration / 3 - time.perf_counter()))
        chaos["kill"] = time.perf_counter() - t0
        rec.event("SIGKILL server 1", port=servers[1].port)
        servers[1].stop(signal.SIGKILL)
        servers[1].start()
        chaos["server_up"] = time.perf_counter() - t0
        rec.event("server 1 up", port=servers[1].port)
        for t in threads:
            t.join(timeout=max(1.0, deadline - time.perf_counter() + 60))
        rec.event("clients done")
        elapsed = time.perf_counter() - t0
        rows = sorted(rec.rows, key=lambda r: r["t"])
        acked = [r["commit"] for r in rows if r["commit"]]
        # --- every acknowledged commit, read back ---------------------------
        missing, bad = [], []
        with open_store(url) as store:
            for cid in acked:
                try:
                    c = store.get(cid, allow_stale=True)  # superseded versions stay readable
                    if not c.data:
                        bad.append(cid)
                except Exception as e:  # noqa: BLE001 - report whatever the store said
                    missing.append(f"{cid}: {type(e).__name__}: {e}")
        http_checked, http_failed = 0, []
        for j, cid in enumerate(acked[:: max(1, len(acked) // 40)]):
            s = servers[j % 2]
            resp = httpx.get(s.url(f"/v1/c2c/commits/{cid}"), headers={"Authorization": f"Bearer {TOKENS['writer'][0]}"},
                             timeout=30)
            http_checked += 1
            if resp.status_code != 200:
                http_failed.append(f"{cid} via server {j % 2}: {resp.status_code} {resp.text[:200]}")
    finally:
        for s in servers:
            s.stop()
        redis.stop()
    ok = [r for r in rows if r["status"] == 200]
    five = [r for r in rows if r["status"] is not None and r["status"] >= 500]
    redis_w = (chaos["redis_stop"], chaos["redis_up"] + 1.0)
    kill_w = (chaos["kill"], chaos["server_up"] + 1.0)
    faulted = {id(r) for r in window(rows, *redis_w) + window(rows, *kill_w)}
    logs = {}
    for n, s in enumerate(servers):
        text = s.log()
        hits = [ln for ln in text.splitlines() if re.search(r'" 5\d\d|Traceback|ERROR|Error', ln)]
        logs[f"server{n}"] = {"file": s.log_path.name, "error_lines": hits[:60], "error_line_count": len(hits)}
    out = {
        "config": {"clients": args.clients, "duration_s": args.duration, "max_tokens": args.max_tokens,
                   "model": "tiny-qwen2", "servers": 2, "redis": "appendonly yes, appendfsync always"},
        "elapsed_s": elapsed, "chaos": chaos, "events": rec.events,
        "overall": summarize(rows),
        "throughput_rps": len(ok) / elapsed,
        "handoffs_per_s": sum(r["kind"] == "attach" and r["status"] == 200 for r in rows) / elapsed,
        "by_kind": {k: summarize([r for r in rows if r["kind"] == k]) for k in ("publish", "attach")},
        "attach_used": dict(Counter(r["used"] for r in rows if r["kind"] == "attach" and r["status"] == 200)),
        "five_xx": len(five), "five_xx_rows": five[:50],
        "connection_errors": sum(r["status"] is None for r in rows),
        "during_redis_restart": {"window_s": redis_w, **summarize(window(rows, *redis_w)),
                                 "samples": [r for r in window(rows, *redis_w) if r["status"] != 200][:20]},
        "during_server_kill": {"window_s": kill_w, **summarize(window(rows, *kill_w)),
                               "killed_server": summarize([r for r in window(rows, *kill_w) if r["server"] == 1]),
                               "other_server": summarize([r for r in window(rows, *kill_w) if r["server"] == 0])},
        "outside_faults": summarize([r for r in rows if id(r) not in faulted]),
        "verify": {"acknowledged": len(acked), "unique": len(set(acked)), "readable": len(acked) - len(missing)
                   - len(bad), "missing": missing[:50], "empty": bad[:50], "http_checked": http_checked,
                   "http_failed": http_failed[:20]},
        "server_logs": logs,
        "command": "python benchmarks/serve_load.py " + " ".join(sys.argv[1:]),
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(), "platform": platform.platform()},
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    out["acceptance"] = {"zero_5xx": out["five_xx"] == 0,
                         "every_acknowledged_commit_readable": not missing and not bad and not http_failed}
    return results.write(args.out, {**out, "rows": rows}, markdown(out))


def _fmt(x, f="{:.1f}"):
    return "–" if x is None else f.format(x)


def markdown(r: dict) -> str:
    c, o = r["config"], r["overall"]
    lines = [f"# `c2c serve` under load and faults ({c['model']}, {c['servers']} servers, shared Redis)", "",
             f"`{r['command']}` — {r['created']}, {r['machine']['cpus']} CPUs. {c['clients']} client threads "
             f"(openai client, no retries) for {c['duration_s']:.0f} s, each looping publish (one server) → attach "
             f"(the other, mode auto), max_tokens {c['max_tokens']}. Redis: {c['redis']}. Redis restarted at "
             f"{r['chaos']['redis_stop']:.1f} s (up again at {r['chaos']['redis_up']:.1f} s); server 1 SIGKILLed "
             f"at {r['chaos']['kill']:.1f} s (serving again at {r['chaos']['server_up']:.1f} s).", "",
             "| requests | 200 | throughput (200/s) | handoffs/s | p50 | p99 | 5xx | connection errors |",
             "|---:|---:|---:|---:|---:|---:|---:|---:|",
             f"| {o['requests']} | {o['ok']} | {r['throughput_rps']:.1f} | {r['handoffs_per_s']:.1f} | "
             f"{_fmt(o['p50_ms'])} ms | {_fmt(o['p99_ms'])} ms | {r['five_xx']} | {r['connection_errors']} |", "",
             "| slice of the run | requests | statuses | connection errors | errors | p50 | p99 |",
             "|---|---:|---|---:|---|---:|---:|"]
    for name, s in (("publish", r["by_kind"]["publish"]), ("attach", r["by_kind"]["attach"]),
                    ("during redis restart (+1 s)", r["during_redis_restart"]),
                    ("during server kill (+1 s), killed server", r["during_server_kill"]["killed_server"]),
                    ("during server kill (+1 s), other server", r["during_server_kill"]["other_server"]),
                    ("outside both faults", r["outside_faults"])):
        lines.append(f"| {name} | {s['requests']} | {json.dumps(s['status'])} | {s['connection_errors']} | "
                     f"{json.dumps(s['errors'])} | {_fmt(s['p50_ms'])} ms | {_fmt(s['p99_ms'])} ms |")
    v = r["verify"]
    lines += ["", f"Attach paths used (200s): {json.dumps(r['attach_used'])}.", "",
              f"Verification: {v['acknowledged']} acknowledged commits ({v['unique']} unique), {v['readable']} "
              f"readable from the store after the run; {v['http_checked']} read through GET /v1/c2c/commits/{{id}}, "
              f"{len(v['http_failed'])} failed.", ""]
    if v["missing"] or v["empty"] or v["http_failed"]:
        lines += ["Unreadable:", "", *[f"- `{x}`" for x in (v["missing"] + v["empty"] + v["http_failed"])[:20]], ""]
    samples = r["during_redis_restart"]["samples"]
    if samples:
        lines += ["What the clients saw during the redis restart (first non-200 responses):", ""]
        lines += [f"- t={s['t']:.2f}s server {s['server']} {s['kind']}: status {s['status']}, {s['error']}"
                  for s in samples[:10]]
        lines.append("")
    if r["five_xx_rows"]:
        lines += ["5xx responses (first 10):", ""]
        lines += [f"- t={s['t']:.2f}s server {s['server']} {s['kind']}: {s['status']} {s['error']}"
                  for s in r["five_xx_rows"][:10]]
        lines.append("")
    for n, lg in r["server_logs"].items():
        if lg["error_lines"]:
            lines += [f"{n} log ({lg['error_line_count']} error lines; first 10):", "", "```",
                      *lg["error_lines"][:10], "```", ""]
    a = r["acceptance"]
    lines += ["## Acceptance", "", f"- zero 5xx responses: **{'PASS' if a['zero_5xx'] else 'FAIL'}** "
              f"({r['five_xx']})",
              f"- every acknowledged commit readable: **{'PASS' if a['every_acknowledged_commit_readable'] else 'FAIL'}**",
              ""]
    return "\n".join(lines)


# ------------------------------------------------------------------ two tenants on one server
TENANT_TOKENS = {"short": ("tok-short-0123456789abcdef", "tenant-short")}
TENANT_TOKENS.update({f"flood{i}": (f"tok-flood{i}-0123456789abcdef", "tenant-flood") for i in range(8)})
SHORT_TOKENS, LONG_TOKENS, PUBLISH_EVERY = 8, 128, 4


def end_of_turn_ids(model: str) -> list[int]:
    """The model's end-of-turn token ids (from its config files), to ban them."""
    from c2c.runtime.zoo import model_path

    ids: set[int] = set()
    for name in ("config.json", "generation_config.json"):
        f = model_path(model) / name
        if f.is_file():
            eos = json.loads(f.read_text()).get("eos_token_id")
            ids.update(eos if isinstance(eos, list) else [eos] if isinstance(eos, int) else [])
    return sorted(ids)


def tenant_call(rec: Recorder, client: openai.OpenAI, model: str, tenant: str, phase: str, messages, c2c: dict,
                max_tokens: int, bias: dict) -> dict:
    t0 = time.perf_counter()
    row = {"t": t0 - rec.t0, "tenant": tenant, "phase": phase, "status": None, "error": None, "commit": None,
           "completion_tokens": None, "queue_s": None}
    try:
        raw = client.chat.completions.with_raw_response.create(
            model=model, messages=messages, max_tokens=max_tokens, temperature=0, logit_bias=bias,
            extra_body={"c2c": c2c})
        row["status"] = raw.status_code
        body = raw.parse()
        f = c2c_field(body)
        row["commit"] = (f.get("publish") or {}).get("commit")
        row["completion_tokens"] = body.usage.completion_tokens
        row["prompt_tokens"] = body.usage.prompt_tokens
        row["queue_s"] = (f.get("timings") or {}).get("queue_s")
        row["timings"] = f.get("timings")
    except openai.APIStatusError as e:
        row["status"] = e.status_code
        b = e.body if isinstance(e.body, dict) else {}
        row["error"] = f"{b.get('type', type(e).__name__)}: {str(b.get('message', e))[:200]}"
    except openai.APIConnectionError as e:
        row["error"] = f"{type(e).__name__}: {str(e.__cause__ or e)[:200]}"
    row["latency_s"] = time.perf_counter() - t0
    rec.add(row)
    return row


def short_loop(rec, client, model, phase: str, end: float, pace: float, bias: dict) -> None:
    k, nxt = 0, time.perf_counter()
    while nxt < end:
        time.sleep(max(0.0, nxt - time.perf_counter()))
        q = {"role": "user", "content": f"Status check {phase} {k}: is host {k % 7} up? Answer briefly."}
        c2c = {"session": f"short-{phase}-{k}"}
        if k % PUBLISH_EVERY == 0:
            c2c["publish"] = {"stream": "short-status"}
        tenant_call(rec, client, model, "short", phase, [SYSTEM, q], c2c, SHORT_TOKENS, bias)
        k, nxt = k + 1, nxt + pace


def flood_loop(i: int, rec, client, model, end: float, bias: dict, prompt_words: int = 0,
               max_tokens: int = LONG_TOKENS) -> None:
    k = 0
    while time.perf_counter() < end:
        q = {"role": "user", "content": f"Write a detailed incident report number {k} about host {i}, "
                                        "covering timeline, impact, root cause and follow-ups."}
        if prompt_words:  # a long prompt, new every time (its own session): all of it is prefilled
            log = " ".join(f"host{(k * 31 + j) % 97} event{j} ok" for j in range(prompt_words // 3))
            q = {"role": "user", "content": f"Report {i}.{k}. Logs: {log}. Summarize."}
        r = tenant_call(rec, client, model, "flood", "flood", [SYSTEM, q],
                        {"session": f"flood{i}-{k}", "publish": {"stream": f"flood-{i}"}}, max_tokens, bias)
        if r["status"] is None:
            time.sleep(0.05)
        k += 1


def latency_summary(rows: list[dict]) -> dict:
    ok = [r["latency_s"] for r in rows if r["status"] == 200]
    return {"requests": len(rows), "ok": len(ok),
            "status": dict(Counter(str(r["status"]) for r in rows)),
            "p50_ms": None if not ok else 1e3 * pct(ok, 0.5), "p99_ms": None if not ok else 1e3 * pct(ok, 0.99),
            "max_ms": None if not ok else 1e3 * max(ok),
            "completion_tokens": dict(Counter(str(r["completion_tokens"]) for r in rows if r["status"] == 200)),
            "queue_p50_ms": None if not ok else 1e3 * pct([r["queue_s"] for r in rows if r["status"] == 200], 0.5)}


def cpu_info() -> dict:
    info = {"cpus": os.cpu_count(), "python": platform.python_version(), "platform": platform.platform()}
    try:
        text = Path("/proc/cpuinfo").read_text()
        info["model_name"] = next((ln.split(":", 1)[1].strip() for ln in text.splitlines()
                                   if ln.startswith("model name")), None)
        info["amx_bf16"] = "amx_bf16" in text
    except OSError:
        pass
    return info


def two_tenant(args) -> int:
    from c2c.testing import server_process as _serve

    root = Path(tempfile.mkdtemp(prefix="c2c-two-tenant-"))
    tokens = _serve.write_tokens(root / "tokens.json", TENANT_TOKENS)
    extra = (() if args.prefill_chunk is None else ("--prefill-chunk", str(args.prefill_chunk))) + \
        (() if args.backend is None else ("--backend", args.backend))
    server = _serve.ServeProcess(make_home(root), "--model", args.model, "--tokens", str(tokens), *extra,
                                 log_dir=root)
    server.start()

    def client(agent: str) -> openai.OpenAI:
        return openai.OpenAI(base_url=server.base_url, api_key=TENANT_TOKENS[agent][0], max_retries=0, timeout=300)

    bias = {str(t): -100 for t in end_of_turn_ids(args.model)}
    rec = Recorder(time.perf_counter())
    load: dict = {"before": os.getloadavg()}
    try:
        short = client("short")
        for k in range(3):  # warm-up, not counted
            short.chat.completions.create(model=args.model, messages=[SYSTEM, QUESTION], max_tokens=SHORT_TOKENS,
                                          temperature=0, logit_bias=bias)
        rec.event("phase alone")
        short_loop(rec, short, args.model, "alone", time.perf_counter() + args.phase, args.pace, bias)
        load["after_alone"] = os.getloadavg()
        rec.event("phase flood", flooders=args.flooders)
        end = time.perf_counter() + args.phase
        flood_tokens = args.flood_max_tokens or (SHORT_TOKENS if args.flood_prompt_words else LONG_TOKENS)
        flooders = [threading.Thread(target=flood_loop, args=(i, rec, client(f"flood{i}"), args.model, end, bias,
                                                              args.flood_prompt_words, flood_tokens),
                                     daemon=True) for i in range(args.flooders)]
        for t in flooders:
            t.start()
        time.sleep(2.0)  # the flood is under way before the short tenant's clock starts
        short_loop(rec, short, args.model, "flood", end, args.pace, bias)
        for t in flooders:
            t.join(timeout=600)
        load["after_flood"] = os.getloadavg()
        rec.event("done")
        # --- every acknowledged commit, read back by its owner ------------------
        acked = [(r["tenant"], r["commit"]) for r in rec.rows if r["commit"]]
        unreadable = []
        for tenant, cid in acked:
            agent = "short" if tenant == "short" else "flood0"  # any agent of the owner's domain
            resp = httpx.get(server.url(f"/v1/c2c/commits/{cid}"), timeout=60,
                             headers={"Authorization": f"Bearer {TENANT_TOKENS[agent][0]}"})
            if resp.status_code != 200:
                unreadable.append(f"{cid} ({tenant}): {resp.status_code} {resp.text[:200]}")
        metrics = httpx.get(server.url("/metrics"), timeout=30).text
    finally:
        server.stop()
    rows = sorted(rec.rows, key=lambda r: r["t"])
    log = server.log()
    five = [r for r in rows if r["status"] is not None and r["status"] >= 500]
    alone = latency_summary([r for r in rows if r["tenant"] == "short" and r["phase"] == "alone"])
    under = latency_summary([r for r in rows if r["tenant"] == "short" and r["phase"] == "flood"])
    flood = latency_summary([r for r in rows if r["tenant"] == "flood"])
    ratio = (under["p99_ms"] / alone["p99_ms"]) if alone["p99_ms"] and under["p99_ms"] else None
    out = {
        "config": {"model": args.model, "phase_s": args.phase, "pace_s": args.pace, "flooders": args.flooders,
                   "short_max_tokens": SHORT_TOKENS,
                   "long_max_tokens": args.flood_max_tokens or (SHORT_TOKENS if args.flood_prompt_words
                                                                else LONG_TOKENS),
                   "flood_prompt_words": args.flood_prompt_words, "prefill_chunk": args.prefill_chunk,
                   "backend": args.backend or "transformers",
                   "flood_prompt_tokens_p50": pct([r["prompt_tokens"] for r in rec.rows if r["tenant"] == "flood"
                                                   and r.get("prompt_tokens")], 0.5) if any(
                       r.get("prompt_tokens") for r in rec.rows if r["tenant"] == "flood") else None,
                   "short_publishes_every": PUBLISH_EVERY, "banned_end_of_turn": sorted(bias),
                   "server": "defaults (--max-queue 16, shares split between 2 domains, --fair-half-life 5), "
                             "C2C_THREADS=1"},
        "short_alone": alone, "short_under_flood": under, "flood": flood,
        "p50_ratio": (under["p50_ms"] / alone["p50_ms"]) if alone["p50_ms"] and under["p50_ms"] else None,
        "p99_ratio": ratio,
        "short_model_share_alone": sum((r.get("timings") or {}).get("total_s", 0) - (r["queue_s"] or 0) for r in rows
                                       if r["tenant"] == "short" and r["phase"] == "alone") / args.phase,
        "flood_tokens_per_s": sum(r["completion_tokens"] or 0 for r in rows if r["tenant"] == "flood"
                                  and r["status"] == 200) / args.phase,
        "five_xx": len(five), "five_xx_rows": five[:20],
        "connection_errors": sum(r["status"] is None for r in rows),
        "verify": {"acknowledged": len(acked), "by_tenant": dict(Counter(t for t, _ in acked)),
                   "unreadable": unreadable[:50]},
        "server_log_errors": [ln for ln in log.splitlines() if re.search(r'" 5\d\d|Traceback|ERROR', ln)][:40],
        "evictions": next((float(ln.split()[-1]) for ln in metrics.splitlines()
                           if ln.startswith("c2c_session_evictions_total")), None),
        "load_avg": load, "events": rec.events,
        "command": "python benchmarks/serve_load.py " + " ".join(sys.argv[1:]),
        "machine": cpu_info(), "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    out["acceptance"] = {"short_p99_under_flood_within_2x_alone": ratio is not None and ratio <= 2.0,
                         "zero_5xx": not five,
                         "every_acknowledged_commit_readable_by_its_owner": bool(acked) and not unreadable}
    return results.write(args.out or RESULTS / "serve_two_tenant", out, two_tenant_markdown(out), records=rows)


def two_tenant_markdown(r: dict) -> str:
    c, m = r["config"], r["machine"]
    lines = [f"# `c2c serve`, two tenants on one server ({c['model']}, {c.get('backend', 'transformers')} backend)", "",
             f"`{r['command']}` — {r['created']}. CPU: {m.get('model_name')}, {m['cpus']} CPUs, amx_bf16 "
             f"{'yes' if m.get('amx_bf16') else 'no'}. Load average (1, 5, 15 min) before "
             f"{_load(r['load_avg']['before'])}, after the alone phase {_load(r['load_avg']['after_alone'])}, "
             f"after the flood {_load(r['load_avg']['after_flood'])}.", "",
             f"Tenant `short` sends one request every {c['pace_s']:g} s (max_tokens {c['short_max_tokens']}, its own "
             f"session, every {c['short_publishes_every']}th published) for {c['phase_s']:g} s alone, then for "
             f"{c['phase_s']:g} s while tenant `flood` runs {c['flooders']} clients (one agent each) sending "
             f"max_tokens {c['long_max_tokens']} requests back to back, each published. End-of-turn tokens banned: "
             f"every reply is exactly max_tokens. Server: {c['server']}"
             + (f", --prefill-chunk {c['prefill_chunk']}" if c.get("prefill_chunk") is not None else "") + ".", "",
             *([f"The flood's prompts: about {c['flood_prompt_words']} words each "
                f"({_fmt(c.get('flood_prompt_tokens_p50'), '{:.0f}')} tokens, median), a new session every time, so "
                "each is prefilled whole.", ""] if c.get("flood_prompt_words") else []),
             "| | requests | statuses | p50 | p99 | max | queue p50 | completion tokens |",
             "|---|---:|---|---:|---:|---:|---:|---|"]
    for name, s in (("short, alone", r["short_alone"]), ("short, under flood", r["short_under_flood"]),
                    ("flood", r["flood"])):
        lines.append(f"| {name} | {s['requests']} | {json.dumps(s['status'])} | {_fmt(s['p50_ms'])} ms | "
                     f"{_fmt(s['p99_ms'])} ms | {_fmt(s['max_ms'])} ms | {_fmt(s['queue_p50_ms'])} ms | "
                     f"{json.dumps(s['completion_tokens'])} |")
    v, a = r["verify"], r["acceptance"]
    lines += ["", f"Short tenant under flood / alone: p50 x{_fmt(r['p50_ratio'], '{:.2f}')}, "
              f"p99 x{_fmt(r['p99_ratio'], '{:.2f}')}. Alone, the short tenant kept the model busy "
              f"{100 * r['short_model_share_alone']:.0f}% of the time. Flood tenant: "
              f"{r['flood_tokens_per_s']:.1f} completion tokens/s. 5xx: {r['five_xx']}; connection errors: "
              f"{r['connection_errors']}; session evictions: {_fmt(r['evictions'], '{:.0f}')}.", "",
              f"Verification: {v['acknowledged']} acknowledged commits ({json.dumps(v['by_tenant'])}), "
              f"{v['acknowledged'] - len(v['unreadable'])} read back by their owner through GET "
              "/v1/c2c/commits/{id}.", ""]
    if v["unreadable"]:
        lines += ["Unreadable:", "", *[f"- `{x}`" for x in v["unreadable"][:20]], ""]
    if r["server_log_errors"]:
        lines += ["Server log errors (first 10):", "", "```", *r["server_log_errors"][:10], "```", ""]
    lines += ["## Acceptance", "",
              f"- short tenant's p99 under flood within 2x of its p99 alone: "
              f"**{'PASS' if a['short_p99_under_flood_within_2x_alone'] else 'FAIL'}** "
              f"(x{_fmt(r['p99_ratio'], '{:.2f}')})",
              f"- zero 5xx: **{'PASS' if a['zero_5xx'] else 'FAIL'}** ({r['five_xx']})",
              f"- every acknowledged commit readable by its owner: "
              f"**{'PASS' if a['every_acknowledged_commit_readable_by_its_owner'] else 'FAIL'}**", ""]
    return "\n".join(lines)


def _load(xs) -> str:
    return ", ".join(f"{x:.2f}" for x in xs)


if __name__ == "__main__":
    sys.exit(main())
