"""What chunked commits (#33) buy, against the store as it was before them, in one run.

Sections of ``benchmarks/store_bench.py`` (``--only team,conversation,attach,gigabyte``):

- **team**: 16 agents of one team (Qwen2.5-Coder-0.5B-Instruct, the default dtype) each
  publish a 2,048-token cache whose first 1,536 tokens are the team's shared prefix
  (prefilled once, then extended by each agent, as ``c2c.Team`` does): bytes stored.
- **conversation**: one session of 10 turns, published after every turn: bytes stored
  against the final cache's artifact.
- **attach**: one of the team's commits through Redis to a receiver in another process
  that holds the shared prefix (it prefills it itself): bytes fetched and seconds, with
  ``c2c.store.fetch`` (the chunks after the prefix only) against a whole ``get``.
- **gigabyte**: put + get of one 1 GiB artifact (16 layers x 8 kv heads x 128 dims, fp32),
  fresh store each rep.

"Before" is the same operation through the store of :data:`BASELINE_REV` (the commit
before #33), run from a ``git archive`` of it in its own process, on the artifacts it
reads (format version 1 encodings of the same caches, ``c2c.testing.synthetic.as_version_1``).
Every store operation, new or old, runs in a fresh process started the same way, so
neither pays for the model the benchmark holds. Reps are interleaved. Bytes stored are
the payload a backend keeps: chunk and blob files (SQLite; the database is listed
apart), chunk, head and blob values (Redis, ``STRLEN``).
"""

from __future__ import annotations

import io
import json
import os
import shutil
import statistics
import subprocess
import sys
import tarfile
import time
import zlib
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
BASELINE_REV = "6358234"       # main before #33: whole-artifact blobs
SECTIONS = ("team", "conversation", "attach", "gigabyte")
MODEL = "Qwen2.5-Coder-0.5B-Instruct"
AGENTS, TOKENS, SHARED = 16, 2048, 1536
TURNS = 10


# ----------------------------------------------------------------- the two codes
def baseline_src(work: Path, rev: str = BASELINE_REV) -> Path:
    """``src/`` of ``rev``, unpacked under ``work``."""
    out = work / f"baseline-{rev}"
    if not (out / "src" / "c2c").is_dir():
        blob = subprocess.run(["git", "-C", str(REPO), "archive", rev, "src"], capture_output=True, check=True).stdout
        with tarfile.open(fileobj=io.BytesIO(blob)) as tar:
            tar.extractall(out, filter="data")
    return out / "src"


