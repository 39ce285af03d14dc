"""Garbage collection: TTL and keep-last-N, never under a live dependent; and stream retention.

A commit *expires* when it is older than ``ttl_s`` or not among the newest
``keep_last`` versions of its stream. The head of every stream never expires
(``latest(stream)`` must keep answering, and versions must keep counting up).
An expired commit is removed only once every commit that depends on it is
removed too; :func:`plan` walks newest to oldest, so children (always newer
than their parents) are decided first. Each removal is an atomic
``delete_leaf`` that re-checks for dependents, so a put racing the collector
cannot lose its parent.

A stream may carry a :class:`Retention` (keep the last N versions, or a TTL; a
domain may set a default for all its streams): every put applies it to its stream
(:func:`retain`), so superseded versions go without anyone running ``c2c store gc``.
Removing a commit releases its chunks; a chunk no commit uses any more is freed.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Sequence

from c2c.errors import ConfigError, StoreError, StoreWriteError
from c2c.store.interface import Commit, CommitId, CommitRecord, Store


@dataclass(frozen=True, kw_only=True)
class GCPolicy:
    """What to collect. With neither ``ttl_s`` nor ``keep_last``, only orphaned blobs go."""

    ttl_s: float | None = None
    keep_last: int | None = None
    orphan_grace_s: float = 3600.0   # NOTE: must exceed the longest put, or a blob being committed could go
    dry_run: bool = False

    def __post_init__(self) -> None:
        if self.ttl_s is not None and self.ttl_s < 0:
            raise ConfigError("ttl_s must be >= 0 seconds")
        if self.keep_last is not None and self.keep_last < 1:
            raise ConfigError("keep_last must be >= 1 (the head of a stream is always kept)")
        if self.orphan_grace_s < 0:
            raise ConfigError("orphan_grace_s must be >= 0 seconds")


@dataclass(frozen=True, kw_only=True)
class Retention:
    """How many versions of a stream to keep, and for how long; the head is always kept.

    Attributes:
        keep_last: keep only the newest N versions (N >= 1).
        ttl_s: drop versions older than this many seconds.
    """

    keep_last: int | None = None
    ttl_s: float | None = None

    def __post_init__(self) -> None:
        GCPolicy(ttl_s=self.ttl_s, keep_last=self.keep_last)  # the same bounds
        if self.ttl_s is not None and not self.ttl_s < float("inf"):
            raise ConfigError("ttl_s must be a finite number of seconds")

    @property
    def active(self) -> bool:
        return self.keep_last is not None or self.ttl_s is not None

    def to_dict(self) -> dict:
        return {"keep_last": self.keep_last, "ttl_s": self.ttl_s}

    @classmethod
    def from_dict(cls, d: dict) -> "Retention":
        return cls(keep_last=d.get("keep_last"), ttl_s=d.get("ttl_s"))


@dataclass(frozen=True, kw_only=True)
class GCReport:
    removed: tuple[CommitId, ...]            # leaf first
    kept_for_dependents: tuple[CommitId, ...]  # expired, but something live is built on them
    orphans_removed: int
    dry_run: bool

    def to_dict(self) -> dict:
        return {"removed": list(self.removed), "kept_for_dependents": list(self.kept_for_dependents),
                "orphans_removed": self.orphans_removed, "dry_run": self.dry_run}


def plan(records: Sequence[CommitRecord], policy: GCPolicy, now: float) -> tuple[list[CommitId], list[CommitId]]:
    """(removable ids, leaf first; expired ids kept for a live dependent) from a snapshot.

    ``records`` is every commit, newest first, as :meth:`Store.log` returns them.
    """
    rank: dict[str, int] = {}
    children: dict[str, list[str]] = {}
    expired = set()
    by_stream: dict[str, list[CommitRecord]] = {}
    for r in records:
        by_stream.setdefault(r.commit.stream, []).append(r)
        for p in r.commit.parents:
            children.setdefault(p, []).append(r.id)
    for stream_records in by_stream.values():
        for i, r in enumerate(sorted(stream_records, key=lambda r: r.commit.version, reverse=True)):
            rank[r.id] = i
    for r in records:
        if rank[r.id] == 0:
            continue  # the head of a stream
        if (policy.ttl_s is not None and now - r.commit.created > policy.ttl_s) or \
                (policy.keep_last is not None and rank[r.id] >= policy.keep_last):
            expired.add(r.id)
    removed: list[CommitId] = []
    gone: set[str] = set()
    # Store.log() is newest first and children are always newer than their parents, so one pass
    # normally settles it; repeat until nothing changes in case the order is not that.
    changed = True
    while changed:
        changed = False
        for r in records:
            if r.id in expired and r.id not in gone and all(c in gone for c in children.get(r.id, ())):
                gone.add(r.id)
                removed.append(r.id)
                changed = True
    kept = [r.id for r in records if r.id in expired and r.id not in gone]
    return removed, kept


def collect(store: Store, policy: GCPolicy, *, now: float | None = None) -> GCReport:
    """Apply ``policy`` to ``store``; see the module docstring."""
    removable, kept = plan(store.log(), policy, time.time() if now is None else now)
    removed: list[CommitId] = []
    if not policy.dry_run:
        for cid in removable:
            if store.delete_leaf(cid):
                removed.append(cid)
            else:
                kept.append(cid)  # a dependent appeared since the snapshot
    orphans = 0 if policy.dry_run else store.sweep_orphans(policy.orphan_grace_s)
    return GCReport(removed=tuple(removable if policy.dry_run else removed), kept_for_dependents=tuple(kept),
                    orphans_removed=orphans, dry_run=policy.dry_run)


def retain(store: Store, stream: str, *, now: float | None = None) -> tuple[CommitId, ...]:
    """Apply ``stream``'s retention (:meth:`Store.retention`) to it; the ids removed, leaf first.

    A version something else still builds on stays (``delete_leaf`` refuses it) until that goes too.
    """
    policy = store.retention(stream)
    if not policy.active:
        return ()
    removable, _ = plan(store.log(stream), GCPolicy(ttl_s=policy.ttl_s, keep_last=policy.keep_last),
                        time.time() if now is None else now)
    return tuple(cid for cid in removable if store.delete_leaf(cid))


def retain_after_put(store: Store, commit: Commit) -> None:
    """Apply ``commit``'s stream retention once the commit is stored (every backend's put ends here).

    Raises:
        StoreWriteError: retention failed; the commit stands, and the next put to the stream or
            ``c2c store gc`` applies the retention.
    """
    try:
        retain(store, commit.stream)
    except StoreError as e:
        raise StoreWriteError(f"commit {commit.id[:12]} is stored as {commit.stream} v{commit.version}, but "
                              f"applying the stream's retention failed ({e}); the next put to the stream or "
                              "`c2c store gc` does it") from e
