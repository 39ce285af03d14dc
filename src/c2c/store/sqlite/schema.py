"""The SQLite store's schema, and the migrations that bring an older store to it on open.

Version 3 (chunks): a commit is a head and a list of chunks (:mod:`c2c.store.manifest`),
kept beside its row (``manifests``: marking a commit stale rewrites its row, which stays small);
chunks are rows of their domain with a reference count, and files under
``chunks/<domain>/``; domains keep their usage and quota; streams (and each domain,
stream ``''``) their retention.

Version 2 (trust domains) kept one blob file per commit, ``blobs/ab/<sha256>``: each
becomes its commits' single piece (format 1), hard-linked (not copied) into the chunk
directory of each domain that uses it. Version 1 (one namespace) goes through 2.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import sqlite3
from pathlib import Path
from typing import Callable

from c2c import _io
from c2c.errors import StoreError, StoreWriteError

SCHEMA_VERSION = 3
_MANIFEST_TAG = b"c2c-manifest-v1\0"  # c2c.store.manifest's: a piece's commit gets its manifest digest

# Version 2: every row belongs to a trust domain. A commit is (domain, id), a stream is
# (domain, stream), and an edge, an event (numbered per domain) and a share grant live in one
# domain; blobs stay content-addressed across domains (a blob is freed when no commit of any
# domain uses it).
_SCHEMA_V2 = """
CREATE TABLE IF NOT EXISTS commits (
    domain TEXT NOT NULL, id TEXT NOT NULL, stream TEXT NOT NULL, version INTEGER NOT NULL,
    parents TEXT NOT NULL, blob TEXT NOT NULL, size INTEGER NOT NULL, created REAL NOT NULL,
    summary TEXT NOT NULL, seq INTEGER NOT NULL UNIQUE,
    stale_root TEXT, stale_cause TEXT, stale_reason TEXT, stale_chain TEXT, stale_at REAL,
    superseded_by TEXT,
    PRIMARY KEY (domain, id),
    UNIQUE (domain, stream, version)
);
CREATE TABLE IF NOT EXISTS edges (
    domain TEXT NOT NULL, parent TEXT NOT NULL, child TEXT NOT NULL, PRIMARY KEY (domain, parent, child)
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS edges_child ON edges (domain, child);
CREATE INDEX IF NOT EXISTS commits_blob ON commits (blob);
CREATE INDEX IF NOT EXISTS commits_seq ON commits (domain, seq);
CREATE TABLE IF NOT EXISTS events (
    seq INTEGER PRIMARY KEY AUTOINCREMENT, domain TEXT NOT NULL, dseq INTEGER NOT NULL,
    commit_id TEXT NOT NULL, root TEXT NOT NULL, reason TEXT NOT NULL, chain TEXT NOT NULL, at REAL NOT NULL,
    UNIQUE (domain, dseq)
);
CREATE TABLE IF NOT EXISTS shares (
    domain TEXT NOT NULL, commit_id TEXT NOT NULL, owner TEXT NOT NULL, PRIMARY KEY (domain, commit_id)
) WITHOUT ROWID;
"""

# Version 3: a commit is a head and a list of chunks (c2c.store.manifest); chunks are rows of their
# domain with a reference count, files under chunks/<domain>/; domains keep their usage and quota;
# streams (and domains, stream '') their retention. Commits of version 2 become format-1 commits of
# one piece, their blob.
_MIGRATE_2_3 = """
ALTER TABLE commits ADD COLUMN format INTEGER NOT NULL DEFAULT 1;
ALTER TABLE commits ADD COLUMN nchunks INTEGER NOT NULL DEFAULT 1;
CREATE TABLE IF NOT EXISTS manifests (
    domain TEXT NOT NULL, id TEXT NOT NULL, head BLOB NOT NULL, chunks TEXT NOT NULL, PRIMARY KEY (domain, id)
);
DROP INDEX IF EXISTS commits_blob;
CREATE TABLE IF NOT EXISTS chunks (
    domain TEXT NOT NULL, digest TEXT NOT NULL, size INTEGER NOT NULL, refs INTEGER NOT NULL,
    PRIMARY KEY (domain, digest)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS domains (
    domain TEXT PRIMARY KEY, quota INTEGER, commits INTEGER NOT NULL DEFAULT 0, logical INTEGER NOT NULL DEFAULT 0,
    stored INTEGER NOT NULL DEFAULT 0, chunks INTEGER NOT NULL DEFAULT 0
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS retention (
    domain TEXT NOT NULL, stream TEXT NOT NULL, keep_last INTEGER, ttl_s REAL, PRIMARY KEY (domain, stream)
) WITHOUT ROWID
"""

# Version 1 -> 2: each commit goes to the domain its header's producer names (else "default"),
# with its edges and events; event cursors are renumbered per domain.
_MIGRATE_1_2 = """
ALTER TABLE commits RENAME TO commits_v1;
ALTER TABLE edges RENAME TO edges_v1;
ALTER TABLE events RENAME TO events_v1;
DROP INDEX IF EXISTS edges_child;
DROP INDEX IF EXISTS commits_blob;
{schema}
INSERT INTO commits (domain, id, stream, version, parents, blob, size, created, summary, seq, stale_root,
                     stale_cause, stale_reason, stale_chain, stale_at, superseded_by)
    SELECT {domain_of}, id, stream, version, parents, blob, size, created, summary, seq, stale_root, stale_cause,
           stale_reason, stale_chain, stale_at, superseded_by FROM commits_v1;
INSERT INTO edges (domain, parent, child)
    SELECT c.domain, e.parent, e.child FROM edges_v1 e JOIN commits c ON c.id = e.child;
INSERT INTO events (seq, domain, dseq, commit_id, root, reason, chain, at)
    SELECT v.seq, c.domain, ROW_NUMBER() OVER (PARTITION BY c.domain ORDER BY v.seq), v.commit_id, v.root,
           v.reason, v.chain, v.at FROM events_v1 v JOIN commits c ON c.id = v.commit_id;
DROP TABLE commits_v1;
DROP TABLE edges_v1;
DROP TABLE events_v1
"""
_V1_DOMAIN = ("CASE WHEN json_valid(summary) AND json_type(summary, '$.producer.domain') = 'text' "
              "THEN json_extract(summary, '$.producer.domain') ELSE 'default' END")


def migrate(db: sqlite3.Connection, version: int, root: Path, chunk_path: Callable[[str, str], Path]) -> None:
    """Bring a store of schema ``version`` (0: new) to :data:`SCHEMA_VERSION`, inside the opening transaction."""
    if version not in (0, 1, 2, SCHEMA_VERSION):
        raise StoreError(f"store schema version {version}; this build reads 1 and 2 (migrated on open) "
                         f"and {SCHEMA_VERSION}: use a newer c2c")
    scripts = {0: [_SCHEMA_V2, _MIGRATE_2_3],
               1: [_MIGRATE_1_2.format(schema=_SCHEMA_V2, domain_of=_V1_DOMAIN), _MIGRATE_2_3],
               2: [_MIGRATE_2_3]}.get(version, [])
    for script in scripts:
        for statement in script.split(";"):
            if statement.strip():
                db.execute(statement)
    if version in (1, 2):
        _migrate_blobs(db, root, chunk_path)
    db.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")


def _migrate_blobs(db: sqlite3.Connection, root: Path, chunk_path: Callable[[str, str], Path]) -> None:
    """Schema 2 -> 3 (inside the opening transaction): every blob becomes the one piece of its
    commits, linked (not copied) into the chunk directory of each domain that uses it."""
    rows = db.execute("SELECT domain, id, blob, size FROM commits").fetchall()
    pieces: dict[tuple[str, str], list[int]] = {}
    for domain, cid, blob, size in rows:
        pieces.setdefault((domain, blob), [size, 0])[1] += 1
        manifest = hashlib.sha256(_MANIFEST_TAG + bytes.fromhex(blob)).hexdigest()
        db.execute("UPDATE commits SET format = 1, nchunks = 1, blob = ? WHERE domain = ? AND id = ?",
                   (manifest, domain, cid))
        db.execute("INSERT OR REPLACE INTO manifests (domain, id, head, chunks) VALUES (?, ?, x'', ?)",
                   (domain, cid, json.dumps([[blob, size, None]])))
    dirs = set()
    for (domain, blob), (size, refs) in pieces.items():
        src, dst = root / "blobs" / blob[:2] / blob, chunk_path(domain, blob)
        _io.private_dir(dst.parent, error=StoreWriteError)
        with contextlib.suppress(FileExistsError, FileNotFoundError):  # done before; or lost before (a
            os.link(src, dst)                                           # read then says ChunkMissingError)
        dirs.add(dst.parent)
        db.execute("INSERT OR REPLACE INTO chunks (domain, digest, size, refs) VALUES (?, ?, ?, ?)",
                   (domain, blob, size, refs))
    for d in dirs:
        _io.fsync_dir(d)
    db.execute("INSERT OR REPLACE INTO domains (domain, commits, logical, stored, chunks) "
               "SELECT c.domain, c.n, c.logical, k.stored, k.chunks FROM "
               "(SELECT domain, COUNT(*) AS n, SUM(size) AS logical FROM commits GROUP BY domain) c JOIN "
               "(SELECT domain, SUM(size) AS stored, COUNT(*) AS chunks FROM chunks GROUP BY domain) k "
               "ON k.domain = c.domain")