def worker(src: Path, job: dict, timeout: int = 1800) -> dict:
    """Run one store job (:func:`run_job`) in a fresh process on the c2c of ``src``."""
    env = {**os.environ, "PYTHONPATH": str(src), "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "2")}
    p = subprocess.run([sys.executable, __file__, "--job", json.dumps(job)], env=env, capture_output=True, text=True,
                       timeout=timeout)
    if p.returncode != 0:
        raise RuntimeError(f"store job {job['op']} failed:\n{p.stderr[-3000:]}")
    return json.loads(p.stdout.strip().splitlines()[-1])


def stored_payload(store) -> dict:
    """Bytes a store keeps for its commits' contents: chunk/blob files or values, and heads."""
    import sqlite3

    if store.url.startswith("sqlite"):
        root = store.root
        files = sum(p.stat().st_size for d in ("chunks", "blobs") if (root / d).exists()
                    for p in (root / d).rglob("*") if p.is_file())
        db = sqlite3.connect(root / "store.sqlite3")
        tables = {r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        heads = db.execute("SELECT COALESCE(SUM(length(head)), 0) FROM manifests").fetchone()[0] \
            if "manifests" in tables else 0
        db.close()
        meta = sum(p.stat().st_size for p in root.glob("store.sqlite3*"))
        return {"payload": files + heads, "files": files, "heads_in_db": heads, "database_file": meta}
    r, p = store._r, store.prefix
    out = {}
    for kind in ("chunk", "head", "blob"):
        keys = list(r.scan_iter(match=f"{p}{kind}:*", count=1000))
        out[kind] = sum(r.strlen(k) for k in keys)
    return {"payload": sum(out.values()), **out}


def run_job(job: dict) -> dict:
    """One job, in this process: ``put_all`` (put files, report what is stored), ``putget`` (one file,
    fresh store per rep) or ``get`` (whole gets of a commit)."""
    from c2c.store import open_store

    if job["op"] == "put_all":
        t0 = time.perf_counter()
        logical = 0
        with open_store(job["url"]) as store:
            ids = []
            for f in job["files"]:
                data = Path(f).read_bytes()
                logical += len(data)
                ids.append(store.put(data, stream=job["stream"]).id)
            out = {"ids": ids, "logical": logical, "put_s": time.perf_counter() - t0, **stored_payload(store)}
            if hasattr(store, "usage"):
                out["usage"] = store.usage().to_dict()
        return out
    if job["op"] == "putget":
        data = Path(job["file"]).read_bytes()
        with open_store(job["url"]) as store:
            c0, t0 = time.process_time(), time.perf_counter()
            c = store.put(data, stream="bench")
            t1 = time.perf_counter()
            rec = store.get(c.id)
            t2 = time.perf_counter()
            c2 = time.process_time()
            ok = rec.data == data
            del rec
            store.delete_leaf(c.id)
        return {"put_s": t1 - t0, "get_s": t2 - t1, "total_s": t2 - t0, "cpu_s": c2 - c0, "bytes": len(data),
                "intact": ok}
    if job["op"] == "get":
        with open_store(job["url"]) as store:
            runs = []
            for _ in range(job["reps"]):
                t0 = time.perf_counter()
                n = len(store.get(job["id"], allow_stale=True).data)
                runs.append({"get_s": time.perf_counter() - t0, "bytes": n})
        return {"runs": runs}
    raise ValueError(job["op"])


# ------------------------------------------------------------------- the caches
_POOL: list[int] = []


def text_tokens(rt, n: int, start: int) -> list[int]:
    """Tokens ``[start, start + n)`` of this repository's own source, every file once in order: distinct
    offsets give distinct text (the README is the team's shared prefix, ``start=-1``)."""
    if start < 0:
        return rt.encode((REPO / "README.md").read_text())[:n]
    if not _POOL:
        for f in sorted((REPO / "src" / "c2c").rglob("*.py")):
            _POOL.extend(rt.encode(f.read_text()))
    if len(_POOL) < start + n:
        raise RuntimeError(f"only {len(_POOL)} tokens of text for {start + n}")
    return _POOL[start: start + n]


def team_caches(rt):
    """The shared prefix's tokens and cache, and each agent's 2,048-token cache built on it."""
    from c2c.artifact import Artifact
    from c2c.artifact.fingerprint import Fingerprint
    from c2c.artifact.prefix import PrefixRef

    prefix = text_tokens(rt, SHARED, -1)
    t0 = time.perf_counter()
    _, shared = rt.prefill(prefix)                       # once, for the whole team
    fp, ref = Fingerprint.of(rt), PrefixRef.of(prefix)
    arts = []
    for i in range(AGENTS):
        own = text_tokens(rt, TOKENS - SHARED, i * (TOKENS - SHARED))  # no two agents read the same text
        _, cache = rt.prefill(own, shared)               # (1, H, 2048, D) per layer
        arts.append(Artifact.build(cache, fingerprint=fp, prefix=ref, producer={"agent": f"agent{i}"}))
    return prefix, shared, arts, time.perf_counter() - t0


def conversation_artifacts(rt):
    """A 10-turn session (system prompt, then a user and an assistant turn each time), one artifact per turn."""
    from c2c.artifact import Artifact
    from c2c.artifact.fingerprint import Fingerprint
    from c2c.artifact.prefix import PrefixRef

    system = rt.encode(rt.render_turn("system", "You are a careful assistant for the c2c project."))
    fp, ref = Fingerprint.of(rt), PrefixRef.of(system)
    _, cache = rt.prefill(system)
    arts = []
    for turn in range(TURNS):
        body = text_tokens(rt, 170, AGENTS * (TOKENS - SHARED) + turn * 170)
        user = rt.encode(rt.render_turn("user", rt.decode(body[:110])))
        reply = rt.encode(rt.render_turn("assistant", rt.decode(body[110:])))
        _, cache = rt.prefill(user + reply, cache)       # the session's cache grows turn by turn
        arts.append(Artifact.build(cache, fingerprint=fp, prefix=ref, producer={"agent": "assistant"}))
    return arts


# ------------------------------------------------------------------ the sections
def write_pair(work: Path, name: str, art) -> tuple[Path, Path]:
    """``art`` as the new store reads it and as the old one does (format version 1)."""
    from c2c.testing.synthetic import as_version_1

    new, old = work / f"{name}.v2.c2c", work / f"{name}.v1.c2c"
    new.write_bytes(art.encode())
    old.write_bytes(as_version_1(art))
    return new, old


def urls(work: Path, server, tag: str) -> dict[str, str]:
    out = {"sqlite": f"sqlite:///{work / f'{tag}-sqlite'}"}
    if server is not None:
        out["redis"] = server.url(tag)
    return out


def stored_section(work: Path, server, new_src: Path, old_src: Path, tag: str, arts, stream: str) -> dict:
    pairs = [write_pair(work, f"{tag}{i}", a) for i, a in enumerate(arts)]
    out = {"artifacts": len(arts), "artifact_bytes": [p[0].stat().st_size for p in pairs]}
    for backend, url in urls(work, server, tag).items():
        new = worker(new_src, {"op": "put_all", "url": url, "files": [str(p[0]) for p in pairs], "stream": stream})
        old = worker(old_src, {"op": "put_all", "url": urls(work, server, tag + "-before")[backend],
                               "files": [str(p[1]) for p in pairs], "stream": stream})
        out[backend] = {"now": new, "before": old, "ratio": new["payload"] / old["payload"]}
    for p in pairs:
        for f in p:
            f.unlink()
    return out


def team(rt, work: Path, server, new_src: Path, old_src: Path, caches) -> dict:
    prefix, shared, arts, prefill_s = caches
    out = stored_section(work, server, new_src, old_src, "team", arts, "team")
    out.update(agents=AGENTS, tokens=TOKENS, shared_tokens=SHARED, prefill_s=prefill_s,
               bytes_per_token=arts[0].cache.nbytes // TOKENS, dtype=str(arts[0].cache.dtype).replace("torch.", ""))
    c = arts[0].header.chunks.tokens
    out["chunks_expected"] = SHARED // c + AGENTS * -(-(TOKENS - SHARED) // c)  # the prefix once, every agent's own
    for backend in urls(work, server, "x"):
        assert out[backend]["now"]["usage"]["chunks"] == out["chunks_expected"], out[backend]["now"]["usage"]
    for backend in urls(work, server, "x"):
        out[backend]["pass"] = out[backend]["ratio"] <= 1 / 3
    return out


def conversation(rt, work: Path, server, new_src: Path, old_src: Path) -> dict:
    arts = conversation_artifacts(rt)
    out = stored_section(work, server, new_src, old_src, "conv", arts, "conversation")
    final = out["artifact_bytes"][-1]
    out.update(turns=TURNS, final_tokens=arts[-1].cache.seq_len, final_bytes=final)
    for backend in urls(work, server, "x"):
        r = out[backend]
        r["stored_vs_final"] = r["now"]["payload"] / final
        r["before_vs_final"] = r["before"]["payload"] / final
        r["pass"] = r["stored_vs_final"] <= 1.3
    return out


def attach(rt, work: Path, server, new_src: Path, old_src: Path, held, reps: int) -> dict:
    """Publish one team commit to Redis; a receiver process that holds the prefix fetches the rest."""
    prefix, _, art = held
    new, old = write_pair(work, "attach", art)
    url_new, url_old = server.url("attach"), server.url("attach-before")
    cid = worker(new_src, {"op": "put_all", "url": url_new, "files": [str(new)], "stream": "agent0"})["ids"][0]
    old_id = worker(old_src, {"op": "put_all", "url": url_old, "files": [str(old)], "stream": "agent0"})["ids"][0]
    job = {"url": url_new, "id": cid, "prefix": prefix, "model": MODEL, "dtype": str(rt.dtype).replace("torch.", ""),
           "reps": reps}
    env = {**os.environ, "PYTHONPATH": str(new_src)}
    p = subprocess.run([sys.executable, __file__, "--receiver", json.dumps(job)], env=env, capture_output=True,
                       text=True, timeout=1800)
    if p.returncode != 0:
        raise RuntimeError(f"receiver failed:\n{p.stderr[-3000:]}")
    got = json.loads(p.stdout.strip().splitlines()[-1])
    before = worker(old_src, {"op": "get", "url": url_old, "id": old_id, "reps": reps})
    size = new.stat().st_size
    shared_bytes = art.cache.nbytes * SHARED // TOKENS
    non_shared = size - shared_bytes
    out = {"artifact_bytes": size, "shared_prefix_bytes": shared_bytes, "non_shared_bytes": non_shared,
           "receiver": got, "before": {"get_s": statistics.median(r["get_s"] for r in before["runs"]),
                                       "bytes": before["runs"][0]["bytes"], "runs": before["runs"]}}
    out["fetched_vs_non_shared"] = got["bytes_fetched"] / non_shared
    out["pass"] = out["fetched_vs_non_shared"] <= 1.05
    new.unlink(), old.unlink()
    return out


def receiver(job: dict) -> None:
    """Child process: load the model, prefill the shared prefix, then fetch the commit (reps), and get it whole."""
    import torch

    import c2c
    from c2c.artifact.fingerprint import Fingerprint
    from c2c.store import open_store
    from c2c.store.fetch import fetch
    from c2c.store.manifest import HeldPrefix
    from c2c.trust.signing import decode_exact

    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "2")))
    rt = c2c.load_model(job["model"], dtype=job["dtype"])
    _, held = rt.prefill(job["prefix"])          # what this receiver holds: its team's shared prefix
    fp = Fingerprint.of(rt)
    t0 = time.perf_counter()
    holding = HeldPrefix.of_cache(held, fp, digests=True)   # once, for as long as it keeps that prefix
    digests_s = time.perf_counter() - t0
    fetches, gets = [], []
    with open_store(job["url"]) as store:
        store.get(job["id"])                      # warm: connections, scripts
        for _ in range(job["reps"]):
            t0 = time.perf_counter()
            rec, rep = fetch(store, job["id"], held=held, holding=holding)
            t1 = time.perf_counter()
            decode_exact(rec.data)                # the bytes are the commit's, every chunk checked
            fetches.append({"fetch_s": t1 - t0, "decode_s": time.perf_counter() - t1, **rep.to_dict()})
            t0 = time.perf_counter()
            whole = store.get(job["id"])
            gets.append({"get_s": time.perf_counter() - t0, "bytes": len(whole.data)})
            assert whole.data == rec.data
    last = fetches[-1]
    print(json.dumps({"bytes_fetched": last["bytes_fetched"], "bytes_referenced": last["bytes_referenced"],
                      "chunks": last["chunks"], "chunks_held": last["chunks_held"],
                      "chunks_refetched": last["chunks_refetched"],
                      "fetch_s": statistics.median(r["fetch_s"] for r in fetches), "held_digests_s": digests_s,
                      "get_s": statistics.median(r["get_s"] for r in gets),
                      "fetches": fetches, "gets": gets}))


