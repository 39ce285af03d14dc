"""Worker processes for the store fault tests; run as a script, report JSON.

    python store_workers.py team   URL OUT.json SECONDS
    python store_workers.py killer URL OUT.json KILLS SEED

``team`` forks four processes that run at once for SECONDS: two publishers
(each on its own stream, every other commit built on the other's latest) and
two consumers (read the heads fresh and stale, follow the event log; one also
invalidates). ``killer`` forks a writer KILLS times and SIGKILLs it after a
random delay while it publishes.

Both import c2c once and then fork, so four processes cost one import. The
parent never runs a parallel torch op before forking (one torch thread), so
the children are safe to fork.
"""

from __future__ import annotations

import json
import os
import random
import select
import signal
import sys
import time
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from store_helpers import artifact_bytes, sized_artifact_bytes  # noqa: E402

from c2c.artifact import Artifact  # noqa: E402
from c2c.errors import CommitNotFoundError, StaleCommitError  # noqa: E402
from c2c.store import open_store  # noqa: E402
import c2c.store.manifest  # noqa: E402,F401 - the backends and what they import lazily, before the fork (one import)
import c2c.store.redis  # noqa: E402,F401
import c2c.store.sqlite  # noqa: E402,F401


def publisher(url, seconds, stream, other, seed) -> dict:
    store = open_store(url)
    acks, errors, i = [], [], 0
    end = time.monotonic() + float(seconds)
    while time.monotonic() < end:
        try:
            try:
                parents = [store.latest(other).id] if i % 2 else []
            except CommitNotFoundError:
                parents = []
            data = artifact_bytes(int(seed) + i, seq=64, parents=parents, agent=stream)
            c = store.put(data, stream=stream)
            acks.append({"id": c.id, "version": c.version, "blob": c.blob, "parents": list(c.parents)})
        except Exception:
            errors.append(traceback.format_exc(limit=3))
        i += 1
    return {"acks": acks, "errors": errors}


def consumer(url, seconds, streams, invalidate) -> dict:
    store = open_store(url)
    reads = stale = invalidations = 0
    errors, seqs, cursor = [], [], "0"
    end = time.monotonic() + float(seconds)
    while time.monotonic() < end:
        try:
            for s in streams.split(","):
                try:
                    head = store.latest(s)
                except CommitNotFoundError:
                    continue
                rec = store.get(head.id, allow_stale=True)
                if Artifact.decode(rec.data).id != head.id:
                    errors.append(f"read {head.id[:12]} but decoded another artifact")
                reads += 1
                try:
                    store.get(head.id)
                except StaleCommitError:
                    stale += 1
                if invalidate == "1" and reads % 7 == 0:
                    store.invalidate(head.id, reason=f"consumer check {reads}")
                    invalidations += 1
            for e in store.events(cursor, limit=500, wait_s=0.01):
                seqs.append(e.seq)
                cursor = e.seq
                if not store.show(e.commit).stale:
                    errors.append(f"event for {e.commit[:12]} but the commit is not stale")
        except Exception:
            errors.append(traceback.format_exc(limit=3))
    return {"reads": reads, "stale": stale, "invalidations": invalidations, "events": seqs, "errors": errors}


def team(url, out, seconds) -> dict:
    """Four forked processes at once; returns each one's report and exit status."""
    roles = [(publisher, (url, seconds, "p0", "p1", 1000)), (publisher, (url, seconds, "p1", "p0", 2000)),
             (consumer, (url, seconds, "p0,p1", "1")), (consumer, (url, seconds, "p0,p1", "0"))]
    pids = []
    for i, (fn, args) in enumerate(roles):
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                signal.alarm(int(float(seconds)) + 60)  # bounded even if something hangs
                Path(f"{out}.{i}").write_text(json.dumps(fn(*args)))
                code = 0
            except BaseException:
                traceback.print_exc()
            finally:
                os._exit(code)
        pids.append(pid)
    statuses = [os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) for pid in pids]
    reports = [json.loads(Path(f"{out}.{i}").read_text()) if code == 0 else None for i, code in enumerate(statuses)]
    return {"statuses": statuses, "publishers": reports[:2], "consumers": reports[2:]}


def killer(url, out, kills, seed) -> dict:
    """Fork a writer KILLS times; SIGKILL each while it publishes ~1 MB artifacts."""
    rng = random.Random(int(seed))
    checker = None
    acked, begun, mid_put, intact_reads = [], [], 0, 0
    for k in range(int(kills)):
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:  # the writer
            os.close(r)
            try:
                store = open_store(url)
                payloads = [sized_artifact_bytes(int(seed) * 100_000 + k * 100, 1 << 20)]
                os.write(w, b"R\n")
                i = 0
                while True:
                    data = payloads[i] if i < len(payloads) else sized_artifact_bytes(
                        int(seed) * 100_000 + k * 100 + i, 1 << 20)
                    os.write(w, f"B {i}\n".encode())
                    c = store.put(data, stream="victim")
                    os.write(w, f"A {c.id} {c.version}\n".encode())
                    i += 1
            finally:
                os._exit(3)
        os.close(w)
        buf = b""
        ready_by = time.monotonic() + 60
        while b"R\n" not in buf and time.monotonic() < ready_by:
            if select.select([r], [], [], 1.0)[0]:
                chunk = os.read(r, 65536)
                if not chunk:
                    break
                buf += chunk
        time.sleep(rng.uniform(0.0, 0.06))
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        while chunk := os.read(r, 65536):
            buf += chunk
        os.close(r)
        lines = buf.decode().split("\n")
        lines = [ln for ln in lines if ln]
        for ln in lines:
            if ln.startswith("A "):
                _, cid, version = ln.split()
                acked.append({"id": cid, "version": int(version)})
            elif ln.startswith("B "):
                begun.append(k)
        if lines and lines[-1].startswith("B "):
            mid_put += 1
        # between kills, a reader must only ever see complete, intact commits
        if checker is None:
            checker = open_store(url)
        for rec in checker.log("victim", limit=3):
            got = checker.get(rec.id, allow_stale=True)
            assert Artifact.decode(got.data).id == rec.id
            intact_reads += 1
    return {"acked": acked, "kills": int(kills), "killed_mid_put": mid_put, "intact_reads": intact_reads,
            "errors": []}


if __name__ == "__main__":
    import torch

    torch.set_num_threads(1)  # NOTE: no OpenMP pool may exist in a process that forks
    role, url, out, *rest = sys.argv[1:]
    result = {"team": team, "killer": killer}[role](url, out, *rest)
    Path(out).write_text(json.dumps(result))
