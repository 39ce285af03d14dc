"""SQLiteStore specifics: WAL mode, content-addressed blob files, sweeping orphans, private files."""

from __future__ import annotations

import os
import sqlite3
import stat
import time

import pytest
from store_helpers import artifact_bytes

from c2c.errors import ConfigError
from c2c.store import GCPolicy, Graph, collect, open_store


def test_layout_wal_and_content_addressed_blobs(tmp_path):
    store = open_store(f"sqlite:///{tmp_path / 's'}")
    data = artifact_bytes(1)
    c = store.put(data, stream="a")
    blob = tmp_path / "s" / "blobs" / c.blob[:2] / c.blob
    assert blob.read_bytes() == data
    with sqlite3.connect(tmp_path / "s" / "store.sqlite3") as db:
        assert db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    assert list((tmp_path / "s" / "tmp").iterdir()) == []


def test_two_handles_on_one_directory_see_each_other(tmp_path):
    url = f"sqlite:///{tmp_path / 's'}"
    one, two = open_store(url), open_store(url)
    c = one.put(artifact_bytes(1), stream="a")
    assert two.get(c.id).commit == c
    assert two.put(artifact_bytes(2), stream="a").version == 2


def test_sweep_removes_only_old_unreferenced_files(tmp_path):
    store = open_store(f"sqlite:///{tmp_path / 's'}")
    keep = store.put(artifact_bytes(1), stream="a")
    old = time.time() - 7200
    stale_tmp = store.root / "tmp" / "dead-writer"
    young_tmp = store.root / "tmp" / "busy-writer"
    orphan = store.root / "blobs" / "ab" / ("ab" + "0" * 62)
    orphan.parent.mkdir(exist_ok=True)
    for p in (stale_tmp, young_tmp, orphan):
        p.write_bytes(b"partial")
    os.utime(stale_tmp, (old, old))
    os.utime(orphan, (old, old))
    os.utime(store.root / "blobs" / keep.blob[:2] / keep.blob, (old, old))  # old but referenced
    report = collect(store, GCPolicy(orphan_grace_s=3600))
    assert report.orphans_removed == 2 and report.removed == ()
    assert not stale_tmp.exists() and not orphan.exists() and young_tmp.exists()
    assert store.verify() == []


# ------------------------------------------------------------------- private files
@pytest.fixture
def lax_umask():
    """The common umask 022, so that only the store's own modes keep files private."""
    old = os.umask(0o022)
    yield
    os.umask(old)


def _modes(root):
    """{path relative to root: permission bits} for root and everything under it."""
    out = {".": stat.S_IMODE(os.lstat(root).st_mode)}
    for dirpath, dirs, files in os.walk(root):
        for name in dirs + files:
            path = os.path.join(dirpath, name)
            out[os.path.relpath(path, root)] = stat.S_IMODE(os.lstat(path).st_mode)
    return out


def test_every_file_and_directory_the_store_writes_is_private(tmp_path, lax_umask):
    root = tmp_path / "s"
    store = open_store(f"sqlite:///{root}")
    a1 = store.put(artifact_bytes(1), stream="a")
    b = store.put(artifact_bytes(2), stream="b", parents=[a1.id])
    store.put(artifact_bytes(3), stream="a")                    # supersedes a1 (and b)
    c = store.put(artifact_bytes(4), stream="c")
    assert store.get(c.id).data is not None
    store.invalidate(c.id, reason="checked")
    d1 = store.put(artifact_bytes(5), stream="d")
    store.put(artifact_bytes(6), stream="d")
    (store.root / "blobs" / "ab").mkdir(mode=0o700, exist_ok=True)
    (store.root / "blobs" / "ab" / ("ab" + "0" * 62)).touch(mode=0o600)  # an orphan for the sweep
    report = collect(store, GCPolicy(keep_last=1, orphan_grace_s=0))
    assert report.removed == (d1.id,) and report.orphans_removed == 1 and b.id not in report.removed
    out = Graph.load(store).png(root / "graphs" / "dag.png")
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    modes = _modes(root)  # while the store is open: the -wal and -shm files exist
    assert {"store.sqlite3", "store.sqlite3-wal", "store.sqlite3-shm", "blobs", "tmp",
            "graphs/dag.png", f"blobs/{c.blob[:2]}/{c.blob}"} <= set(modes)
    loose = {path: oct(mode) for path, mode in modes.items() if mode & 0o077}
    assert loose == {}
    assert modes["store.sqlite3"] == modes["store.sqlite3-wal"] == modes["graphs/dag.png"] == 0o600
    assert modes["."] == modes["blobs"] == modes["tmp"] == modes["graphs"] == 0o700
    store.close()


