"""`SQLiteStore`: the embedded default, ``sqlite:////ABSOLUTE/PATH`` or ``sqlite:///RELATIVE/PATH``.

The URL follows SQLAlchemy's convention: ``sqlite://`` then ``/`` then the path,
so an absolute path has four slashes (``sqlite:////var/c2c/store``) and three
slashes mean relative to the working directory (``sqlite:///store``). Because
``sqlite:///tmp/x`` reads like ``/tmp/x`` but would mean ``./tmp/x``, a relative
path whose first component is also a top-level directory (``/tmp``, ``/var``,
``/home``, ...) is refused as ambiguous unless written ``sqlite:///./tmp/x``.
``sqlite://HOST/...`` and ``sqlite:PATH`` are refused too.

``PATH`` is a directory::

    PATH/store.sqlite3          metadata: commits, edges, events (WAL mode)
    PATH/blobs/ab/abcdef...     one file per blob, named by the sha256 of its bytes
    PATH/tmp/<random>           blobs being written; renamed into blobs/ when complete

A put writes and fsyncs the blob under ``tmp/``, renames it to its content
address, fsyncs the directory, and only then commits the metadata row in one
``BEGIN IMMEDIATE`` transaction. A writer killed at any point therefore leaves
either nothing visible or a complete commit; at worst an unreferenced blob or
temp file, which :meth:`sweep_orphans` removes after a grace period.

Several processes may share one directory: SQLite serializes the writers and
WAL lets readers proceed while one writes.

Everything is private (:mod:`c2c._io`): blob and temp files and the database are
mode 0600 (SQLite gives its ``-wal`` and ``-shm`` files the database's mode), and
every directory the store creates is 0700. A directory that already exists, such
as a shared parent the user pointed at, is never ``chmod``-ed.
"""

from __future__ import annotations

import contextlib
import copy
import json
import os
import sqlite3
import threading
import time
import uuid
from collections import deque
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Iterator, Sequence
from urllib.parse import parse_qs

from c2c import _io
from c2c.errors import CommitNotFoundError, ConfigError, StoreCorruptError, StoreError, StoreWriteError
from c2c.store.interface import (BlobDigest, BlobProblem, Commit, CommitId, CommitRecord, StaleEvent, Store,
                                 check_id, check_reason, check_stream, invalidated_reason, stale_error,
                                 stale_reason_for, superseded_reason)
from c2c.store.ingest import HashingBuffer, prepare_put
from c2c.trust.keys import check_domain

SCHEMA_VERSION = 2
CHUNK = 8 << 20  # bytes per read/write call on blob files