def gigabyte(work: Path, server, new_src: Path, old_src: Path, reps: int, size_mb: int) -> dict:
    """put+get of one ``size_mb`` MiB artifact, now and before, on each backend; fresh store per rep."""
    sys.path.insert(0, str(Path(__file__).parent))
    from store_bench import big_artifact

    art = big_artifact(size_mb)
    new, old = write_pair(work, "giga", art)
    del art
    out: dict = {"artifact_bytes": new.stat().st_size, "artifact_MiB": new.stat().st_size / (1 << 20), "reps": reps}
    for backend in urls(work, server, "x"):
        runs: dict[str, list] = {"now": [], "before": []}
        for i in range(reps):
            for which, src, f in (("now", new_src, new), ("before", old_src, old)):
                url = urls(work, server, f"giga-{which}-{i}")[backend]
                r = worker(src, {"op": "putget", "url": url, "file": str(f)})
                assert r["intact"], (backend, which)
                runs[which].append(r)
                if backend == "sqlite":
                    shutil.rmtree(work / f"giga-{which}-{i}-sqlite", ignore_errors=True)
                print(f"gigabyte {backend} rep {i + 1}/{reps} {which}: put {r['put_s']:.2f}s get {r['get_s']:.2f}s",
                      flush=True)
        res = {}
        for which, rs in runs.items():
            med = {k: statistics.median(r[k] for r in rs) for k in ("put_s", "get_s", "total_s", "cpu_s")}
            med.update(put_MBps=out["artifact_bytes"] / med["put_s"] / 1e6,
                       get_MBps=out["artifact_bytes"] / med["get_s"] / 1e6, runs=rs)
            res[which] = med
        res["put_ratio"] = res["now"]["put_MBps"] / res["before"]["put_MBps"]
        res["get_ratio"] = res["now"]["get_MBps"] / res["before"]["get_MBps"]
        res["pass"] = res["put_ratio"] >= 0.9 and res["get_ratio"] >= 0.9
        out[backend] = res
    new.unlink(), old.unlink()
    return out


