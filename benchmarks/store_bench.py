"""Store benchmark: put + get of a 64 MB artifact vs raw disk I/O, and invalidation latency.

    .venv/bin/python benchmarks/store_bench.py            # writes benchmarks/results/store.{json,md,png}

What is measured, in one run, on one disk:

- **raw**: ``write`` + ``fsync`` + ``read`` of the artifact's bytes to a plain file
  in the same directory the stores use; the ceiling for any store.
- **sqlite://**: ``store.put(bytes)`` (decode-validate, hash, write + fsync the
  blob, commit the metadata) + ``store.get(id)`` (read, re-hash). Fresh store each rep.
- **redis://**: the same through a redis-server this script starts on loopback,
  each rep in a fresh trust domain: once with persistence off (the headline:
  Redis as the shared in-memory store), once with ``appendonly yes`` and
  ``appendfsync everysec`` (the durability the restart tests use; it writes
  every blob to the AOF as well).

Throughput is bytes / (put + get) seconds; the ratio to raw is what the
acceptance bars speak of (sqlite >= 50 %, redis >= 25 %). Medians over reps,
raw and store runs interleaved so drift hits all alike.

- **invalidation latency**: a 20-commit, 3-hop DAG in Redis; a subscriber in
  another process blocks on the event stream; the time from calling
  ``invalidate(root)`` until that subscriber holds an event for every one of
  the 20 commits. Both processes read CLOCK_MONOTONIC, which is system-wide.
- **10,000-commit DAG** (section ``dag``): a root, 100 children, 9,900 commits
  under those; the wall time of ``invalidate(root)`` on both backends, and for
  Redis every script run's server-side duration from SLOWLOG (logging every
  command), so the longest single script says how long the walk ever blocked
  the server.
- **blob read paths** (section ``readpaths``): the 64 MB put+get through
  ``c2c.store.redis.resp`` (the store's reader) against redis-py's own pipelined GETs,
  with its pure-Python parser and with hiredis (``--hiredis-path`` if the venv
  lacks it); one fresh process per run.

    .venv/bin/python benchmarks/store_bench.py --only dag,readpaths   # rerun two sections, keep the rest

- **chunked commits** (sections ``team``, ``conversation``, ``attach``, ``gigabyte``; #33):
  what sharing chunks saves, fetching only what a receiver lacks, and 1 GiB put/get
  throughput, each against the store before chunks in the same run
  (``benchmarks/store_sharing.py``).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


# ------------------------------------------------------------------ artifacts
def big_artifact(size_mb: int):
    """A float32 artifact of ``size_mb`` MiB of KV: 16 layers x 8 heads x 128 dims."""
    import torch

    from c2c.artifact import Artifact
    from c2c.artifact.fingerprint import Fingerprint
    from c2c.artifact.prefix import PrefixRef
    from c2c.runtime.kvcache import KVCache

    layers, heads, dim = 16, 8, 128
    seq = (size_mb << 20) // (layers * 2 * heads * dim * 4)
    g = torch.Generator().manual_seed(0)
    tokens = [int(t) for t in torch.randint(0, 32000, (seq,), generator=g)]
    # keys/values per layer: (1, heads, seq, dim)
    keys = tuple(torch.randn(1, heads, seq, dim, generator=g) for _ in range(layers))
    values = tuple(torch.randn(1, heads, seq, dim, generator=g) for _ in range(layers))
    fp = Fingerprint(architecture="llama", num_layers=layers, layer_types=("full_attention",) * layers,
                     kv_heads=heads, head_dim=dim, sliding_window=None, rope='{"theta":10000}', dtype="float32",
                     tokenizer_digest="a" * 64, weights_digest="b" * 64, model_name="bench-8x128")
    cache = KVCache(keys=keys, values=values, token_ids=tuple(tokens))
    return Artifact.build(cache, fingerprint=fp, prefix=PrefixRef.of(tokens[:16]), producer={"agent": "bench"})


def small_artifact(seed: int, parents=()) -> bytes:
    import torch

    from c2c.artifact import Artifact
    from c2c.artifact.fingerprint import Fingerprint
    from c2c.artifact.prefix import PrefixRef
    from c2c.runtime.kvcache import KVCache

    g = torch.Generator().manual_seed(seed)
    tokens = [int(t) for t in torch.randint(0, 32000, (16,), generator=g)]
    kv = lambda: tuple(torch.randn(1, 2, 16, 8, generator=g) for _ in range(2))  # noqa: E731  (1, 2, 16, 8)
    fp = Fingerprint(architecture="llama", num_layers=2, layer_types=("full_attention",) * 2, kv_heads=2,
                     head_dim=8, sliding_window=None, rope="{}", dtype="float32", tokenizer_digest="a" * 64,
                     weights_digest="b" * 64)
    cache = KVCache(keys=kv(), values=kv(), token_ids=tuple(tokens))
    return Artifact.build(cache, fingerprint=fp, prefix=PrefixRef.of(tokens[:4]), parents=tuple(parents),
                          labels={"seed": str(seed)}).encode()


# ----------------------------------------------------------------- redis-server
def start_redis(binary: str, directory: Path, *, aof: bool):
    """A loopback redis-server (c2c.testing's launcher: it leaves no process behind if it fails to start)."""
    from c2c.testing import RedisServer

    return RedisServer(directory, appendonly=aof, appendfsync="everysec", binary=binary).start()


def redis_version(server) -> str:
    with server.client() as r:
        return r.info("server")["redis_version"]


# ---------------------------------------------------------------- measurements
def raw_io(path: Path, data: bytes) -> dict:
    c0 = time.process_time()
    t0 = time.perf_counter()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    view, off = memoryview(data), 0
    while off < len(view):
        off += os.write(fd, view[off:])
    os.fsync(fd)
    os.close(fd)
    t1 = time.perf_counter()
    with open(path, "rb", buffering=0) as f:
        back = f.read()
    t2 = time.perf_counter()
    c2 = time.process_time()
    assert back == data
    os.unlink(path)
    return {"write_fsync_s": t1 - t0, "read_s": t2 - t1, "total_s": t2 - t0, "cpu_s": c2 - c0}


def store_io(url: str, data: bytes) -> dict:
    from c2c.store import open_store

    with open_store(url) as store:
        c0 = time.process_time()  # every thread of this process: the store's helpers too
        t0 = time.perf_counter()
        c = store.put(data, stream="bench")
        t1 = time.perf_counter()
        rec = store.get(c.id)
        t2 = time.perf_counter()
        c2 = time.process_time()
        assert rec.data == data
        store.delete_leaf(c.id)
    return {"put_s": t1 - t0, "get_s": t2 - t1, "total_s": t2 - t0, "cpu_s": c2 - c0}


def summarize(runs: list[dict], nbytes: int) -> dict:
    out = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
    out["throughput_MBps"] = nbytes / out["total_s"] / 1e6
    out["runs"] = runs
    return out


def dag_20_3hops(store) -> tuple[str, list[str]]:
    """1 root, 4 at hop 1, 6 at hop 2, 9 at hop 3; a few commits have two parents."""
    seed = uuid.uuid4().int % 10**9
    layers = [[store.put(small_artifact(seed), stream="root").id]]
    for width in (4, 6, 9):
        above = layers[-1]
        row = []
        for i in range(width):
            parents = [above[i % len(above)]] + ([above[(i + 1) % len(above)]] if i % 3 == 0 and len(above) > 1 else [])
            seed += 1
            row.append(store.put(small_artifact(seed, parents), stream=f"h{len(layers)}-{i}").id)
        layers.append(row)
    ids = [c for row in layers for c in row]
    assert len(ids) == 20
    return layers[0][0], ids


def invalidation_latency(url: str, trials: int) -> dict:
    from c2c.store import open_store

    sub = subprocess.Popen([sys.executable, __file__, "--subscriber", url], stdin=subprocess.PIPE,
                           stdout=subprocess.PIPE, text=True, bufsize=1)
    assert sub.stdout.readline().strip() == "READY"
    store = open_store(url)
    results = []
    try:
        for _ in range(trials):
            root, ids = dag_20_3hops(store)
            sub.stdin.write(f"ROOT {root} {len(ids)}\n")
            assert sub.stdout.readline().strip() == "WAITING"
            time.sleep(0.05)  # let the subscriber sit in XREAD BLOCK
            t0 = time.monotonic()
            events = store.invalidate(root, reason="bench")
            t_ack = time.monotonic()
            done = sub.stdout.readline().split()
            assert done[0] == "DONE", done
            t_last = float(done[1])
            assert {e.commit for e in events} == set(ids)
            assert all(store.show(c).stale for c in ids)
            results.append({"reach_all_s": t_last - t0, "invalidate_call_s": t_ack - t0})
    finally:
        sub.stdin.write("QUIT\n")
        sub.stdin.close()
        sub.wait(timeout=30)
        store.close()
    reach = sorted(r["reach_all_s"] for r in results)
    return {"trials": trials, "commits": 20, "hops": 3,
            "median_ms": 1e3 * statistics.median(reach), "p95_ms": 1e3 * reach[int(0.95 * (len(reach) - 1))],
            "max_ms": 1e3 * reach[-1],
            "invalidate_call_median_ms": 1e3 * statistics.median(r["invalidate_call_s"] for r in results),
            "runs": results}


def subscriber(url: str) -> None:
    """Child process: block on the event stream and report when a whole invalidation has arrived."""
    from c2c.store import open_store

    store = open_store(url)
    cursor = (store.events(limit=1_000_000) or [None])[-1]
    cursor = cursor.seq if cursor else "0"
    print("READY", flush=True)
    for line in sys.stdin:
        parts = line.split()
        if parts[0] == "QUIT":
            break
        root, want = parts[1], int(parts[2])
        print("WAITING", flush=True)
        got: set[str] = set()
        while len(got) < want:
            for e in store.events(cursor, wait_s=5.0):
                cursor = e.seq
                if e.root == root:
                    got.add(e.commit)
        print(f"DONE {time.monotonic()!r}", flush=True)


# ---------------------------------------------------------- 10,000-commit DAG
def dag_artifacts(n: int) -> list[bytes]:
    """``n`` distinct small artifacts (one shared KV cache, a label apiece): ~0.1 ms each to build."""
    import torch

    from c2c.artifact import Artifact
    from c2c.artifact.fingerprint import Fingerprint
    from c2c.artifact.prefix import PrefixRef
    from c2c.runtime.kvcache import KVCache

    g = torch.Generator().manual_seed(7)
    tokens = [int(t) for t in torch.randint(0, 32000, (16,), generator=g)]
    kv = lambda: tuple(torch.randn(1, 2, 16, 8, generator=g) for _ in range(2))  # noqa: E731  (1, 2, 16, 8)
    fp = Fingerprint(architecture="llama", num_layers=2, layer_types=("full_attention",) * 2, kv_heads=2,
                     head_dim=8, sliding_window=None, rope="{}", dtype="float32", tokenizer_digest="a" * 64,
                     weights_digest="b" * 64)
    cache = KVCache(keys=kv(), values=kv(), token_ids=tuple(tokens))
    return [Artifact.build(cache, fingerprint=fp, prefix=PrefixRef.of(tokens[:4]), labels={"dag": str(i)}).encode()
            for i in range(n)]


def dag_10k(store, arts: list[bytes], hubs: int = 100) -> tuple[str, list[str]]:
    """A root, ``hubs`` children of it, and the rest spread under the hubs (every 10th under two)."""
    root = store.put(arts[0], stream="n0").id
    hub_ids = [store.put(arts[1 + h], stream=f"n{1 + h}", parents=[root]).id for h in range(hubs)]
    ids = [root, *hub_ids]
    for i in range(1 + hubs, len(arts)):
        h = i % hubs
        parents = [hub_ids[h]] + ([hub_ids[(h + 1) % hubs]] if i % 10 == 0 else [])
        ids.append(store.put(arts[i], stream=f"n{i}", parents=parents).id)
    return root, ids


def dag_invalidation(url: str, arts: list[bytes], redis_port: int | None = None) -> dict:
    """Invalidate the root of a 10,001-commit DAG; for Redis, the server-side time of its script runs.

    SLOWLOG logs every command slower than 1 ms with its duration (at 0 it would also log each command
    a script runs, which slows the scripts it measures); INFO commandstats gives the total.
    """
    from c2c.store import open_store

    store = open_store(url)
    t0 = time.perf_counter()
    root, ids = dag_10k(store, arts)
    build_s = time.perf_counter() - t0
    out: dict = {"commits": len(ids), "dependents": len(ids) - 1, "build_s": build_s}
    steps: list[dict] = []
    admin = None
    if redis_port is not None:
        import redis

        import c2c.store.redis.backend as redis_store

        admin = redis.Redis(port=redis_port)
        admin.config_set("slowlog-log-slower-than", SLOWLOG_US)
        admin.config_set("slowlog-max-len", 100_000)
        admin.slowlog_reset()
        admin.config_resetstat()
        real = store._step

        def timed_step(keys, args):
            s0 = time.perf_counter()
            res = real(keys=keys, args=args)
            steps.append({"children": len(keys) - 4, "call_s": time.perf_counter() - s0})
            return res

        store._step = timed_step
        out["walk_batch"] = redis_store.WALK_BATCH
    t0 = time.perf_counter()
    events = store.invalidate(root, reason="bench: 10k DAG")
    out["invalidate_s"] = time.perf_counter() - t0
    if admin is not None:
        log = admin.slowlog_get(-1)
        stats = admin.info("commandstats")
        admin.config_set("slowlog-log-slower-than", 10_000)
        is_script = [bytes(e["command"]).upper().startswith((b"EVALSHA", b"EVAL ")) for e in log]
        scripts = [e["duration"] for e, s in zip(log, is_script) if s]
        others = [e["duration"] for e, s in zip(log, is_script) if not s]
        evalsha = stats.get("cmdstat_evalsha", {})
        out.update(script_runs=int(evalsha.get("calls", 0)), total_script_ms=evalsha.get("usec", 0) / 1e3,
                   slowlog_threshold_ms=SLOWLOG_US / 1e3, scripts_over_threshold=len(scripts),
                   longest_script_ms=max(scripts, default=0) / 1e3,
                   longest_other_command_ms=max(others, default=0) / 1e3,
                   steps=len(steps), most_children_per_step=max(s["children"] for s in steps),
                   longest_step_call_ms=1e3 * max(s["call_s"] for s in steps))
    assert len(events) == len(ids) and {e.commit for e in events} == set(ids)
    assert all(r.stale for r in store.log()), "every commit of the DAG must end stale"
    store.close()
    return out


SLOWLOG_US = 1000  # commands slower than this are logged one by one


# ------------------------------------------------------- blob read paths, 64 MB
READ_PATHS = ("resp.py", "redis-py", "redis-py+hiredis")


def readpath_worker(url: str, variant: str, data_path: str) -> None:
    """Child process: one 64 MB put+get through ``variant``; prints JSON."""
    if variant != "redis-py+hiredis":
        sys.modules["hiredis"] = None  # NOTE: redis-py then falls back to its pure-Python parser
    import redis.connection
    import redis.utils

    if variant == "redis-py+hiredis" and not redis.utils.HIREDIS_AVAILABLE:
        print(json.dumps({"error": "hiredis is not importable: pip install hiredis (or pass --hiredis-path)"}))
        return
    from c2c.store import open_store

    data = Path(data_path).read_bytes()
    with open_store(url) as store:
        store._direct_reads = variant == "resp.py"
        warm = store.put(small_artifact(1), stream="warm-up")  # first-call costs: imports, SCRIPT LOAD, pools
        store.get(warm.id)
        c0 = time.process_time()
        t0 = time.perf_counter()
        c = store.put(data, stream="bench")
        t1 = time.perf_counter()
        rec = store.get(c.id)
        t2 = time.perf_counter()
        c2 = time.process_time()
        assert rec.data == data
        store.delete_leaf(c.id)
    print(json.dumps({"put_s": t1 - t0, "get_s": t2 - t1, "total_s": t2 - t0, "cpu_s": c2 - c0,
                      "parser": redis.connection.DefaultParser.__name__}))


def read_paths(server, data: bytes, reps: int, work: Path, hiredis_path: str | None) -> dict:
    """put+get of ``data`` via c2c.store.redis.resp vs redis-py's pipelined GETs, without and with hiredis."""
    path = work / "readpath.bin"
    path.write_bytes(data)
    env = dict(os.environ)
    if hiredis_path:
        env["PYTHONPATH"] = os.pathsep.join(p for p in (hiredis_path, env.get("PYTHONPATH")) if p)
    runs: dict[str, list[dict]] = {v: [] for v in READ_PATHS}
    skipped: dict[str, str] = {}
    for i in range(reps):
        for v in READ_PATHS:  # interleaved, so drift hits all alike
            if v in skipped:
                continue
            p = subprocess.run([sys.executable, __file__, "--readpath-worker", server.url(f"rp{i}-{len(v)}"), v,
                                str(path)], env=env, capture_output=True, text=True, timeout=600, check=True)
            r = json.loads(p.stdout.strip().splitlines()[-1])
            if "error" in r:
                skipped[v] = r["error"]
            else:
                runs[v].append(r)
        print(f"read paths rep {i + 1}/{reps}: " + "  ".join(f"{v} {runs[v][-1]['total_s']:.3f}s"
                                                             for v in READ_PATHS if runs[v]), flush=True)
    path.unlink()
    out: dict = {"reps": reps, "artifact_bytes": len(data)}
    for v in READ_PATHS:
        if runs[v]:
            parser = runs[v][0].pop("parser")
            for r in runs[v][1:]:
                r.pop("parser")
            out[v] = summarize(runs[v], len(data))
            out[v]["parser"] = parser
    out["skipped"] = skipped
    return out


# --------------------------------------------------------------------- report
def write_report(res: dict, out: Path) -> int:
    from c2c.bench import results

    return results.write(out / "store", res, markdown(res), plot=lambda path: plot(res, path), echo=False)


def markdown(res: dict) -> str:
    raw = res["raw"]
    rows = [("raw write+fsync+read", raw, 1.0, "-")]
    for name, label, bar in (("sqlite", "sqlite:// put+get", 0.50), ("redis", "redis:// put+get", 0.25),
                             ("redis_aof", "redis:// + AOF everysec, put+get", None)):
        if name in res:
            r = res[name]
            verdict = "(info)" if bar is None else f">= {bar:.0%}: {'PASS' if r['ratio_vs_raw'] >= bar else 'FAIL'}"
            rows.append((label, r, r["ratio_vs_raw"], verdict))
    lines = [f"# Store benchmark ({res['artifact_MiB']:.1f} MiB artifact, median of {res['reps']} reps)", "",
             "| path | seconds | MB/s | vs raw | bar | CPU s (this process) |", "|---|---:|---:|---:|---|---:|"]
    lines += [f"| {label} | {r['total_s']:.3f} | {r['throughput_MBps']:.0f} | {ratio:.0%} | {verdict} | "
              f"{r['cpu_s']:.3f} |" for label, r, ratio, verdict in rows]
    lines += ["", "| step (median s) | sqlite:// | redis:// | redis:// + AOF |", "|---|---:|---:|---:|"]
    for step in ("put_s", "get_s"):
        lines.append(f"| {step[:-2]} | " + " | ".join(f"{res.get(k, {}).get(step, float('nan')):.3f}"
                                                    for k in ("sqlite", "redis", "redis_aof")) + " |")
    lines.append(f"\nRaw: write+fsync {raw['write_fsync_s']:.3f} s, read {raw['read_s']:.3f} s.")
    inv = res.get("invalidation")
    if inv:
        lines += ["", f"Invalidation over loopback Redis ({inv['server']}), {inv['commits']}-commit {inv['hops']}-hop DAG, "
                      f"{inv['trials']} trials: every dependent's event reached a subscriber in another process "
                      f"in **{inv['median_ms']:.1f} ms** median, {inv['p95_ms']:.1f} ms p95, {inv['max_ms']:.1f} ms max "
                      f"(bar: 100 ms: {'PASS' if inv['max_ms'] <= 100 else 'FAIL'}); the invalidate() call itself "
                      f"took {inv['invalidate_call_median_ms']:.1f} ms median."]
    dag = res.get("dag_invalidation")
    if dag:
        rd, sq = dag.get("redis"), dag["sqlite"]
        lines += ["", f"## Invalidating a {sq['commits']:,}-commit DAG", "",
                  f"A root, 100 children, and {sq['commits'] - 101:,} commits under those (every 10th under two): "
                  f"`invalidate(root)` marks all {sq['commits']:,} stale.", "",
                  "| backend | invalidate() s | longest single server call | calls |", "|---|---:|---:|---:|",
                  f"| sqlite:// | {sq['invalidate_s']:.3f} | {1e3 * sq['invalidate_s']:.0f} ms "
                  "(one transaction; other writers wait) | 1 |"]
        if rd:
            thr = rd["slowlog_threshold_ms"]
            longest = f"{rd['longest_script_ms']:.2f} ms" if rd["scripts_over_threshold"] else f"< {thr:g} ms"
            other = f"{rd['longest_other_command_ms']:.2f} ms" if rd["longest_other_command_ms"] else f"< {thr:g} ms"
            lines += [f"| redis:// | {rd['invalidate_s']:.3f} | **{longest}** script (server side, SLOWLOG) | "
                      f"{rd['script_runs']} scripts |", "",
                      f"Redis walks in steps of at most {rd['walk_batch']} commits (WALK_BATCH): {rd['steps']} STEP "
                      f"runs, at most {rd['most_children_per_step']} children in one. All scripts together took "
                      f"{rd['total_script_ms']:.1f} ms of server time (INFO commandstats), about what one atomic "
                      f"walk would have blocked the server for; the longest other command took {other}; the "
                      f"slowest STEP call seen by the client (round trip included) {rd['longest_step_call_ms']:.2f} "
                      f"ms. Server: {dag['redis_server']}."]
        lines += ["", f"Environment of this section: {dag['environment']['cpus']} CPUs, load average "
                      f"{dag['environment']['loadavg_before']} before, {dag['environment']['loadavg_after']} after."]
    rp = res.get("read_paths")
    if rp:
        lines += ["", f"## Blob read path, {rp['artifact_bytes'] / (1 << 20):.0f} MiB put+get over loopback Redis "
                      f"(median of {rp['reps']} reps, one process per run)", "",
                  "| path | put s | get s | put+get s | MB/s | CPU s | redis-py parser |",
                  "|---|---:|---:|---:|---:|---:|---|"]
        labels = {"resp.py": "c2c.store.redis.resp: GETs on redis-py's socket, `recv_into` the buffer",
                  "redis-py": "redis-py pipelined GETs", "redis-py+hiredis": "redis-py pipelined GETs, hiredis"}
        for v in READ_PATHS:
            if v in rp:
                r = rp[v]
                lines.append(f"| {labels[v]} | {r['put_s']:.3f} | {r['get_s']:.3f} | {r['total_s']:.3f} | "
                             f"{r['throughput_MBps']:.0f} | {r['cpu_s']:.3f} | {r['parser']} |")
        lines += [f"| {v}: skipped | {why} | | | | | |" for v, why in rp.get("skipped", {}).items()]
        if "verdict" in rp:
            lines += ["", rp["verdict"]]
        lines += ["", f"Environment of this section: {rp['environment']['cpus']} CPUs, load average "
                      f"{rp['environment']['loadavg_before']} before, {rp['environment']['loadavg_after']} after; "
                      f"{rp['environment'].get('hiredis', '-')}."]
    env = res["environment"]
    lines += ["", "NOTE: put decodes and validates the whole artifact (strict parse, tensor digest, NaN/Inf "
                  "scan) and hashes it, and get re-hashes it; raw does neither. That work is CPU, so the "
                  "ratios fall when other jobs share the cores, while raw's time is mostly I/O wait.",
              "", f"Machine: {env['cpus']} CPUs, load average {env['loadavg_before']} before the run and "
                  f"{env.get('loadavg_after', '-')} after; "
                  f"{env['python']}; redis-server {env.get('redis_version', '-')} "
                  f"({env.get('redis_config', '-')}); files in {env['workdir']} (device {env['device']}).",
              "", "Reproduce: `.venv/bin/python benchmarks/store_bench.py`; one section into the existing results: "
                  "`--only dag` or `--only readpaths --reps 7 --hiredis-path DIR` (DIR from "
                  "`pip install --target DIR hiredis`).", ""]
    if "sharing" in res:
        import store_sharing

        lines += store_sharing.markdown(res["sharing"]) + [
            "", "Reproduce: `nice .venv/bin/python benchmarks/store_bench.py --only team,conversation,attach,gigabyte`.",
            ""]
    return "\n".join(lines)


def plot(res: dict, path: Path) -> None:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    rows = 2 if "sharing" in res else 1
    fig = Figure(figsize=(10, 3.8 * rows))
    FigureCanvasAgg(fig)
    ax = fig.add_subplot(rows, 2, 1)
    names = ["raw"] + [n for n in ("sqlite", "redis", "redis_aof") if n in res]
    vals = [res[n]["throughput_MBps"] for n in names]
    bars = ax.bar([n.replace("_aof", "+aof") for n in names], vals,
                  color=["0.6", "#4c72b0", "#c44e52", "#dd8452"][: len(names)])
    for b, n in zip(bars, names):
        ratio = 1.0 if n == "raw" else res[n]["ratio_vs_raw"]
        ax.annotate(f"{ratio:.0%}", (b.get_x() + b.get_width() / 2, b.get_height()), ha="center", va="bottom")
    ax.axhline(0.5 * res["raw"]["throughput_MBps"], ls="--", color="#4c72b0", lw=0.8, label="sqlite bar (50%)")
    ax.axhline(0.25 * res["raw"]["throughput_MBps"], ls=":", color="#c44e52", lw=0.8, label="redis bar (25%)")
    ax.set_ylabel(f"MB/s (put + get of {res['artifact_MiB']:.0f} MiB)")
    ax.set_title("throughput vs raw write+fsync+read")
    ax.legend(fontsize=7)
    inv = res.get("invalidation")
    ax2 = fig.add_subplot(rows, 2, 2)
    if inv:
        ax2.hist([1e3 * r["reach_all_s"] for r in inv["runs"]], bins=15, color="#c44e52")
        ax2.axvline(100, ls="--", color="k", lw=0.8, label="bar: 100 ms")
        ax2.set_xlabel("ms until a subscriber holds all 20 events")
        ax2.set_title("invalidation, 20 commits / 3 hops, loopback Redis")
        ax2.legend(fontsize=7)
    if "sharing" in res:
        import store_sharing

        store_sharing.plot(fig.add_subplot(rows, 2, 3), fig.add_subplot(rows, 2, 4), res["sharing"])
    fig.tight_layout()
    fig.savefig(path, dpi=110)


SECTIONS = ("putget", "latency", "dag", "readpaths", "team", "conversation", "attach", "gigabyte")


def put_get(res: dict, data: bytes, work: Path, server, server_aof, reps: int) -> None:
    """The headline: raw vs sqlite:// vs redis:// (+AOF) put+get of ``data``, interleaved reps."""
    raw, sq, rd, ra = [], [], [], []
    for i in range(reps):
        raw.append(raw_io(work / "raw.bin", data))
        sq.append(store_io(f"sqlite:///{work / f'sqlite-{i}'}", data))
        if server:
            rd.append(store_io(server.url(f"bench{i}"), data))
            ra.append(store_io(server_aof.url(f"bench{i}"), data))
        shutil.rmtree(work / f"sqlite-{i}", ignore_errors=True)
        print(f"rep {i + 1}/{reps}: raw {raw[-1]['total_s']:.3f}s  sqlite {sq[-1]['total_s']:.3f}s"
              + (f"  redis {rd[-1]['total_s']:.3f}s  redis+aof {ra[-1]['total_s']:.3f}s" if rd else ""),
              flush=True)
    res.update(artifact_bytes=len(data), artifact_MiB=len(data) / (1 << 20), reps=reps)
    res["raw"] = summarize(raw, len(data))
    res["sqlite"] = summarize(sq, len(data))
    res["sqlite"]["ratio_vs_raw"] = res["raw"]["total_s"] / res["sqlite"]["total_s"]
    for key, runs in (("redis", rd), ("redis_aof", ra)):
        if runs:
            res[key] = summarize(runs, len(data))
            res[key]["ratio_vs_raw"] = res["raw"]["total_s"] / res[key]["total_s"]


def _loadavg() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def section_env(env: dict, before: str) -> dict:
    """The machine facts of one section, with the load average around it."""
    return {"cpus": env["cpus"], "loadavg_before": before, "loadavg_after": _loadavg(), "python": env["python"],
            "redis_version": env.get("redis_version", "-")}


def _hiredis_version(path: str | None) -> str:
    probe = "import hiredis; print(hiredis.__version__)"
    extra = {"PYTHONPATH": os.pathsep.join(p for p in (path, os.environ.get("PYTHONPATH")) if p)} if path else {}
    p = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, env={**os.environ, **extra})
    return f"hiredis {p.stdout.strip()}" if p.returncode == 0 else "hiredis not installed"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                epilog="Example: .venv/bin/python benchmarks/store_bench.py --reps 5")
    p.add_argument("--size-mb", type=int, default=64, help="artifact size in MiB of KV tensors (default 64)")
    p.add_argument("--reps", type=int, default=5, help="put+get repetitions per path (default 5)")
    p.add_argument("--trials", type=int, default=30, help="invalidation trials (default 30)")
    p.add_argument("--workdir", type=Path, help="directory on the disk to measure (default: a temp dir)")
    p.add_argument("--out", type=Path, default=REPO / "benchmarks" / "results", help="where results go")
    p.add_argument("--no-redis", action="store_true", help="skip the Redis measurements")
    p.add_argument("--only", help=f"comma-separated sections to run, of {','.join(SECTIONS)}; the results of the "
                                  "others are kept from the existing store.json (default: all)")
    p.add_argument("--hiredis-path", help="a directory with hiredis (pip install --target DIR hiredis) for the "
                                          "redis-py+hiredis read path, if the venv has none")
    p.add_argument("--giga-mb", type=int, default=1024,
                   help="size in MiB of the gigabyte section's artifact (default 1024)")
    p.add_argument("--sharing-reps", type=int, default=3,
                   help="repetitions of the attach and gigabyte sections (default 3)")
    p.add_argument("--subscriber", metavar="URL", help=argparse.SUPPRESS)
    p.add_argument("--readpath-worker", nargs=3, metavar=("URL", "VARIANT", "DATA"), help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.subscriber:
        subscriber(args.subscriber)
        return 0
    if args.readpath_worker:
        readpath_worker(*args.readpath_worker)
        return 0
    sections = SECTIONS if not args.only else tuple(args.only.split(","))
    if unknown := set(sections) - set(SECTIONS):
        p.error(f"unknown sections {sorted(unknown)}; pick from {','.join(SECTIONS)}")
    previous = args.out / "store.json"
    if args.only and not previous.exists():
        p.error(f"--only merges into {previous}, which does not exist; run every section once first")

    import torch

    torch.set_num_threads(max(1, os.cpu_count() or 1))
    work = Path(tempfile.mkdtemp(prefix="c2c-store-bench-", dir=args.workdir))
    env = {"cpus": os.cpu_count(), "loadavg_before": " ".join(f"{x:.2f}" for x in os.getloadavg()),
           "python": platform.python_version(), "workdir": str(args.workdir) if args.workdir else "a temporary directory (tempfile)",
           "device": os.stat(work).st_dev}
    redis_bin = shutil.which("redis-server")
    server = server_aof = None
    try:
        data = b""
        if {"putget", "readpaths"} & set(sections):
            art = big_artifact(args.size_mb)
            data = art.encode()
            del art
        if args.only:
            res = json.loads(previous.read_text())
        else:
            res = {"artifact_bytes": len(data), "artifact_MiB": len(data) / (1 << 20), "reps": args.reps,
                   "environment": env}
        if not args.no_redis and redis_bin:
            server = start_redis(redis_bin, work / "redis", aof=False)
            server_aof = start_redis(redis_bin, work / "redis-aof", aof=True)
            env["redis_version"] = redis_version(server)
            env["redis_config"] = "loopback; persistence off, and AOF everysec for redis+aof; no RDB"
        if "putget" in sections:
            res["environment"] = env
            put_get(res, data, work, server, server_aof, args.reps)
        if "latency" in sections and server:
            res["invalidation"] = invalidation_latency(server_aof.url("bench-inv"), args.trials)
            res["invalidation"]["server"] = "AOF everysec"
        if not server and not args.no_redis:
            res["redis_skipped"] = "redis-server not on PATH"
        if "dag" in sections:
            before = _loadavg()
            arts = dag_artifacts(10_001)
            dag = {"sqlite": dag_invalidation(f"sqlite:///{work / 'dag-sqlite'}", arts)}
            print(f"10k DAG: sqlite invalidate {dag['sqlite']['invalidate_s']:.3f}s", flush=True)
            if server:
                dag["redis"] = dag_invalidation(server.url("dag"), arts, redis_port=server.port)
                dag["redis_server"] = f"redis-server {redis_version(server)} on loopback, persistence off"
                print(f"10k DAG: redis invalidate {dag['redis']['invalidate_s']:.3f}s, longest script "
                      f"{dag['redis']['longest_script_ms']:.2f} ms", flush=True)
            dag["environment"] = section_env(env, before)
            res["dag_invalidation"] = dag
        if "readpaths" in sections and server:
            before = _loadavg()
            rp = read_paths(server, data, args.reps, work, args.hiredis_path)
            rp["environment"] = section_env(env, before)
            rp["environment"]["hiredis"] = _hiredis_version(args.hiredis_path)
            have = [v for v in READ_PATHS if v in rp]
            fastest = min(have, key=lambda v: rp[v]["total_s"])
            rp["fastest"] = fastest
            rp["verdict"] = (f"Fastest put+get: {fastest}. " + ", ".join(
                f"{v} {rp[v]['total_s'] / rp[fastest]['total_s']:.2f}x its time" for v in have if v != fastest) + ".")
            res["read_paths"] = rp
        sharing = [s for s in sections if s in ("team", "conversation", "attach", "gigabyte")]
        if sharing:
            import store_sharing

            if server is not None:
                server.client().flushall()  # earlier sections' keys: this server is ours
            res["sharing"] = store_sharing.run(sharing, work, server, reps=args.sharing_reps, giga_mb=args.giga_mb,
                                               previous=res.get("sharing"))
            res["acceptance"] = store_sharing.acceptance(res["sharing"])
        if "putget" in sections:
            env["loadavg_after"] = _loadavg()
        status = write_report(res, args.out)
    finally:
        for srv in (server, server_aof):
            if srv:
                srv.stop()
        shutil.rmtree(work, ignore_errors=True)
    print((args.out / "store.md").read_text())
    return status


if __name__ == "__main__":
    sys.exit(main())