# Version 2: every row belongs to a trust domain. A commit is (domain, id), a stream is
# (domain, stream), and an edge, an event (numbered per domain) and a share grant live in one
# domain; blobs stay content-addressed across domains (a blob is freed when no commit of any
# domain uses it).
_SCHEMA = """
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
_MAX_ROWS = 1 << 62  # a larger LIMIT means "all" (SQLite's integers are 64-bit: 2**63 overflows)


def _cursor(after: str) -> int:
    """An event cursor as this store issues it: the decimal seq of an event (0: the start), below 2**63."""
    if not (isinstance(after, str) and after.isascii() and after.isdigit() and len(after) <= 19
            and int(after) < 1 << 63):
        raise ConfigError(f"event cursor {str(after)[:64]!r} is not one this sqlite store issued; give the "
                          "seq of the last event received, or 0 for the start")
    return int(after)


_COLUMNS = ("id, stream, version, parents, blob, size, created, summary, "
            "stale_reason, stale_chain, superseded_by")


@dataclass(frozen=True, kw_only=True)
class SQLiteConfig:
    """Where, in which trust domain and how durably:
    ``sqlite:////ABS/PATH?domain=research&synchronous=FULL&busy_timeout_s=30``.

    ``sqlite:////abs/dir`` (four slashes) is the absolute ``/abs/dir``; ``sqlite:///rel/dir``
    (three) is ``rel/dir`` under the working directory, refused as ambiguous when ``/rel``
    is an existing top-level directory (write ``sqlite:///./rel/dir`` to mean the relative one).
    """

    root: Path
    synchronous: str = "FULL"       # NOTE: NORMAL survives process crashes but may lose the last commits on power loss
    busy_timeout_s: float = 30.0
    domain: str = "default"

    @classmethod
    def from_url(cls, url: str) -> "SQLiteConfig":
        scheme, _, rest = url.partition(":")
        if scheme.lower() == "sqlite" and rest.startswith("//") and not rest.startswith("///"):
            raise ConfigError(f"{url!r} names a host; a sqlite store is a local directory: write "
                              "sqlite:////ABS/PATH (four slashes) or sqlite:///RELATIVE/PATH (three)")
        if scheme.lower() != "sqlite" or not rest.startswith("///"):
            raise ConfigError(f"{url!r} is not a sqlite:// URL of a local directory: write "
                              "sqlite:////ABS/PATH (four slashes) or sqlite:///RELATIVE/PATH (three)")
        path, _, query = rest[3:].partition("?")
        if not path:
            raise ConfigError(f"{url!r} names no directory; use sqlite:////ABS/PATH or sqlite:///RELATIVE/PATH")
        first = path.split("/", 1)[0]
        if not path.startswith("/") and first not in (".", "..") and not first.startswith("~") \
                and Path("/" + first).is_dir():
            raise ConfigError(f"{url!r} is ambiguous: three slashes mean the relative path {path!r}, but "
                              f"/{first} is also a top-level directory; write sqlite:////{path} for the "
                              f"absolute path or sqlite:///./{path} for a relative one")
        q = {k: v[-1] for k, v in parse_qs(query).items()}
        unknown = set(q) - {"synchronous", "busy_timeout_s", "domain"}
        if unknown:
            raise ConfigError(f"unknown sqlite store options {sorted(unknown)}; known: domain, synchronous, "
                              "busy_timeout_s")
        sync = q.get("synchronous", "FULL").upper()
        if sync not in ("FULL", "NORMAL", "EXTRA"):
            raise ConfigError(f"synchronous={sync!r}; use FULL, EXTRA or NORMAL")
        try:
            timeout = float(q.get("busy_timeout_s", 30.0))
        except ValueError:
            raise ConfigError("busy_timeout_s must be a number of seconds") from None
        return cls(root=Path(path).expanduser(), synchronous=sync, busy_timeout_s=timeout,
                   domain=check_domain(q.get("domain", "default")))

    @property
    def url(self) -> str:
        """A URL that parses back to ``root`` and the domain: ``sqlite:////abs`` or ``sqlite:///./rel``."""
        base = f"sqlite:///{self.root}" if self.root.is_absolute() else f"sqlite:///./{self.root}"
        return base if self.domain == "default" else f"{base}?domain={self.domain}"


class SQLiteStore(Store):
    """A store in one local directory. Thread-safe; share the directory across processes freely."""

    def __init__(self, config: SQLiteConfig):
        self.config = config
        self.url = config.url
        self.root = config.root
        self.domain = config.domain
        self._owner = True
        self._lock = threading.RLock()
        try:
            for d in (self.root, self.root / "blobs", self.root / "tmp"):
                # 0700 if we create it; an existing one is left as it is
                _io.private_dir(d, error=lambda msg: StoreWriteError(f"cannot create the store at {self.root}: {msg}"))
            db_path = self.root / "store.sqlite3"
            if not db_path.exists():
                # Created 0600 here, not by sqlite3 (0644 under the usual umask); SQLite gives the
                # -wal and -shm files the database's mode.
                with contextlib.suppress(FileExistsError):  # another process made it meanwhile
                    os.close(_io.create_private(db_path))
            self._db = sqlite3.connect(db_path, isolation_level=None,
                                       check_same_thread=False, timeout=config.busy_timeout_s)
            self._db.execute(f"PRAGMA busy_timeout = {int(config.busy_timeout_s * 1000)}")
            mode = self._db.execute("PRAGMA journal_mode = WAL").fetchone()[0]
            if mode.lower() != "wal":
                raise StoreError(f"could not put {self.root} in WAL mode (got {mode}); use a local filesystem")
            self._db.execute(f"PRAGMA synchronous = {config.synchronous}")
            with self._tx() as db:
                version = db.execute("PRAGMA user_version").fetchone()[0]
                if version not in (0, 1, SCHEMA_VERSION):
                    raise StoreError(f"store schema version {version}; this build reads 1 (migrated on open) "
                                     f"and {SCHEMA_VERSION}: use a newer c2c")
                if version == 1:
                    script = _MIGRATE_1_2.format(schema=_SCHEMA, domain_of=_V1_DOMAIN)
                else:
                    script = _SCHEMA if version == 0 else ""
                for statement in script.split(";"):
                    if statement.strip():
                        db.execute(statement)
                db.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
        except OSError as e:
            raise StoreWriteError(f"cannot create the store at {self.root}: {e.strerror or e}") from e
        except sqlite3.Error as e:
            raise StoreWriteError(f"cannot open the store at {self.root}: {e}") from e

    @classmethod
    def from_url(cls, url: str) -> "SQLiteStore":
        return cls(SQLiteConfig.from_url(url))

    def close(self) -> None:
        if self._owner:
            with self._lock:
                self._db.close()

    def in_domain(self, domain: str) -> "SQLiteStore":
        if domain == self.domain:
            return self
        view = copy.copy(self)  # the same connection and lock; only the domain differs
        view.config = replace(self.config, domain=check_domain(domain))
        view.url, view.domain, view._owner = view.config.url, domain, False
        return view

    def grant(self, commit_id: str, domains: Sequence[str]) -> None:
        cid = check_id(commit_id)
        targets = sorted({check_domain(d) for d in domains} - {self.domain})
        with self._tx() as db:
            if db.execute("SELECT 1 FROM commits WHERE domain = ? AND id = ?", (self.domain, cid)).fetchone() is None:
                raise CommitNotFoundError(f"no commit {cid[:12]} in domain {self.domain!r} of store {self.url}")
            db.executemany("INSERT OR REPLACE INTO shares (domain, commit_id, owner) VALUES (?, ?, ?)",
                           [(d, cid, self.domain) for d in targets])

    def granted(self, commit_id: str) -> str | None:
        rows = self._read("SELECT owner FROM shares WHERE domain = ? AND commit_id = ?",
                          (self.domain, check_id(commit_id)))
        return rows[0][0] if rows else None

    # ------------------------------------------------------------ sqlite plumbing
    @contextmanager
    def _tx(self) -> Iterator[sqlite3.Connection]:
        """One write transaction; any sqlite failure becomes StoreWriteError, rolled back."""
        with self._lock:
            db = self._db
            try:
                db.execute("BEGIN IMMEDIATE")
                yield db
                db.execute("COMMIT")
            except BaseException as e:
                if db.in_transaction:
                    try:
                        db.execute("ROLLBACK")
                    except sqlite3.Error:
                        pass
                if isinstance(e, sqlite3.Error):
                    raise StoreWriteError(f"store {self.root}: {e}; nothing was committed") from e
                raise

    def _read(self, sql: str, args: tuple = ()) -> list[tuple]:
        with self._lock:
            try:
                return self._db.execute(sql, args).fetchall()
            except sqlite3.Error as e:
                raise StoreError(f"store {self.root}: {e}") from e

    @staticmethod
    def _record(row: tuple) -> CommitRecord:
        cid, stream, version, parents, blob, size, created, summary, reason, chain, sup = row
        commit = Commit(id=CommitId(cid), stream=stream, version=version,
                        parents=tuple(CommitId(p) for p in json.loads(parents)), blob=BlobDigest(blob),
                        size=size, created=created, summary=json.loads(summary))
        return CommitRecord(commit=commit, stale=reason is not None, stale_reason=reason,
                            stale_chain=tuple(json.loads(chain)) if chain else (),
                            superseded_by=CommitId(sup) if sup else None)

    def _blob_path(self, blob: str) -> Path:
        return self.root / "blobs" / blob[:2] / blob

    # ---------------------------------------------------------------- blob files
    def _write_tmp(self, view: memoryview) -> Path:
        """Write ``view`` to a fresh temp file and fsync it (runs on an ingest thread)."""
        tmp = self.root / "tmp" / uuid.uuid4().hex
        try:
            fd = _io.create_private(tmp)  # 0600; renamed into blobs/ as it is
            try:
                off = 0
                while off < len(view):
                    off += os.write(fd, view[off: off + CHUNK])
                os.fsync(fd)
            finally:
                os.close(fd)
        except OSError as e:
            _unlink(tmp)
            raise StoreWriteError(f"cannot write a blob under {self.root}: {e.strerror or e}; "
                                  "nothing was written") from e
        return tmp

    def _publish_blob(self, tmp: Path, blob: str) -> None:
        """Rename a complete temp file to its content address (or reuse an identical one)."""
        final = self._blob_path(blob)
        try:
            if final.exists():
                # Same bytes already there; touching it keeps sweep_orphans off it until we commit.
                os.utime(final)
                _unlink(tmp)
                return
            _io.private_dir(final.parent, error=StoreWriteError)
            os.replace(tmp, final)
            _io.fsync_dir(final.parent)
        except OSError as e:
            _unlink(tmp)
            raise StoreWriteError(f"cannot store blob {blob[:12]} under {self.root}: {e.strerror or e}; "
                                  "nothing was committed") from e

    def _read_blob(self, commit: Commit) -> bytearray:
        path = self._blob_path(commit.blob)
        try:
            with open(path, "rb", buffering=0) as f, HashingBuffer(commit.size) as buf:
                pos = 0
                while pos < commit.size:
                    n = f.readinto(buf.view[pos: pos + CHUNK])
                    if not n:
                        break
                    buf.filled(pos, pos + n)
                    pos += n
                longer = bool(f.read(1))
                data, digest = buf.finish()
        except FileNotFoundError:
            raise StoreCorruptError(f"blob of commit {commit.id[:12]} is missing ({path})") from None
        except OSError as e:
            raise StoreError(f"cannot read {path}: {e.strerror or e}") from e
        if digest != commit.blob or pos != commit.size or longer:
            raise StoreCorruptError(f"blob of commit {commit.id[:12]} does not hash to {commit.blob[:12]} "
                                    f"({'longer than' if longer else pos} of {commit.size} bytes, "
                                    f"sha256 {digest[:12]}); run `c2c store verify`")
        return data

    # ------------------------------------------------------------------- writing
    def put(self, data, *, stream: str | None = None, parents: Sequence[str] = ()) -> Commit:
        ing, tmp, stream, all_parents = prepare_put(data, stream=stream, parents=parents, write=self._write_tmp,
                                                    discard=_unlink)
        try:
            for p in all_parents:  # checked again inside the transaction; this spares an orphan blob
                if not self._read("SELECT 1 FROM commits WHERE domain = ? AND id = ?", (self.domain, p)):
                    raise CommitNotFoundError(f"parent {p[:12]} is not in store {self.url}; put it first")
            self._publish_blob(tmp, ing.blob)
        finally:
            _unlink(tmp)  # no-op after a rename
        with self._tx() as db:
            d = self.domain
            row = db.execute(f"SELECT {_COLUMNS} FROM commits WHERE domain = ? AND id = ?", (d, ing.id)).fetchone()
            if row:
                return self._record(row).commit
            inherited = None
            for p in all_parents:
                prow = db.execute("SELECT stale_root, stale_cause, stale_chain FROM commits WHERE domain = ? AND id = ?",
                                  (d, p)).fetchone()
                if prow is None:
                    raise CommitNotFoundError(f"parent {p[:12]} is not in store {self.url}; put it first")
                if inherited is None and prow[0] is not None:
                    inherited = prow
            now = time.time()
            head = db.execute("SELECT id, version FROM commits WHERE domain = ? AND stream = ? "
                              "ORDER BY version DESC LIMIT 1", (d, stream)).fetchone()
            version = head[1] + 1 if head else 1
            events: list[StaleEvent] = []
            if head:
                db.execute("UPDATE commits SET superseded_by = ? WHERE domain = ? AND id = ?", (ing.id, d, head[0]))
                self._invalidate_in(db, head[0], superseded_reason(ing.id, stream, version), now, events)
            seq = db.execute("SELECT COALESCE(MAX(seq), 0) + 1 FROM commits").fetchone()[0]
            db.execute(f"INSERT INTO commits (domain, id, stream, version, parents, blob, size, created, summary, "
                       f"seq) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                       (d, ing.id, stream, version, json.dumps(all_parents), ing.blob, ing.size, now,
                        json.dumps(ing.summary, sort_keys=True), seq))
            db.executemany("INSERT INTO edges (domain, parent, child) VALUES (?, ?, ?)",
                           [(d, p, ing.id) for p in all_parents])
            if inherited is not None:
                root, cause, chain = inherited[0], inherited[1], json.loads(inherited[2]) + [ing.id]
                self._mark(db, ing.id, root, cause, stale_reason_for(root, cause, len(chain) - 1),
                           tuple(chain), now, events)
        return Commit(id=ing.id, stream=stream, version=version, parents=all_parents, blob=ing.blob,
                      size=ing.size, created=now, summary=ing.summary)

    def invalidate(self, commit_id: str, *, reason: str) -> list[StaleEvent]:
        cid = check_id(commit_id)
        cause = invalidated_reason(check_reason(reason))
        events: list[StaleEvent] = []
        with self._tx() as db:
            if db.execute("SELECT 1 FROM commits WHERE domain = ? AND id = ?", (self.domain, cid)).fetchone() is None:
                raise CommitNotFoundError(f"no commit {cid[:12]} in store {self.url}")
            self._invalidate_in(db, cid, cause, time.time(), events)
        return events

    def _invalidate_in(self, db: sqlite3.Connection, root: str, cause: str, now: float,
                       events: list[StaleEvent]) -> None:
        """Mark ``root`` stale with ``cause`` and every fresh transitive dependent after it (BFS)."""
        d = self.domain
        if db.execute("SELECT stale_reason FROM commits WHERE domain = ? AND id = ?",
                      (d, root)).fetchone()[0] is not None:
            return  # already stale: so is everything below it
        self._mark(db, root, root, cause, cause, (root,), now, events)
        queue = deque([(root, (root,))])
        while queue:
            node, chain = queue.popleft()
            kids = db.execute("SELECT e.child FROM edges e JOIN commits c ON c.domain = e.domain AND c.id = e.child "
                              "WHERE e.domain = ? AND e.parent = ? AND c.stale_reason IS NULL", (d, node)).fetchall()
            for (kid,) in kids:
                kchain = chain + (kid,)
                self._mark(db, kid, root, cause, stale_reason_for(root, cause, len(kchain) - 1), kchain, now,
                           events)
                queue.append((kid, kchain))

    def _mark(self, db: sqlite3.Connection, cid: str, root: str, cause: str, reason: str, chain: tuple, now: float,
              events: list[StaleEvent]) -> None:
        d, chain_json = self.domain, json.dumps(list(chain))
        db.execute("UPDATE commits SET stale_root = ?, stale_cause = ?, stale_reason = ?, stale_chain = ?, "
                   "stale_at = ? WHERE domain = ? AND id = ?", (root, cause, reason, chain_json, now, d, cid))
        # events are numbered per domain, so a cursor tells nothing of other domains' traffic
        dseq = db.execute("SELECT COALESCE(MAX(dseq), 0) + 1 FROM events WHERE domain = ?", (d,)).fetchone()[0]
        db.execute("INSERT INTO events (domain, dseq, commit_id, root, reason, chain, at) VALUES (?, ?, ?, ?, ?, ?, ?)",
                   (d, dseq, cid, root, reason, chain_json, now))
        events.append(StaleEvent(seq=str(dseq), commit=CommitId(cid), root=CommitId(root),
                                 reason=reason, chain=tuple(chain), at=now))

    # ------------------------------------------------------------------- reading
    def show(self, commit_id: str) -> CommitRecord:
        cid = check_id(commit_id)
        rows = self._read(f"SELECT {_COLUMNS} FROM commits WHERE domain = ? AND id = ?", (self.domain, cid))
        if not rows:
            raise CommitNotFoundError(f"no commit {cid[:12]} in store {self.url}")
        return self._record(rows[0])

    def get(self, commit_id: str, *, allow_stale: bool = False) -> CommitRecord:
        rec = self.show(commit_id)
        if rec.stale and not allow_stale:
            raise stale_error(rec)
        return CommitRecord(commit=rec.commit, stale=rec.stale, stale_reason=rec.stale_reason,
                            stale_chain=rec.stale_chain, superseded_by=rec.superseded_by,
                            data=self._read_blob(rec.commit))

    def latest(self, stream: str) -> CommitRecord:
        check_stream(stream)
        rows = self._read(f"SELECT {_COLUMNS} FROM commits WHERE domain = ? AND stream = ? "
                          "ORDER BY version DESC LIMIT 1", (self.domain, stream))
        if not rows:
            raise CommitNotFoundError(f"stream {stream!r} has no commits in store {self.url}")
        return self._record(rows[0])

    def log(self, stream: str | None = None, *, limit: int | None = None) -> list[CommitRecord]:
        lim = -1 if limit is None else min(int(limit), _MAX_ROWS)
        if stream is None:
            rows = self._read(f"SELECT {_COLUMNS} FROM commits WHERE domain = ? ORDER BY seq DESC LIMIT ?",
                              (self.domain, lim))
        else:
            rows = self._read(f"SELECT {_COLUMNS} FROM commits WHERE domain = ? AND stream = ? "
                              "ORDER BY version DESC LIMIT ?", (self.domain, check_stream(stream), lim))
        return [self._record(r) for r in rows]

    def children(self, commit_id: str) -> tuple[CommitId, ...]:
        cid = check_id(commit_id)
        self.show(cid)
        return tuple(CommitId(r[0]) for r in self._read(
            "SELECT child FROM edges WHERE domain = ? AND parent = ? ORDER BY child", (self.domain, cid)))

    def streams(self) -> list[str]:
        return [r[0] for r in self._read("SELECT DISTINCT stream FROM commits WHERE domain = ? ORDER BY stream",
                                         (self.domain,))]

    def resolve(self, prefix: str) -> CommitId:
        p = prefix.strip().lower()
        if len(p) < 4 or any(c not in "0123456789abcdef" for c in p):
            raise ConfigError(f"{prefix!r} is not a commit id or an id prefix of at least 4 hex chars")
        rows = self._read("SELECT id FROM commits WHERE domain = ? AND id >= ? AND id < ? ORDER BY id LIMIT 2",
                          (self.domain, p, p + "g"))
        if not rows:
            raise CommitNotFoundError(f"no commit id starts with {p} in store {self.url}")
        if len(rows) > 1:
            raise ConfigError(f"id prefix {p} is ambiguous; give more characters")
        return CommitId(rows[0][0])

    def events(self, after: str = "0", *, limit: int = 1000, wait_s: float = 0.0) -> list[StaleEvent]:
        cursor = _cursor(after)
        if limit < 1:
            raise ConfigError(f"events limit {limit}: give at least 1")
        deadline = time.monotonic() + wait_s
        while True:
            rows = self._read("SELECT dseq, commit_id, root, reason, chain, at FROM events WHERE domain = ? "
                              "AND dseq > ? ORDER BY dseq LIMIT ?", (self.domain, cursor, min(int(limit), _MAX_ROWS)))
            if rows or time.monotonic() >= deadline:
                return [StaleEvent(seq=str(s), commit=CommitId(c), root=CommitId(r), reason=why,
                                   chain=tuple(json.loads(ch)), at=at) for s, c, r, why, ch, at in rows]
            time.sleep(min(0.02, max(0.0, deadline - time.monotonic())))  # NOTE: polling; Redis blocks instead

    # ----------------------------------------------------------------- lifecycle
    def verify(self) -> list[BlobProblem]:
        problems = []
        for rec in self.log():
            try:
                self._read_blob(rec.commit)
            except StoreCorruptError as e:
                problems.append(BlobProblem(commit=rec.id, problem=str(e)))
        return problems

    def delete_leaf(self, commit_id: str) -> bool:
        cid = check_id(commit_id)
        with self._tx() as db:
            d = self.domain
            row = db.execute("SELECT blob FROM commits WHERE domain = ? AND id = ?", (d, cid)).fetchone()
            if row is None:
                return False
            if db.execute("SELECT 1 FROM edges WHERE domain = ? AND parent = ? LIMIT 1", (d, cid)).fetchone():
                return False
            db.execute("DELETE FROM edges WHERE domain = ? AND child = ?", (d, cid))
            db.execute("DELETE FROM commits WHERE domain = ? AND id = ?", (d, cid))
            db.execute("DELETE FROM shares WHERE owner = ? AND commit_id = ?", (d, cid))
            shared = db.execute("SELECT 1 FROM commits WHERE blob = ? LIMIT 1", (row[0],)).fetchone()
        if not shared:
            _unlink(self._blob_path(row[0]))  # a crash here leaves an orphan for sweep_orphans
        return True

    def sweep_orphans(self, grace_s: float) -> int:
        cutoff = time.time() - grace_s
        removed = 0
        for tmp in (self.root / "tmp").iterdir():
            if _mtime(tmp) < cutoff:
                removed += _unlink(tmp)
        for path in (self.root / "blobs").glob("??/*"):
            if _mtime(path) < cutoff and not self._read("SELECT 1 FROM commits WHERE blob = ? LIMIT 1",
                                                        (path.name,)):
                removed += _unlink(path)
        return removed


def _unlink(path: Path) -> int:
    try:
        os.unlink(path)
        return 1
    except OSError:
        return 0


def _mtime(path: Path) -> float:
    try:
        return path.stat().st_mtime
    except OSError:
        return float("inf")