def cpu_model() -> str:
    """The CPU's model name, family and the flags these sections lean on (sha256, the bf16 K/V)."""
    info = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").exists() else ""
    field = lambda k: next((ln.split(":", 1)[1].strip() for ln in info.splitlines() if ln.startswith(k)), "?")  # noqa: E731
    flags = set(field("flags").split())
    have = [f for f in ("sha_ni", "avx2", "avx512f", "avx512_bf16", "amx_bf16") if f in flags]
    return f"{field('model name')}, family {field('cpu family')}, {' '.join(have) or 'no sha_ni/avx'}"


def run(sections, work: Path, server, *, reps: int, giga_mb: int, previous: dict | None) -> dict:
    """The sections asked for, into one ``sharing`` result (the others kept from ``previous``)."""
    import c2c

    out = dict(previous or {})
    new_src, old_src = REPO / "src", baseline_src(work)
    out.update(baseline_rev=BASELINE_REV, cpu=cpu_model(), cpus=os.cpu_count())
    loads = out.setdefault("loadavg", {})
    held = None
    rt = None
    if {"team", "conversation", "attach"} & set(sections):
        rt = c2c.load_model(MODEL)
        out["model"], out["dtype"] = MODEL, str(rt.dtype).replace("torch.", "")
    if "team" in sections or "attach" in sections:
        before = _load()
        caches = team_caches(rt)
        held = (caches[0], caches[1], caches[2][0])
        if "team" in sections:
            out["team"] = team(rt, work, server, new_src, old_src, caches)
            loads["team"] = [before, _load()]
            print(f"team: stored {[(b, round(out['team'][b]['ratio'], 3)) for b in urls(work, server, 'x')]} of "
                  "before", flush=True)
        del caches
    if "conversation" in sections:
        before = _load()
        out["conversation"] = conversation(rt, work, server, new_src, old_src)
        loads["conversation"] = [before, _load()]
        print(f"conversation: {[(b, round(out['conversation'][b]['stored_vs_final'], 3)) for b in urls(work, server, 'x')]}"
              " x the final cache", flush=True)
    if "attach" in sections and server is not None:
        before = _load()
        out["attach"] = attach(rt, work, server, new_src, old_src, held, reps)
        loads["attach"] = [before, _load()]
        print(f"attach: fetched {out['attach']['fetched_vs_non_shared']:.3f} x the non-shared bytes", flush=True)
    del rt
    if "gigabyte" in sections:
        before = _load()
        out["gigabyte"] = gigabyte(work, server, new_src, old_src, reps, giga_mb)
        loads["gigabyte"] = [before, _load()]
    return out


