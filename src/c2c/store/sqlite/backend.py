"""`SQLiteStore`: the embedded default, ``sqlite:////ABSOLUTE/PATH`` or ``sqlite:///RELATIVE/PATH``
(:mod:`c2c.store.sqlite.config`).

``PATH`` is a directory::

    PATH/store.sqlite3                   metadata: commits, their manifests (head, chunk list), chunks and
                                         their reference counts, edges, events, domains (usage, quota),
                                         retention (WAL mode)
    PATH/chunks/<domain>/ab/abcdef...    one file per chunk of a domain, named by its digest
    PATH/tmp/<random>                    chunks being written; renamed into chunks/ when complete

A put writes and fsyncs each chunk the domain lacks under ``tmp/`` (several at once),
renames them to their content addresses, fsyncs their directories, and only then
commits the metadata (commit row, chunk rows and counts, usage) in one ``BEGIN
IMMEDIATE`` transaction, which also checks the quota. A writer killed at any point
therefore leaves either nothing visible or a complete commit; at worst chunk files no
row names, or temp files, which :meth:`sweep_orphans` removes after a grace period.
Nothing counts them: usage is the rows.

A chunk file is deleted only inside a write transaction that sees no row for it, and
a put's transaction checks that every chunk file it adds a row for exists; a row is
deleted (its count reached 0) before its file. So a collector racing a put never
leaves a commit with a missing chunk, and a crash never leaves a row without its file.

Older schemas migrate on open (:mod:`c2c.store.sqlite.schema`); the chunk files are
:mod:`c2c.store.sqlite.chunks`'.

Several processes may share one directory: SQLite serializes the writers and
WAL lets readers proceed while one writes.

Everything is private (:mod:`c2c._io`): chunk and temp files and the database are
mode 0600 (SQLite gives its ``-wal`` and ``-shm`` files the database's mode), and
every directory the store creates is 0700. A directory that already exists, such
as a shared parent the user pointed at, is never ``chmod``-ed.
"""

from __future__ import annotations

import contextlib
import copy
import json
import os
import shutil
import sqlite3
import threading
import time
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import Iterator, Sequence

from c2c import _io
from c2c.errors import CommitNotFoundError, ConfigError, StoreError, StoreWriteError
from c2c.store.interface import (BlobDigest, Commit, CommitId, CommitRecord, StaleEvent, Store, check_id,
                                 check_reason, check_stream, invalidated_reason, stale_reason_for,
                                 superseded_reason)
from c2c.store.gc import Retention, retain_after_put
from c2c.store.ingest import prepare_put
from c2c.store.sqlite.chunks import WRITERS, ChunkFiles, unlink_count
from c2c.store.sqlite.config import SQLiteConfig
from c2c.store.sqlite.schema import SCHEMA_VERSION, migrate
from c2c.store.usage import DomainUsage, StoreStats, check_quota, check_quota_value
from c2c.trust.keys import check_domain

__all__ = ["SCHEMA_VERSION", "SQLiteConfig", "SQLiteStore"]

_PUT_RETRIES = 5       # puts whose chunk was collected between their plan and their commit
_MAX_ROWS = 1 << 62  # a larger LIMIT means "all" (SQLite's integers are 64-bit: 2**63 overflows)


def _cursor(after: str) -> int:
    """An event cursor as this store issues it: the decimal seq of an event (0: the start), below 2**63."""
    if not (isinstance(after, str) and after.isascii() and after.isdigit() and len(after) <= 19
            and int(after) < 1 << 63):
        raise ConfigError(f"event cursor {str(after)[:64]!r} is not one this sqlite store issued; give the "
                          "seq of the last event received, or 0 for the start")
    return int(after)


_COLUMNS = ("id, stream, version, parents, blob, size, created, summary, "
            "stale_reason, stale_chain, superseded_by, format, nchunks")


