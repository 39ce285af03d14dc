"""Load and faults: concurrent agents hand off caches between two `c2c serve` processes sharing one Redis.

    .venv/bin/python benchmarks/serve_load.py                  # 16 clients, 120 s, tiny-qwen2
    .venv/bin/python benchmarks/serve_load.py --duration 30 --clients 4

Every client thread (the openai client, no retries) loops: publish a short analyst
session on one server, then attach the acknowledged commit on the other server (mode
auto) as a writer; both with max_tokens <= 8. Redis runs with appendonly yes and
appendfsync always. At 1/3 of the run redis-server is restarted (SIGTERM, then started
on the same port and directory); at 2/3 one `c2c serve` is SIGKILLed and started again on
the same port. Every response is recorded (status, latency, commit); afterwards every
acknowledged commit is read back from the store and a sample through both servers' HTTP.

Outputs benchmarks/results/serve_load.{json,md} (or --out PREFIX).
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
    ap.add_argument("--out", default=str(RESULTS / "serve_load"))
    args = ap.parse_args()

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
    prefix = Path(args.out)
    prefix.parent.mkdir(parents=True, exist_ok=True)
    prefix.with_suffix(".json").write_text(json.dumps({**out, "rows": rows}, indent=1) + "\n")
    prefix.with_suffix(".md").write_text(markdown(out))
    print(markdown(out))
    return 0


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


if __name__ == "__main__":
    sys.exit(main())
