"""SQLiteStore specifics: WAL mode, content-addressed chunk files, sweeping orphans, private files, migrations."""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
import stat
import time

import pytest
from store_helpers import artifact_bytes, chunk_location, make_artifact

from c2c.errors import ConfigError
from c2c.store import GCPolicy, Graph, collect, open_store
from c2c.testing.synthetic import as_version_1


def test_layout_wal_and_content_addressed_chunks(tmp_path):
    # The store keeps chunks, not whole artifacts (#33): what the file holds is the chunk's bytes.
    store = open_store(f"sqlite:///{tmp_path / 's'}")
    art = make_artifact(1)
    c = store.put(art.encode(), stream="a")
    fetched = store.fetch(c.id)
    ref = fetched.manifest.chunks[0]
    path = chunk_location(store, c)
    assert path == tmp_path / "s" / "chunks" / "default" / ref.digest[:2] / ref.digest
    assert path.read_bytes() == b"".join(bytes(v) for v in ref.views(memoryview(fetched.record.data)))
    assert ref.hash([path.read_bytes()]) == ref.digest == art.header.chunks.digests[0]
    with sqlite3.connect(tmp_path / "s" / "store.sqlite3") as db:
        assert db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        assert db.execute("PRAGMA user_version").fetchone()[0] == 3
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
    orphan = store.root / "chunks" / "default" / "ab" / ("ab" + "0" * 62)
    orphan.parent.mkdir(exist_ok=True)
    for p in (stale_tmp, young_tmp, orphan):
        p.write_bytes(b"partial")
    os.utime(stale_tmp, (old, old))
    os.utime(orphan, (old, old))
    os.utime(chunk_location(store, keep), (old, old))  # old but referenced
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
    (store.root / "chunks" / "default" / "ab").mkdir(mode=0o700, exist_ok=True)
    (store.root / "chunks" / "default" / "ab" / ("ab" + "0" * 62)).touch(mode=0o600)  # an orphan for the sweep
    report = collect(store, GCPolicy(keep_last=1, orphan_grace_s=0))
    assert report.removed == (d1.id,) and report.orphans_removed == 1 and b.id not in report.removed
    out = Graph.load(store).png(root / "graphs" / "dag.png")
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    modes = _modes(root)  # while the store is open: the -wal and -shm files exist
    chunk = chunk_location(store, c).relative_to(root)
    assert {"store.sqlite3", "store.sqlite3-wal", "store.sqlite3-shm", "chunks", "chunks/default", "tmp",
            "graphs/dag.png", str(chunk)} <= set(modes)
    loose = {path: oct(mode) for path, mode in modes.items() if mode & 0o077}
    assert loose == {}
    assert modes["store.sqlite3"] == modes["store.sqlite3-wal"] == modes["graphs/dag.png"] == 0o600
    assert modes["."] == modes["chunks"] == modes["chunks/default"] == modes["tmp"] == modes["graphs"] == 0o700
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
        chunk_dir = chunk_location(store, c).parent
    assert stat.S_IMODE(existing.stat().st_mode) == 0o755  # the store root itself, pointed at
    assert stat.S_IMODE(shared.stat().st_mode) == 0o755
    assert stat.S_IMODE(chunk_dir.stat().st_mode) == 0o700
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


def _as_version_2(root) -> None:
    """Rewrite a store of format-1 commits in the version-2 layout: one blob file per commit, named by the
    sha256 of its bytes (``blobs/ab/<sha>``), and no chunk tables."""
    db = sqlite3.connect(root / "store.sqlite3", isolation_level=None)
    db.execute("BEGIN")
    rows = db.execute("SELECT c.domain, c.id, c.format, m.chunks FROM commits c JOIN manifests m "
                      "ON m.domain = c.domain AND m.id = c.id").fetchall()
    for domain, cid, fmt, pieces in rows:
        [[blob, _, _]] = json.loads(pieces)
        assert fmt == 1, "a version-2 store held whole artifacts only"
        db.execute("UPDATE commits SET blob = ? WHERE domain = ? AND id = ?", (blob, domain, cid))
        target = root / "blobs" / blob[:2] / blob
        target.parent.mkdir(parents=True, exist_ok=True)
        if not target.exists():
            shutil.copyfile(root / "chunks" / domain / blob[:2] / blob, target)
    for col in ("format", "nchunks"):
        db.execute(f"ALTER TABLE commits DROP COLUMN {col}")
    for t in ("manifests", "chunks", "domains", "retention"):
        db.execute(f"DROP TABLE {t}")
    db.execute("CREATE INDEX commits_blob ON commits (blob)")
    db.execute("PRAGMA user_version = 2")
    db.execute("COMMIT")
    db.close()
    shutil.rmtree(root / "chunks")