def _load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def acceptance(sh: dict) -> dict[str, bool]:
    out = {}
    for backend in ("sqlite", "redis"):
        if backend in sh.get("team", {}):
            out[f"team_{backend}_le_third"] = sh["team"][backend]["pass"]
        if backend in sh.get("conversation", {}):
            out[f"conversation_{backend}_le_1.3x"] = sh["conversation"][backend]["pass"]
        if backend in sh.get("gigabyte", {}):
            out[f"gigabyte_{backend}_within_10pct"] = sh["gigabyte"][backend]["pass"]
    if "attach" in sh:
        out["attach_fetch_le_non_shared_plus_5pct"] = sh["attach"]["pass"]
    return out


def markdown(sh: dict) -> list[str]:
    """The sharing sections' part of store.md."""
    mb = lambda n: f"{n / 1e6:,.1f} MB"  # noqa: E731
    lines = ["", "## Chunked commits (#33): sharing, fetching what is missing, throughput", "",
             f"Against the store before #33 ({sh['baseline_rev']}, whole-artifact blobs), each operation in a fresh "
             f"process. CPU: {sh['cpu']} ({sh['cpus']} CPUs); model {sh.get('model', '-')}, {sh.get('dtype', '-')}."]
    if "team" in sh:
        t = sh["team"]
        lines += ["", f"**Team**: {t['agents']} agents x {t['tokens']:,}-token caches sharing a {t['shared_tokens']:,}-token "
                      f"prefix ({t['bytes_per_token']:,} bytes a token, {mb(t['artifact_bytes'][0])} an artifact); "
                      f"each agent's own {t['tokens'] - t['shared_tokens']} tokens are text no other agent read, "
                      f"and the store holds {t['chunks_expected']} chunks: the prefix's once, every agent's own.", "",
                  "| backend | stored now | stored before | now / before | bar (<= 1/3) |", "|---|---:|---:|---:|---|"]
        lines += [f"| {b} | {mb(t[b]['now']['payload'])} | {mb(t[b]['before']['payload'])} | {t[b]['ratio']:.3f} | "
                  f"{'PASS' if t[b]['pass'] else 'FAIL'} |" for b in ("sqlite", "redis") if b in t]
    if "conversation" in sh:
        c = sh["conversation"]
        lines += ["", f"**Conversation**: {c['turns']} turns published after each; the final cache is "
                      f"{c['final_tokens']:,} tokens, {mb(c['final_bytes'])}.", "",
                  "| backend | stored now | x final | stored before | x final | bar (now <= 1.3x) |",
                  "|---|---:|---:|---:|---:|---|"]
        lines += [f"| {b} | {mb(c[b]['now']['payload'])} | {c[b]['stored_vs_final']:.2f} | "
                  f"{mb(c[b]['before']['payload'])} | {c[b]['before_vs_final']:.2f} | {'PASS' if c[b]['pass'] else 'FAIL'} |"
                  for b in ("sqlite", "redis") if b in c]
    if "attach" in sh:
        a, r = sh["attach"], sh["attach"]["receiver"]
        lines += ["", "**Cross-process attach through Redis**, the receiver holding the shared prefix (prefilled in "
                      "its own process):", "",
                  "| | bytes | seconds (median) |", "|---|---:|---:|",
                  f"| fetch of what is missing (`c2c.store.fetch`) | {mb(r['bytes_fetched'])} | {r['fetch_s']:.3f} |",
                  f"| whole get, now | {mb(r['gets'][0]['bytes'])} | {r['get_s']:.3f} |",
                  f"| whole get, before | {mb(a['before']['bytes'])} | {a['before']['get_s']:.3f} |", "",
                  f"Non-shared bytes (the artifact less its prefix K/V): {mb(a['non_shared_bytes'])}; fetched / "
                  f"non-shared = **{a['fetched_vs_non_shared']:.3f}** (bar <= 1.05: {'PASS' if a['pass'] else 'FAIL'}); "
                  f"{r['chunks_held']} of {r['chunks']} chunks held, {r['chunks_refetched']} held but different. "
                  f"The receiver hashed its prefix's chunks once, in {r.get('held_digests_s', float('nan')):.3f} s "
                  "(`HeldPrefix.of_cache(..., digests=True)`); a fetch puts its own K/V in their places unhashed, and "
                  "hashes every chunk it reads. Whole gets re-hash every chunk."]
    if "gigabyte" in sh:
        g = sh["gigabyte"]
        lines += ["", f"**Throughput**: put + get of one {g['artifact_MiB']:,.0f} MiB artifact, median of {g['reps']} "
                      "reps, fresh store each.", "",
                  "| backend | put MB/s now | before | get MB/s now | before | put / before | get / before | bar (>= 0.9) |",
                  "|---|---:|---:|---:|---:|---:|---:|---|"]
        lines += [f"| {b} | {g[b]['now']['put_MBps']:.0f} | {g[b]['before']['put_MBps']:.0f} | "
                  f"{g[b]['now']['get_MBps']:.0f} | {g[b]['before']['get_MBps']:.0f} | {g[b]['put_ratio']:.2f} | "
                  f"{g[b]['get_ratio']:.2f} | {'PASS' if g[b]['pass'] else 'FAIL'} |"
                  for b in ("sqlite", "redis") if b in g]
    lines += ["", "Load average (1, 5, 15 min) before and after each section: " + "; ".join(
        f"{k} {v[0]} -> {v[1]}" for k, v in sh.get("loadavg", {}).items()) + "."]
    return lines