class SQLiteStore(Store):
    """A store in one local directory. Thread-safe; share the directory across processes freely."""

    def __init__(self, config: SQLiteConfig):
        self.config = config
        self.url = config.url
        self.root = config.root
        self.domain = config.domain
        self._owner = True
        self._lock = threading.RLock()
        self._chunks = ChunkFiles(self.root)
        try:
            for d in (self.root, self.root / "chunks", self.root / "tmp"):
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
                migrate(db, version, self.root, self._chunks.path)
            if (self.root / "blobs").is_dir():  # schema 2's blob files, every one linked into chunks/ by now
                shutil.rmtree(self.root / "blobs", ignore_errors=True)
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
        cid, stream, version, parents, blob, size, created, summary, reason, chain, sup, fmt, nchunks = row
        commit = Commit(id=CommitId(cid), stream=stream, version=version,
                        parents=tuple(CommitId(p) for p in json.loads(parents)), blob=BlobDigest(blob),
                        size=size, created=created, summary=json.loads(summary), format=fmt, chunks=nchunks)
        return CommitRecord(commit=commit, stale=reason is not None, stale_reason=reason,
                            stale_chain=tuple(json.loads(chain)) if chain else (),
                            superseded_by=CommitId(sup) if sup else None)

    # --------------------------------------------------------------- chunk files
    def _chunk_path(self, domain: str, digest: str) -> Path:
        return self._chunks.path(domain, digest)

    def _read_chunks(self, manifest, indices: list[int], out: memoryview, commit_id: str) -> int:
        return self._chunks.read(self.domain, manifest, indices, out, commit_id)

    def _plan(self, cid: str, manifest) -> list[int]:
        """The chunks of ``manifest`` this domain lacks (first index of each); QuotaExceededError
        (nothing written yet) when storing them would pass the domain's quota."""
        d = self.domain
        if self._read("SELECT 1 FROM commits WHERE domain = ? AND id = ?", (d, cid)):
            return []  # putting it again changes nothing
        have = set()
        if manifest.format == 2:
            digests = list(manifest.distinct())
            for i in range(0, len(digests), 500):
                part = digests[i: i + 500]
                have |= {r[0] for r in self._read(
                    f"SELECT digest FROM chunks WHERE domain = ? AND refs > 0 AND digest IN "
                    f"({','.join('?' * len(part))})", (d, *part))}
        which, adding = manifest.to_write(have)
        row = self._read("SELECT quota, stored FROM domains WHERE domain = ?", (d,))
        quota, stored = row[0] if row else (None, 0)
        check_quota(d, quota, stored, adding)
        return which

    def _publish(self, manifest, staged: dict[int, Path]) -> dict[str, Path]:
        """Rename staged chunks to their content addresses and fsync their directories."""
        out: dict[str, Path] = {}
        try:
            for i, tmp in staged.items():
                digest = manifest.chunks[i].digest
                final = self._chunk_path(self.domain, digest)
                _io.private_dir(final.parent, error=StoreWriteError)
                os.replace(tmp, final)
                out[digest] = final
            dirs = {p.parent for p in out.values()}
            with ThreadPoolExecutor(max_workers=WRITERS, thread_name_prefix="c2c-chunk-sync") as pool:
                list(pool.map(_io.fsync_dir, dirs))
        except OSError as e:
            self._chunks.discard(staged)
            self._free(list(out))
            raise StoreWriteError(f"cannot store chunks under {self.root}: {e.strerror or e}; "
                                  "nothing was committed") from e
        return out

    def _free(self, digests: Sequence[str], domain: str | None = None) -> int:
        """Delete the files of chunks ``digests`` that no row names (any more), under the write lock."""
        d = domain or self.domain
        removed = 0
        if not digests:
            return 0
        with self._tx() as db:
            for digest in digests:
                if db.execute("SELECT 1 FROM chunks WHERE domain = ? AND digest = ?", (d, digest)).fetchone() is None:
                    removed += unlink_count(self._chunk_path(d, digest))
        return removed

    # ------------------------------------------------------------------- writing
    def put(self, data, *, stream: str | None = None, parents: Sequence[str] = ()) -> Commit:
        for _ in range(_PUT_RETRIES):
            ing, staged, stream, all_parents = prepare_put(data, stream=stream, parents=parents, plan=self._plan,
                                                           stage=self._chunks.stage, discard=self._chunks.discard,
                                                           piece_bytes=1 << 62)  # a format-1 artifact: one piece
            published: dict[str, Path] = {}
            try:
                for p in all_parents:  # checked again inside the transaction; this spares orphan chunks
                    if not self._read("SELECT 1 FROM commits WHERE domain = ? AND id = ?", (self.domain, p)):
                        raise CommitNotFoundError(f"parent {p[:12]} is not in store {self.url}; put it first")
                published = self._publish(ing.manifest, staged)
                commit, fresh = self._commit(ing, stream, all_parents, published)
            except _Collected:
                self._free(list(published))
                continue  # a chunk it meant to share was collected meanwhile: write it this time
            except BaseException:
                self._chunks.discard(staged)
                with contextlib.suppress(StoreError):  # else they stay as orphans, for sweep_orphans
                    self._free(list(published))  # those no row took: nothing stays behind a refused put
                raise
            if not fresh:
                self._free(list(published))  # already stored: the copies it wrote go again
            break
        else:
            raise StoreWriteError(f"the chunks of {ing.id[:12]} kept being collected while it was put; "
                                  "nothing was committed, put it again")
        retain_after_put(self, commit)
        return commit

    def _commit(self, ing, stream: str, all_parents: tuple[CommitId, ...],
                published: dict[str, Path]) -> tuple[Commit, bool]:
        """Commit the metadata in one transaction; (the commit, whether it is new)."""
        m = ing.manifest
        with self._tx() as db:
            d = self.domain
            row = db.execute(f"SELECT {_COLUMNS} FROM commits WHERE domain = ? AND id = ?", (d, ing.id)).fetchone()
            if row:
                return self._record(row).commit, False
            inherited = None
            for p in all_parents:
                prow = db.execute("SELECT stale_root, stale_cause, stale_chain FROM commits WHERE domain = ? AND id = ?",
                                  (d, p)).fetchone()
                if prow is None:
                    raise CommitNotFoundError(f"parent {p[:12]} is not in store {self.url}; put it first")
                if inherited is None and prow[0] is not None:
                    inherited = prow
            adding, new = len(m.head), 0
            for digest, (size, uses) in m.distinct().items():
                refs = db.execute("SELECT refs FROM chunks WHERE domain = ? AND digest = ?", (d, digest)).fetchone()
                if refs is not None:
                    db.execute("UPDATE chunks SET refs = refs + ? WHERE domain = ? AND digest = ?", (uses, d, digest))
                    continue
                if digest not in published or not published[digest].exists():
                    raise _Collected(digest)
                db.execute("INSERT INTO chunks (domain, digest, size, refs) VALUES (?, ?, ?, ?)", (d, digest, size, uses))
                adding += size
                new += 1
            db.execute("INSERT OR IGNORE INTO domains (domain) VALUES (?)", (d,))
            quota, stored = db.execute("SELECT quota, stored FROM domains WHERE domain = ?", (d,)).fetchone()
            check_quota(d, quota, stored, adding)
            db.execute("UPDATE domains SET commits = commits + 1, logical = logical + ?, stored = stored + ?, "
                       "chunks = chunks + ? WHERE domain = ?", (ing.size, adding, new, d))
            now = time.time()
            head = db.execute("SELECT id, version FROM commits WHERE domain = ? AND stream = ? "
                              "ORDER BY version DESC LIMIT 1", (d, stream)).fetchone()
            version = head[1] + 1 if head else 1
            events: list[StaleEvent] = []
            if head:
                db.execute("UPDATE commits SET superseded_by = ? WHERE domain = ? AND id = ?", (ing.id, d, head[0]))
                self._invalidate_in(db, head[0], superseded_reason(ing.id, stream, version), now, events)
            seq = db.execute("SELECT COALESCE(MAX(seq), 0) + 1 FROM commits").fetchone()[0]
            db.execute("INSERT INTO commits (domain, id, stream, version, parents, blob, size, created, summary, seq, "
                       "format, nchunks) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                       (d, ing.id, stream, version, json.dumps(all_parents), ing.blob, ing.size, now,
                        json.dumps(ing.summary, sort_keys=True), seq, m.format, len(m.chunks)))
            db.execute("INSERT OR REPLACE INTO manifests (domain, id, head, chunks) VALUES (?, ?, ?, ?)",
                       (d, ing.id, m.head, json.dumps(m.stored())))
            db.executemany("INSERT INTO edges (domain, parent, child) VALUES (?, ?, ?)",
                           [(d, p, ing.id) for p in all_parents])
            if inherited is not None:
                root, cause, chain = inherited[0], inherited[1], json.loads(inherited[2]) + [ing.id]
                self._mark(db, ing.id, root, cause, stale_reason_for(root, cause, len(chain) - 1),
                           tuple(chain), now, events)
        return Commit(id=ing.id, stream=stream, version=version, parents=all_parents, blob=ing.blob,
                      size=ing.size, created=now, summary=ing.summary, format=m.format, chunks=len(m.chunks)), True

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

    def _load(self, commit_id: CommitId) -> tuple[CommitRecord, bytes, list]:
        rows = self._read(f"SELECT {', '.join('c.' + x.strip() for x in _COLUMNS.split(','))}, m.head, m.chunks "
                          "FROM commits c JOIN manifests m ON m.domain = c.domain AND m.id = c.id "
                          "WHERE c.domain = ? AND c.id = ?", (self.domain, commit_id))
        if not rows:
            raise CommitNotFoundError(f"no commit {commit_id[:12]} in store {self.url}")
        *row, head, stored = rows[0]
        return self._record(tuple(row)), bytes(head), json.loads(stored)

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
        if cursor:  # a cursor past the domain's last event was never issued (events are never deleted)
            last = self._read("SELECT COALESCE(MAX(dseq), 0) FROM events WHERE domain = ?", (self.domain,))[0][0]
            if cursor > last:
                raise ConfigError(f"event cursor {after!r} is not one this sqlite store issued (the domain's last "
                                  f"is {last}); give the seq of the last event received, or 0 for the start")
        deadline = time.monotonic() + wait_s
        while True:
            rows = self._read("SELECT dseq, commit_id, root, reason, chain, at FROM events WHERE domain = ? "
                              "AND dseq > ? ORDER BY dseq LIMIT ?", (self.domain, cursor, min(int(limit), _MAX_ROWS)))
            if rows or time.monotonic() >= deadline:
                return [StaleEvent(seq=str(s), commit=CommitId(c), root=CommitId(r), reason=why,
                                   chain=tuple(json.loads(ch)), at=at) for s, c, r, why, ch, at in rows]
            time.sleep(min(0.02, max(0.0, deadline - time.monotonic())))  # NOTE: polling; Redis blocks instead

    # ------------------------------------------------------------ bounds, usage
    def set_quota(self, max_bytes: int | None) -> None:
        quota = check_quota_value(max_bytes)
        with self._tx() as db:
            db.execute("INSERT OR IGNORE INTO domains (domain) VALUES (?)", (self.domain,))
            db.execute("UPDATE domains SET quota = ? WHERE domain = ?", (quota, self.domain))

    def set_retention(self, stream: str | None, *, keep_last: int | None = None, ttl_s: float | None = None) -> None:
        name = "" if stream is None else check_stream(stream)
        policy = Retention(keep_last=keep_last, ttl_s=ttl_s)
        with self._tx() as db:
            if policy.active:
                db.execute("INSERT OR REPLACE INTO retention (domain, stream, keep_last, ttl_s) VALUES (?, ?, ?, ?)",
                           (self.domain, name, policy.keep_last, policy.ttl_s))
            else:
                db.execute("DELETE FROM retention WHERE domain = ? AND stream = ?", (self.domain, name))

    def retention(self, stream: str | None) -> Retention:
        name = "" if stream is None else check_stream(stream)
        rows = self._read("SELECT keep_last, ttl_s FROM retention WHERE domain = ? AND stream IN (?, '') "
                          "ORDER BY stream DESC LIMIT 1", (self.domain, name))
        return Retention(keep_last=rows[0][0], ttl_s=rows[0][1]) if rows else Retention()

    def usage(self) -> DomainUsage:
        rows = self._read("SELECT commits, logical, stored, chunks, quota FROM domains WHERE domain = ?", (self.domain,))
        n, logical, stored, chunks, quota = rows[0] if rows else (0, 0, 0, 0, None)
        return DomainUsage(domain=self.domain, commits=n, logical_bytes=logical, stored_bytes=stored, chunks=chunks,
                           quota_bytes=quota)

    def stats(self) -> StoreStats:
        rows = self._read("SELECT domain, commits, logical, stored, chunks, quota FROM domains "
                          "WHERE commits > 0 OR chunks > 0 OR quota IS NOT NULL ORDER BY domain")
        return StoreStats(url=self.url, domains=tuple(
            DomainUsage(domain=d, commits=n, logical_bytes=lg, stored_bytes=st, chunks=ch, quota_bytes=q)
            for d, n, lg, st, ch, q in rows))

    # ----------------------------------------------------------------- lifecycle
    def delete_leaf(self, commit_id: str) -> bool:
        cid = check_id(commit_id)
        freed: list[str] = []
        with self._tx() as db:
            d = self.domain
            row = db.execute("SELECT c.size, length(m.head), m.chunks FROM commits c JOIN manifests m "
                             "ON m.domain = c.domain AND m.id = c.id WHERE c.domain = ? AND c.id = ?", (d, cid)).fetchone()
            if row is None:
                return False
            if db.execute("SELECT 1 FROM edges WHERE domain = ? AND parent = ? LIMIT 1", (d, cid)).fetchone():
                return False
            size, head_bytes, stored = row
            db.execute("DELETE FROM edges WHERE domain = ? AND child = ?", (d, cid))
            db.execute("DELETE FROM commits WHERE domain = ? AND id = ?", (d, cid))
            db.execute("DELETE FROM manifests WHERE domain = ? AND id = ?", (d, cid))
            db.execute("DELETE FROM shares WHERE owner = ? AND commit_id = ?", (d, cid))
            released = head_bytes
            uses: dict[str, int] = {}
            for digest, _, _ in json.loads(stored):
                uses[digest] = uses.get(digest, 0) + 1
            for digest, n in uses.items():
                db.execute("UPDATE chunks SET refs = refs - ? WHERE domain = ? AND digest = ?", (n, d, digest))
                left = db.execute("SELECT refs, size FROM chunks WHERE domain = ? AND digest = ?", (d, digest)).fetchone()
                if left is not None and left[0] <= 0:
                    db.execute("DELETE FROM chunks WHERE domain = ? AND digest = ?", (d, digest))
                    freed.append(digest)
                    released += left[1]
            db.execute("UPDATE domains SET commits = commits - 1, logical = logical - ?, stored = stored - ?, "
                       "chunks = chunks - ? WHERE domain = ?", (size, released, len(freed), d))
        self._free(freed)  # a crash before this leaves orphan files for sweep_orphans
        return True

    def sweep_orphans(self, grace_s: float) -> int:
        cutoff = time.time() - grace_s
        removed = 0
        for tmp in (self.root / "tmp").iterdir():
            if _mtime(tmp) < cutoff:
                removed += unlink_count(tmp)
        for domain_dir in (self.root / "chunks").iterdir():
            old = [p.name for p in domain_dir.glob("??/*") if _mtime(p) < cutoff]
            for i in range(0, len(old), 500):
                removed += self._free(old[i: i + 500], domain=domain_dir.name)
        return removed


class _Collected(Exception):
    """A chunk a put meant to share was freed between its plan and its commit."""




def _mtime(path: Path) -> float:
    try:
        return path.stat().st_mtime
    except OSError:
        return float("inf")
