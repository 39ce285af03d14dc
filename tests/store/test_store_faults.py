"""Faults, on every backend: concurrent processes, SIGKILLed writers, server restarts, full disks.

Every loop here is bounded in count and in time. Nothing is timed: what is
checked is that no partial commit is ever visible and that every acknowledged
commit stays readable and intact.
"""

from __future__ import annotations

import errno
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from store_helpers import audit, leftovers
from store_helpers import artifact_bytes, make_artifact, sized_artifact_bytes

from c2c.artifact import Artifact
from c2c.errors import CommitNotFoundError, StoreError, StoreWriteError
from c2c.store import open_store
from c2c.store.sqlite.backend import SQLiteStore
from c2c.testing import free_port

WORKERS = Path(__file__).with_name("store_workers.py")
pytestmark = pytest.mark.slow


def _env() -> dict:
    # NOTE: one torch thread per worker; four processes share two cores
    return {**os.environ, "OMP_NUM_THREADS": "1"}


def _assert_intact(store, ids) -> None:
    for cid in ids:
        rec = store.get(cid, allow_stale=True)
        assert Artifact.decode(rec.data).id == cid
    assert store.verify() == []


def _seq_key(seq: str) -> tuple[int, ...]:
    return tuple(int(p) for p in seq.split("-"))


def test_four_processes_publish_and_consume_at_once(store_url, tmp_path):
    out = tmp_path / "team.json"
    subprocess.run([sys.executable, str(WORKERS), "team", store_url, str(out), "3"], env=_env(), check=True,
                   timeout=240)
    res = json.loads(out.read_text())
    assert res["statuses"] == [0, 0, 0, 0]
    pubs, cons = res["publishers"], res["consumers"]
    assert not [e for r in pubs + cons for e in r["errors"]]
    store = open_store(store_url)
    acked = [a for r in pubs for a in r["acks"]]
    assert acked and sum(c["reads"] for c in cons) > 0
    for r in pubs:  # one publisher per stream: versions 1, 2, 3, ... in ack order
        assert [a["version"] for a in r["acks"]] == list(range(1, len(r["acks"]) + 1))
    assert {r.id for r in store.log()} == {a["id"] for a in acked}  # nothing partial, nothing lost
    _assert_intact(store, [a["id"] for a in acked])
    for c in cons:
        assert [_seq_key(s) for s in c["events"]] == sorted({_seq_key(s) for s in c["events"]})
    assert cons[0]["invalidations"] > 0 and store.events(limit=10_000)
    _assert_staleness_closed(store)


def _assert_staleness_closed(store) -> None:
    """Once every writer is done, a stale commit's children are all stale, but for the new version
    that superseded its root (the new truth, even when built on the old one's dependents)."""
    records = {r.id: r for r in store.log()}
    for rec in records.values():
        if rec.stale:
            spared = records[rec.stale_root].superseded_by if rec.stale_root in records else None
            fresh = [k for k in store.children(rec.id) if not records[k].stale and k != spared]
            assert not fresh, f"{rec.id[:12]} is stale but its children {[k[:12] for k in fresh]} are not"


def test_a_writer_sigkilled_mid_publish_never_leaves_a_partial_commit(store_url, tmp_path):
    out = tmp_path / "killer.json"
    subprocess.run([sys.executable, str(WORKERS), "killer", store_url, str(out), "50", "7"], env=_env(),
                   check=True, timeout=300)
    res = json.loads(out.read_text())
    assert res["kills"] == 50 and res["killed_mid_put"] >= 1 and res["intact_reads"] > 0
    store = open_store(store_url)
    log = store.log("victim")
    ids = {r.id for r in log}
    assert {a["id"] for a in res["acked"]} <= ids   # every acknowledged commit is there...
    _assert_intact(store, ids)                       # ...and so is everything visible
    # a killed put never consumed a version: 1..n without holes
    assert sorted(r.commit.version for r in log) == list(range(1, len(log) + 1))
    audit(store)  # no chunk of a killed put is counted (references and usage are the live commits' alone)
    if isinstance(store, SQLiteStore):
        store.sweep_orphans(0)                     # temp files of killed writers
        assert leftovers(store) == 0
        _assert_intact(store, ids)
    else:                                          # partial uploads always expire on their own
        for key in store._r.scan_iter(match=f"{store.prefix}up:*"):
            assert store._r.ttl(key) > 0
    audit(store)