def _old_bytes(seed: int, **kw) -> bytes:
    """Artifact bytes as c2c wrote them before chunks (format version 1), which older stores hold."""
    return as_version_1(make_artifact(seed, **kw))


def test_a_version_2_store_keeps_every_commit_as_one_piece_and_shares_chunks_from_then_on(tmp_path):
    root = tmp_path / "store"
    with open_store(f"sqlite:///{root}") as old:
        blue = old.in_domain("blue")
        data = {s: _old_bytes(s) for s in (1, 2, 3)}
        a1 = old.put(data[1], stream="a")
        a2 = old.put(data[2], stream="a", parents=[a1.id])
        b = blue.put(data[1], stream="b")           # the same bytes in another domain: one blob file
        blue.put(data[3], stream="b")
    _as_version_2(root)
    assert len(list((root / "blobs").glob("??/*"))) == 3
    with open_store(f"sqlite:///{root}") as store:
        assert sqlite3.connect(root / "store.sqlite3").execute("PRAGMA user_version").fetchone()[0] == 3
        assert not (root / "blobs").exists()
        blue = store.in_domain("blue")
        for s, cid in ((1, a1.id), (2, a2.id)):
            rec = store.get(cid, allow_stale=True)
            assert rec.data == data[s] and rec.commit.format == 1 and rec.commit.chunks == 1
        assert blue.get(b.id, allow_stale=True).data == data[1]
        assert store.show(a1.id).stale and store.children(a1.id) == (a2.id,)  # history is kept
        assert store.verify() == [] and blue.verify() == []
        # each domain holds its own copy (a hard link of the old blob file), counted once in its usage
        u = store.usage()
        assert (u.commits, u.logical_bytes, u.stored_bytes, u.chunks) == (2, len(data[1]) + len(data[2]),
                                                                          len(data[1]) + len(data[2]), 2)
        assert blue.usage().stored_bytes == len(data[1]) + len(data[3])
        assert chunk_location(store, a1).samefile(chunk_location(blue, b))
        # a commit deleted after the migration frees its piece in its domain only
        mine, theirs = chunk_location(store, a1), chunk_location(blue, b)
        assert store.delete_leaf(a2.id) and store.delete_leaf(a1.id)
        assert not mine.exists() and theirs.exists() and blue.get(b.id, allow_stale=True).data == data[1]
        assert store.usage().stored_bytes == 0 and store.stats().total.commits == 2
        # new commits are kept as chunks
        c = store.put(artifact_bytes(9), stream="c")
        assert store.show(c.id).commit.format == 2


def _as_version_1(root) -> None:
    """Rewrite a store's database in the version-1 layout (one namespace), keeping every row."""
    _as_version_2(root)
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
        first = _old_bytes(1, domain="research")
        r1 = old.put(first, stream="analyst")
        o1 = old.put(_old_bytes(2, domain="other"), stream="analyst")          # superseded r1, back then
        r2 = old.put(_old_bytes(3, domain="research", parents=[r1.id]), stream="writer")
        d1 = old.put(_old_bytes(4), stream="plain")                            # no producer domain
        old.invalidate(o1.id, reason="other's reason")
    _as_version_1(root)
    with open_store(f"sqlite:///{root}") as store:
        assert sqlite3.connect(root / "store.sqlite3").execute("PRAGMA user_version").fetchone()[0] == 3
        research, other = store.in_domain("research"), store.in_domain("other")
        assert [r.id for r in research.log()] == [r2.id, r1.id] and research.children(r1.id) == (r2.id,)
        assert [r.id for r in other.log()] == [o1.id] and [r.id for r in store.log()] == [d1.id]
        assert research.get(r1.id, allow_stale=True).data == first and research.verify() == []
        assert research.streams() == ["analyst", "writer"] and other.streams() == ["analyst"]
        # events follow their commit's domain, numbered from 1 in each
        assert [(e.seq, e.commit) for e in other.events()] == [("1", o1.id)]
        assert research.events() != [] and all(e.commit in (r1.id, r2.id) for e in research.events())
        # and the domains are apart from now on
        nxt = research.put(_old_bytes(5, domain="research"), stream="analyst")
        assert nxt.version == 2 and not other.show(o1.id).superseded_by


def test_an_event_cursor_past_sqlites_integers_is_a_config_error(tmp_path):
    store = open_store(f"sqlite:///{tmp_path / 's'}")
    with pytest.raises(ConfigError, match="cursor"):  # was an OverflowError from SQLite
        store.events(str(2**63))
    with pytest.raises(ConfigError, match="not one this sqlite store issued"):  # well formed, never issued
        store.events(str(2**63 - 1))
    assert store.events("0") == []