def test_an_existing_directory_is_never_chmodded(tmp_path, lax_umask):
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o755)
    with open_store(f"sqlite:///{shared / 'store'}") as store:
        store.put(artifact_bytes(1), stream="a")
    assert stat.S_IMODE(shared.stat().st_mode) == 0o755
    assert stat.S_IMODE((shared / "store").stat().st_mode) == 0o700  # made by the store
    existing = tmp_path / "existing"
    existing.mkdir()
    existing.chmod(0o755)
    with open_store(f"sqlite:///{existing}") as store:
        c = store.put(artifact_bytes(2), stream="a")
        Graph.load(store).png(shared / "dag.png")
    assert stat.S_IMODE(existing.stat().st_mode) == 0o755  # the store root itself, pointed at
    assert stat.S_IMODE(shared.stat().st_mode) == 0o755
    assert stat.S_IMODE((existing / "blobs" / c.blob[:2]).stat().st_mode) == 0o700
    assert stat.S_IMODE((shared / "dag.png").stat().st_mode) == 0o600


# The layout of schema version 1 (before trust domains), as c2c wrote it.
V1_SCHEMA = """
CREATE TABLE commits (
    id TEXT PRIMARY KEY, stream TEXT NOT NULL, version INTEGER NOT NULL, parents TEXT NOT NULL,
    blob TEXT NOT NULL, size INTEGER NOT NULL, created REAL NOT NULL, summary TEXT NOT NULL,
    seq INTEGER NOT NULL UNIQUE,
    stale_root TEXT, stale_cause TEXT, stale_reason TEXT, stale_chain TEXT, stale_at REAL,
    superseded_by TEXT,
    UNIQUE (stream, version)
);
CREATE TABLE edges (parent TEXT NOT NULL, child TEXT NOT NULL, PRIMARY KEY (parent, child)) WITHOUT ROWID;
CREATE INDEX edges_child ON edges (child);
CREATE INDEX commits_blob ON commits (blob);
CREATE TABLE events (
    seq INTEGER PRIMARY KEY AUTOINCREMENT, commit_id TEXT NOT NULL, root TEXT NOT NULL,
    reason TEXT NOT NULL, chain TEXT NOT NULL, at REAL NOT NULL
)
"""


def _as_version_1(root) -> None:
    """Rewrite a store's database in the version-1 layout (one namespace), keeping every row."""
    db = sqlite3.connect(root / "store.sqlite3", isolation_level=None)
    db.execute("BEGIN")
    for t in ("commits", "edges", "events", "shares"):
        db.execute(f"ALTER TABLE {t} RENAME TO {t}_v2")
    for idx in ("edges_child", "commits_blob", "commits_seq"):
        db.execute(f"DROP INDEX IF EXISTS {idx}")
    for statement in V1_SCHEMA.split(";"):
        db.execute(statement)
    cols = ("id, stream, version, parents, blob, size, created, summary, seq, stale_root, stale_cause, "
            "stale_reason, stale_chain, stale_at, superseded_by")
    db.execute(f"INSERT INTO commits ({cols}) SELECT {cols} FROM commits_v2")
    db.execute("INSERT INTO edges SELECT parent, child FROM edges_v2")
    db.execute("INSERT INTO events (commit_id, root, reason, chain, at) SELECT commit_id, root, reason, chain, at "
               "FROM events_v2 ORDER BY seq")
    for t in ("commits", "edges", "events", "shares"):
        db.execute(f"DROP TABLE {t}_v2")
    db.execute("PRAGMA user_version = 1")
    db.execute("COMMIT")
    db.close()


def test_a_version_1_store_migrates_each_commit_to_its_producers_domain(tmp_path):
    root = tmp_path / "store"
    with open_store(f"sqlite:///{root}") as old:  # what one namespace held: two tenants, one stream name
        first = artifact_bytes(1, domain="research")
        r1 = old.put(first, stream="analyst")
        o1 = old.put(artifact_bytes(2, domain="other"), stream="analyst")          # superseded r1, back then
        r2 = old.put(artifact_bytes(3, domain="research", parents=[r1.id]), stream="writer")
        d1 = old.put(artifact_bytes(4), stream="plain")                            # no producer domain
        old.invalidate(o1.id, reason="other's reason")
    _as_version_1(root)
    with open_store(f"sqlite:///{root}") as store:
        assert sqlite3.connect(root / "store.sqlite3").execute("PRAGMA user_version").fetchone()[0] == 2
        research, other = store.in_domain("research"), store.in_domain("other")
        assert [r.id for r in research.log()] == [r2.id, r1.id] and research.children(r1.id) == (r2.id,)
        assert [r.id for r in other.log()] == [o1.id] and [r.id for r in store.log()] == [d1.id]
        assert research.get(r1.id, allow_stale=True).data == first
        assert research.streams() == ["analyst", "writer"] and other.streams() == ["analyst"]
        # events follow their commit's domain, numbered from 1 in each
        assert [(e.seq, e.commit) for e in other.events()] == [("1", o1.id)]
        assert research.events() != [] and all(e.commit in (r1.id, r2.id) for e in research.events())
        # and the domains are apart from now on
        nxt = research.put(artifact_bytes(5, domain="research"), stream="analyst")
        assert nxt.version == 2 and not other.show(o1.id).superseded_by


def test_an_event_cursor_past_sqlites_integers_is_a_config_error(tmp_path):
    store = open_store(f"sqlite:///{tmp_path / 's'}")
    with pytest.raises(ConfigError, match="cursor"):  # was an OverflowError from SQLite
        store.events(str(2**63))
    assert store.events(str(2**63 - 1)) == []