@pytest.mark.redis
@pytest.mark.parametrize("sig", ["SIGTERM", "SIGKILL"])
def test_a_redis_restart_loses_no_acknowledged_commit(own_redis, sig):
    # SIGTERM: a clean shutdown flushes the AOF. SIGKILL: only appendfsync always keeps every ack.
    server = own_redis(appendonly=True, appendfsync="always" if sig == "SIGKILL" else "everysec")
    url = server.url(domain="restart")
    acks: list = []
    errors: list = []
    deadline = time.monotonic() + 90

    def writer(w: int) -> None:
        store = open_store(url)
        for i in range(25):
            data = artifact_bytes(10_000 * (w + 1) + i, seq=64)
            while time.monotonic() < deadline:
                try:
                    acks.append(store.put(data, stream=f"w{w}"))
                    break
                except StoreWriteError:
                    time.sleep(0.05)  # the server is restarting: try again
                except Exception as e:  # pragma: no cover - reported below
                    errors.append(repr(e))
                    return

    threads = [threading.Thread(target=writer, args=(w,)) for w in range(2)]
    for t in threads:
        t.start()
    for target in (5, 25):
        while len(acks) < target and time.monotonic() < deadline:
            time.sleep(0.01)
        server.restart(getattr(signal, sig))
    for t in threads:
        t.join(timeout=120)
    assert not errors and len(acks) == 50
    store = open_store(url)
    assert {r.id for r in store.log()} == {c.id for c in acks}
    _assert_intact(store, [c.id for c in acks])
    for w in range(2):
        assert sorted(c.version for c in acks if c.stream == f"w{w}") == list(range(1, 26))


@pytest.mark.redis
def test_redis_down_is_a_clear_error(own_redis):
    server = own_redis()
    store = open_store(server.url())
    c = store.put(artifact_bytes(1), stream="s")
    server.stop(signal.SIGKILL)
    with pytest.raises(StoreWriteError, match="unreachable"):
        store.put(artifact_bytes(2), stream="s")
    with pytest.raises(StoreError, match="unreachable"):
        store.get(c.id)


@pytest.mark.parametrize("cluster", ["0", "1"])
def test_a_closed_port_fails_within_seconds_naming_host_port_and_fix(cluster):
    port = free_port()  # nothing listens there
    t0 = time.monotonic()
    with pytest.raises(StoreError, match=rf"unreachable .*127\.0\.0\.1:{port}.*connect_timeout_s") as e:
        open_store(f"redis://127.0.0.1:{port}/0?domain=down&cluster={cluster}")
    assert time.monotonic() - t0 < 10, "an upper bound only: it must not hang"
    assert "redis-server runs at" in str(e.value)


def test_a_server_that_never_answers_times_out_within_seconds():
    with socket.socket() as silent:  # accepts connections (the kernel's backlog) but never replies
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        port = silent.getsockname()[1]
        t0 = time.monotonic()
        with pytest.raises(StoreError, match=rf"socket_timeout_s=0\.3 .*127\.0\.0\.1:{port}"):
            open_store(f"redis://127.0.0.1:{port}/0?domain=silent&socket_timeout_s=0.3&connect_timeout_s=0.3")
        assert time.monotonic() - t0 < 10, "an upper bound only: it must not hang"


@pytest.mark.redis
def test_redis_out_of_memory_is_a_clear_error_and_writes_nothing(own_redis):
    server = own_redis(extra=("--maxmemory", "6mb", "--maxmemory-policy", "noeviction"))
    store = open_store(server.url(chunk_mb=1))
    small = store.put(artifact_bytes(1), stream="s")
    with pytest.raises(StoreWriteError, match="out of memory"):
        store.put(sized_artifact_bytes(2, 12 << 20), stream="s")
    assert leftovers(store) == 0 and [r.id for r in store.log()] == [small.id]
    assert store.put(artifact_bytes(3), stream="s").version == 2
    _assert_intact(store, [small.id])