def plot(ax_bytes, ax_speed, sh: dict) -> None:
    """Stored bytes now vs before (team, conversation) and 1 GiB MB/s now vs before."""
    labels, now, before = [], [], []
    for sec in ("team", "conversation"):
        for b in ("sqlite", "redis"):
            if b in sh.get(sec, {}):
                labels.append(f"{sec}\n{b}")
                now.append(sh[sec][b]["now"]["payload"] / 1e6)
                before.append(sh[sec][b]["before"]["payload"] / 1e6)
    x = range(len(labels))
    ax_bytes.bar([i - 0.2 for i in x], before, 0.4, label="before (#33)", color="0.6")
    ax_bytes.bar([i + 0.2 for i in x], now, 0.4, label="chunked", color="#4c72b0")
    ax_bytes.set_xticks(list(x), labels, fontsize=7)
    ax_bytes.set_ylabel("MB stored")
    ax_bytes.set_title("stored bytes: team of 16, 10-turn conversation")
    ax_bytes.legend(fontsize=7)
    g = sh.get("gigabyte")
    if g:
        labels = [f"{b} {op}" for b in ("sqlite", "redis") if b in g for op in ("put", "get")]
        vals = [(g[b][w][f"{op}_MBps"]) for b in ("sqlite", "redis") if b in g for op in ("put", "get")
                for w in ("before", "now")]
        x = range(len(labels))
        ax_speed.bar([i - 0.2 for i in x], vals[0::2], 0.4, label="before", color="0.6")
        ax_speed.bar([i + 0.2 for i in x], vals[1::2], 0.4, label="chunked", color="#4c72b0")
        ax_speed.set_xticks(list(x), labels, fontsize=7)
        ax_speed.set_ylabel("MB/s")
        ax_speed.set_title(f"{g['artifact_MiB']:,.0f} MiB artifact")
        ax_speed.legend(fontsize=7)


if __name__ == "__main__":
    if sys.argv[1] == "--job":
        print(json.dumps(run_job(json.loads(sys.argv[2]))))
    elif sys.argv[1] == "--receiver":
        receiver(json.loads(sys.argv[2]))