# ------------------------------------------------------------------- sqlite disks
def test_enospc_while_writing_a_chunk_is_a_clear_error(tmp_path, monkeypatch):
    """Disk full simulated by monkeypatching os.write and os.writev (chunks are written with writev) to raise ENOSPC."""
    store = open_store(f"sqlite:///{tmp_path / 'store'}")
    ok = store.put(artifact_bytes(1), stream="s")

    def full(fd, data):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "write", full)
    monkeypatch.setattr(os, "writev", full)
    data = artifact_bytes(2)
    with pytest.raises(StoreWriteError, match="No space left"):
        store.put(data, stream="s")
    monkeypatch.undo()
    assert leftovers(store) == 0 and [r.id for r in store.log()] == [ok.id]
    with pytest.raises(CommitNotFoundError):
        store.show(Artifact.decode(data).id)
    assert store.put(data, stream="s").version == 2  # and it works once there is room
    _assert_intact(store, [ok.id])


def test_permission_denied_is_a_clear_error(tmp_path, monkeypatch):
    """Permission denied simulated by monkeypatching os.open (root ignores file modes)."""
    store = open_store(f"sqlite:///{tmp_path / 'store'}")
    real_open = os.open

    def denied(path, *a, **kw):
        if str(path).startswith(str(store.root / "tmp")):
            raise PermissionError(errno.EACCES, "Permission denied", str(path))
        return real_open(path, *a, **kw)

    monkeypatch.setattr(os, "open", denied)
    with pytest.raises(StoreWriteError, match="Permission denied"):
        store.put(artifact_bytes(1), stream="s")
    monkeypatch.undo()
    assert store.log() == [] and leftovers(store) == 0
    (tmp_path / "file").write_text("x")
    with pytest.raises(StoreWriteError, match="cannot create the store"):
        open_store(f"sqlite:///{tmp_path / 'file' / 'store'}")


@pytest.fixture
def tiny_tmpfs(tmp_path):
    """A real 3 MB tmpfs (needs root and mount); skips where it cannot be made."""
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    if os.geteuid() != 0:
        pytest.skip("a real full disk needs root to mount a tmpfs; the ENOSPC monkeypatch test covers it")
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=3m", "tmpfs", str(mnt)], capture_output=True)
    if r.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here ({r.stderr.decode().strip()}); the ENOSPC monkeypatch test covers it")
    yield mnt
    subprocess.run(["umount", "-l", str(mnt)], check=False)


def test_a_really_full_disk_refuses_cleanly(tiny_tmpfs, monkeypatch):
    store = open_store(f"sqlite:///{tiny_tmpfs / 'store'}")
    acked, refused = [], None
    for i in range(12):  # ~0.7 MB each into 3 MB: the blob write runs out of space
        data = sized_artifact_bytes(i, 700_000)
        try:
            acked.append(store.put(data, stream="s"))
        except StoreWriteError as e:
            refused = data
            assert "No space left" in str(e)
            break
    assert refused is not None and len(acked) >= 1
    with pytest.raises(CommitNotFoundError):
        store.show(Artifact.decode(refused).id)
    assert leftovers(store) == 0 and [r.id for r in store.log()] == [c.id for c in reversed(acked)]
    _assert_intact(store, [c.id for c in acked])

    # Now fill the disk right after the chunks land, so the metadata commit itself hits SQLITE_FULL.
    filler = tiny_tmpfs / "filler"
    real_publish = SQLiteStore._publish

    def publish_then_fill(self, manifest, staged):
        published = real_publish(self, manifest, staged)
        try:
            with open(filler, "ab") as f:
                while True:
                    f.write(b"\0" * 4096)
                    f.flush()
        except OSError:
            pass  # the disk is full now
        return published

    monkeypatch.setattr(SQLiteStore, "_publish", publish_then_fill)
    small = make_artifact(500, seq=64)
    before = [r.id for r in store.log()]
    try:
        store.put(small.encode(), stream="s")
        committed = True  # the WAL had room left in an already-allocated page
    except StoreWriteError as e:
        committed = False
        assert "full" in str(e).lower() and "nothing was committed" in str(e)
    monkeypatch.undo()
    filler.unlink(missing_ok=True)
    after = [r.id for r in store.log()]
    assert after == ([small.id] + before if committed else before)
    _assert_intact(store, after)
    if not committed:
        # room again: it goes through. (The disk is grown by 1 MB: what the full disk left beside the filler,
        # ~36 KB, is too little for schema 3's commit, which writes more WAL pages: a manifest, chunk rows,
        # the domain's usage.)
        subprocess.run(["mount", "-o", "remount,size=4m", str(tiny_tmpfs)], check=True)
        assert store.put(small.encode(), stream="s").id == small.id
