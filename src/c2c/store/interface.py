"""The `Store` interface and the records it deals in.

A store holds immutable, content-addressed **commits**. A commit is one
artifact's bytes (``Artifact.encode()``) plus where it sits in history:

- its **id** is the artifact id (sha256 of the canonical header, which embeds
  the tensor digest), so putting the same artifact twice is a no-op;
- it belongs to a **stream** (one per producing agent) at a **version** that the
  store assigns, 1, 2, 3, ... with no gaps, in commit order;
- its **parents** are the commits it was derived from (attached, sliced, fused):
  the artifact header's ``parents`` plus any given to :meth:`Store.put`. They
  must already be in the store, so the graph is always a DAG.

Staleness is monotone: once a commit is stale it stays stale. It happens when

- a stream publishes version ``n + 1``: version ``n`` is *superseded*, and it
  and every transitive dependent become stale;
- an operator calls :meth:`Store.invalidate`: the commit and every transitive
  dependent become stale;
- a commit is put on top of a stale parent: it is born stale.

Each stale commit records the root cause, the chain of ids from that root down
to itself, and a reason; every marking is also appended to an event log that
subscribers read with :meth:`Store.events` from a cursor, so a consumer that
was down catches up.

**Trust domains.** Every store handle works in one trust domain (``store.domain``;
``?domain=`` in the URL, default ``default``) and :meth:`Store.in_domain` gives a
handle on another one over the same connection. A commit is ``(domain, id)`` and a
stream is ``(domain, stream)``: publishing onto a name another domain uses is just
another stream, and supersession, invalidation, parents, events, GC and listings
never cross domains. A domain reads another domain's commit only where its
owner granted it (:meth:`Store.grant`); the grant is a pointer in the reader's
domain (:meth:`Store.granted`), and the server checks it against the owner's signed
share list before it reads anything.

A consumer chooses: ``get(id)`` raises :class:`StaleCommitError` on a stale
commit, ``latest(stream)`` names the newest version to re-pull, and
``get(id, allow_stale=True)`` returns the record flagged ``stale`` so the caller
continues explicitly "built on stale context".

**Chunks.** A commit's bytes are kept as its artifact's chunks (:mod:`c2c.store.manifest`):
fixed runs of tokens keyed by the chained hash of the tokens they cover, model and
dtype, stored once per trust domain and shared by every commit that lists them
(reference-counted), so a team's commits that share a prefix store it once. Every
read checks each chunk against its digest (:class:`ChunkCorruptError`,
:class:`ChunkMissingError`). :meth:`Store.fetch` leaves out the chunks a receiver
already holds (:class:`~c2c.store.manifest.HeldPrefix`): only the rest crosses the wire.

**Bounds.** A domain may have a byte quota (:meth:`Store.set_quota`; a put past it
raises :class:`QuotaExceededError` and writes nothing) and its streams a retention
(:meth:`Store.set_retention`: keep the last N versions, or a TTL), applied on every put.
:meth:`Store.stats` reports logical and stored bytes per domain.
"""

from __future__ import annotations

import re
from abc import ABC, abstractmethod
from dataclasses import dataclass, field, replace
from typing import Any, NewType, Sequence

from c2c.canon import check_utf8
from c2c.errors import (ArtifactTooLargeError, CommitNotFoundError, ConfigError, StaleCommitError, StoreCorruptError,
                        StoreError)

CommitId = NewType("CommitId", str)   # 64 hex chars: Artifact.id
BlobDigest = NewType("BlobDigest", str)  # 64 hex chars: the manifest digest (head and chunk digests)

# Bounds on the strings a store keeps. Each one is copied: a reason into every dependent's
# stale_reason and into the event log (a 5 MiB reason on a 21-commit chain once grew a
# database by 331 MB); a summary into every listing. Past a bound a write is refused whole.
MAX_STREAM_CHARS = 200            # stream names; they end up in Redis keys
MAX_REASON_CHARS = 1000           # an invalidation reason, after stripping surrounding whitespace
# The artifact parser bounds header strings too; these sit at or above its bounds (c2c.artifact.header,
# c2c.artifact.fingerprint), so that they refuse only what slipped past it, never an artifact it accepts.
MAX_SUMMARY_STRING_CHARS = 4096   # each key and value in Commit.summary (model, dtype, producer, labels, ...)
MAX_SUMMARY_CHARS = 256 << 10     # all keys and values in Commit.summary together

_HEX64 = re.compile(r"[0-9a-f]{64}")
_STREAM = re.compile(rf"[A-Za-z0-9._@/+=-]{{1,{MAX_STREAM_CHARS}}}")


def _shown(value: Any) -> Any:
    """``value`` cut short for an error message (a refused string may be megabytes)."""
    return f"{value[:80]}... ({len(value)} chars)" if isinstance(value, str) and len(value) > 80 else value


def check_id(value: str, what: str = "commit id") -> CommitId:
    """``value`` as a :data:`CommitId`, or :class:`ConfigError` naming what is wrong."""
    if not isinstance(value, str) or not _HEX64.fullmatch(value):
        raise ConfigError(f"{what} {_shown(value)!r} is not a full sha256 hex id (64 lowercase hex chars)")
    return CommitId(value)


def check_stream(name: str) -> str:
    """A stream name: 1-200 of ``A-Z a-z 0-9 . _ @ / + = -`` (they end up in Redis keys)."""
    if not isinstance(name, str) or not _STREAM.fullmatch(name):
        raise ConfigError(f"stream name {_shown(name)!r} must be 1-{MAX_STREAM_CHARS} characters of "
                          "A-Z a-z 0-9 . _ @ / + = -")
    return name


def check_reason(reason: str) -> str:
    """An invalidation reason, stripped: 1 to :data:`MAX_REASON_CHARS` characters, else ConfigError."""
    if not isinstance(reason, str) or not reason.strip():
        raise ConfigError("invalidate needs a reason (it is shown to every consumer of a dependent)")
    reason = check_utf8(reason.strip(), "the invalidation reason")
    if len(reason) > MAX_REASON_CHARS:
        raise ConfigError(f"the invalidation reason is {len(reason)} characters, over the limit of "
                          f"{MAX_REASON_CHARS} (MAX_REASON_CHARS); it is copied into every dependent and "
                          "the event log, so shorten it and point to the details instead")
    return reason


def check_summary(summary: dict[str, Any]) -> dict[str, Any]:
    """``summary`` (header facts from an artifact) if the strings in it are within the bounds.

    The store does not rely on the artifact parser's own bounds: it keeps these strings
    in every listing, so it checks them itself.

    Raises:
        ArtifactTooLargeError: a key or value is longer than :data:`MAX_SUMMARY_STRING_CHARS`,
            or all of them together are longer than :data:`MAX_SUMMARY_CHARS`.
    """

    total = 0

    def walk(value: Any, where: str) -> None:
        nonlocal total
        if isinstance(value, str):
            total += len(value)
            if len(value) > MAX_SUMMARY_STRING_CHARS:
                raise ArtifactTooLargeError(
                    f"artifact header field {where} is {len(value)} characters, over the store's limit of "
                    f"{MAX_SUMMARY_STRING_CHARS} (MAX_SUMMARY_STRING_CHARS); shorten it, nothing was stored")
        elif isinstance(value, dict):
            for k, v in value.items():
                walk(k, f"a key of {where or 'the summary'}")
                walk(v, f"{where}[{str(k)[:40]!r}]" if where else str(k)[:40])
        elif isinstance(value, (list, tuple)):
            for i, v in enumerate(value):
                walk(v, f"{where}[{i}]")

    walk(summary, "")
    if total > MAX_SUMMARY_CHARS:
        raise ArtifactTooLargeError(
            f"the artifact's summary strings (model, producer, labels, ...) total {total} characters, over the "
            f"store's limit of {MAX_SUMMARY_CHARS} (MAX_SUMMARY_CHARS); use fewer or shorter labels, "
            "nothing was stored")
    return summary


@dataclass(frozen=True, kw_only=True)
class Commit:
    """The immutable facts of one stored artifact.

    Attributes:
        id: the artifact id (content address of the header, hence of the tensors).
        stream: the per-agent stream it was published on.
        version: its 1-based position in ``stream``.
        parents: ids of the commits it was derived from.
        blob: the manifest digest (its head and every chunk digest, :mod:`c2c.store.manifest`);
            every read re-checks it, and every chunk against its own digest.
        size: length of the artifact's bytes.
        created: when the store accepted it (unix seconds, the store's clock).
        summary: a few header facts for listings (model, kind, span, dtype, labels).
        format: 2 for a commit kept as token chunks, 1 for one kept as pieces (older artifacts).
        chunks: how many chunks (or pieces) it lists.
    """

    id: CommitId
    stream: str
    version: int
    parents: tuple[CommitId, ...]
    blob: BlobDigest
    size: int
    created: float
    summary: dict[str, Any] = field(default_factory=dict)
    format: int = 2
    chunks: int = 0

    def to_dict(self) -> dict[str, Any]:
        return {"id": self.id, "stream": self.stream, "version": self.version, "parents": list(self.parents),
                "blob": self.blob, "size": self.size, "created": self.created, "summary": dict(self.summary),
                "format": self.format, "chunks": self.chunks}


@dataclass(frozen=True, kw_only=True)
class CommitRecord:
    """A commit as read now: its facts, its staleness, and (from :meth:`Store.get`) its bytes.

    Attributes:
        commit: the immutable facts.
        stale: True once the commit or anything it was built on was superseded or invalidated.
        stale_reason: one line saying why, or None when fresh.
        stale_chain: ids from the root cause down to this commit (both included); () when fresh.
        superseded_by: the next version of the same stream, once there is one.
        data: the artifact bytes (``Artifact.decode``-able), or None for a metadata-only read.
            NOTE: a ``bytearray``, filled in place by the read; a ``bytes`` copy would cost a
            second pass over fresh memory (~20% of a 64 MB get on the reference machine).
    """

    commit: Commit
    stale: bool = False
    stale_reason: str | None = None
    stale_chain: tuple[CommitId, ...] = ()
    superseded_by: CommitId | None = None
    data: bytes | bytearray | None = field(default=None, repr=False)

    @property
    def id(self) -> CommitId:
        return self.commit.id

    @property
    def stale_root(self) -> CommitId | None:
        """The commit whose supersession or invalidation made this one stale."""
        return self.stale_chain[0] if self.stale_chain else None

    def artifact(self):
        """Decode (and fully validate) the bytes into an :class:`~c2c.artifact.Artifact`."""
        from c2c.artifact import Artifact  # lazy: torch loads only when a commit's bytes are decoded

        if self.data is None:
            raise StoreError(f"record {self.id[:12]} was read without its bytes; use store.get(id)")
        return Artifact.decode(self.data)

    def to_dict(self) -> dict[str, Any]:
        d = self.commit.to_dict()
        d.update(stale=self.stale, stale_reason=self.stale_reason, stale_chain=list(self.stale_chain),
                 superseded_by=self.superseded_by)
        return d


@dataclass(frozen=True, kw_only=True)
class Fetched:
    """A commit read by :meth:`Store.fetch`: its record and bytes, without the chunks the reader holds.

    Attributes:
        record: the commit; ``record.data`` is the artifact's bytes, where the chunks in ``held``
            are left zero for the reader to fill from its own cache (:mod:`c2c.store.fetch`).
        manifest: its head and chunks, and where each lies in ``record.data``.
        held: indices (into ``manifest.chunks``) of the chunks not read.
        bytes_read: bytes that came from the store (the head and every chunk read).
    """

    record: CommitRecord
    manifest: Any  # c2c.store.manifest.Manifest
    held: tuple[int, ...] = ()
    bytes_read: int = 0

    @property
    def bytes_referenced(self) -> int:
        """The whole artifact's bytes."""
        return self.record.commit.size

    @property
    def complete(self) -> bool:
        return not self.held


@dataclass(frozen=True, kw_only=True)
class StaleEvent:
    """One commit marked stale, as delivered to subscribers.

    Attributes:
        seq: the event's cursor; pass it as ``after`` to :meth:`Store.events` to resume.
        commit: the commit that became stale.
        root: the superseded or invalidated commit that caused it.
        reason: the same line as the commit's ``stale_reason``.
        chain: ids from ``root`` down to ``commit``.
        at: when it was marked (unix seconds, the store's clock).
    """

    seq: str
    commit: CommitId
    root: CommitId
    reason: str
    chain: tuple[CommitId, ...]
    at: float

    def to_dict(self) -> dict[str, Any]:
        return {"seq": self.seq, "commit": self.commit, "root": self.root, "reason": self.reason,
                "chain": list(self.chain), "at": self.at}


@dataclass(frozen=True, kw_only=True)
class BlobProblem:
    """A commit whose stored bytes are missing or no longer hash to its blob digest."""

    commit: CommitId
    problem: str


def stale_reason_for(root: str, root_reason: str, hops: int) -> str:
    """The reason recorded on a dependent ``hops`` edges below the stale ``root``."""
    return f"built on stale {root[:12]} ({hops} hop{'s' if hops != 1 else ''} up): {root_reason}"


def superseded_reason(new_id: str, stream: str, version: int) -> str:
    return f"superseded by {new_id[:12]} (stream {stream} v{version})"


def invalidated_reason(reason: str) -> str:
    return f"invalidated: {reason}"


def stale_error(record: CommitRecord):
    """The :class:`StaleCommitError` a fresh-only read of ``record`` raises."""

    c = record.commit
    return StaleCommitError(
        f"commit {c.id[:12]} (stream {c.stream} v{c.version}) is stale: {record.stale_reason}. "
        f"Re-pull store.latest({c.stream!r}), or pass allow_stale=True to continue on stale context")


class Commits(ABC):
    """The commits of one trust domain: append-only versions on streams, read whole or only what a reader lacks, and
    their stored bytes checked (:meth:`verify`)."""

    @abstractmethod
    def put(self, data: bytes | bytearray | memoryview, *, stream: str | None = None,
            parents: Sequence[str] = ()) -> Commit:
        """Validate ``data`` (``Artifact.decode``) and commit it as the next version of ``stream``.

        ``stream`` defaults to the header's ``producer["agent"]``, else ``"default"``.

        Returns the new commit, or the existing one unchanged if this artifact id is
        already stored (then ``stream`` and ``parents`` are ignored).

        Raises:
            ArtifactError: ``data`` is not a valid artifact, or its summary strings (labels,
                producer, ...) are past :data:`MAX_SUMMARY_STRING_CHARS` / :data:`MAX_SUMMARY_CHARS`
                (:class:`ArtifactTooLargeError`).
            ConfigError: ``stream`` or a parent id is malformed (see :func:`check_stream`).
            CommitNotFoundError: a parent is not in this store.
            StoreWriteError: disk full, permission denied, server down; nothing visible changed.
        """

    @abstractmethod
    def show(self, commit_id: str) -> CommitRecord:
        """The commit's facts and staleness, without its bytes."""

    def has(self, commit_id: str) -> bool:
        """Whether this domain's part of the store holds ``commit_id``."""
        try:
            self.show(commit_id)
        except CommitNotFoundError:
            return False
        return True

    def get(self, commit_id: str, *, allow_stale: bool = False) -> CommitRecord:
        """The commit with its bytes; every chunk re-hashed against its digest.

        Raises:
            StaleCommitError: the commit is stale and ``allow_stale`` is False.
            ChunkMissingError, ChunkCorruptError (:class:`StoreCorruptError`): a chunk is missing or
                does not hash to its digest, or the commit's head or chunk list was changed.
        """
        return self.fetch(commit_id, allow_stale=allow_stale).record

    def fetch(self, commit_id: str, *, held=None, allow_stale: bool = False) -> Fetched:
        """The commit's bytes but for the chunks the caller already holds.

        Args:
            held: a :class:`~c2c.store.manifest.HeldPrefix`: the chunk keys of the caller's own
                cache from position 0. The commit's chunks whose keys it names are not read
                (``Fetched.held``); None reads everything, as :meth:`get` does.
            allow_stale: as for :meth:`get`.

        Raises:
            As :meth:`get`.
        """
        from c2c.store.manifest import Manifest  # lazy: the artifact codec (torch) only when bytes are read

        cid = check_id(commit_id)
        rec, head, stored = self._load(cid)
        if rec.stale and not allow_stale:
            raise stale_error(rec)
        c = rec.commit
        manifest = Manifest.load(commit_id=cid, blob=c.blob, format=c.format, size=c.size, head=head, stored=stored)
        skip = set(manifest.held(held))
        data = bytearray(c.size)
        data[: len(head)] = head
        want = [i for i in range(len(manifest.chunks)) if i not in skip]
        try:
            n = self._read_chunks(manifest, want, memoryview(data), cid)
        except StoreCorruptError:
            self.show(cid)  # collected meanwhile (gc)? then that is the answer
            raise
        return Fetched(record=replace(rec, data=data), manifest=manifest, held=tuple(sorted(skip)),
                       bytes_read=len(head) + n)

    def fill(self, fetched: Fetched, indices: Sequence[int]) -> int:
        """Read chunks ``indices`` of a fetched commit into ``fetched.record.data``; the bytes read."""
        return self._read_chunks(fetched.manifest, list(indices), memoryview(fetched.record.data), fetched.record.id)

    @abstractmethod
    def _load(self, commit_id: CommitId) -> tuple[CommitRecord, bytes, list]:
        """(the record without bytes, its head, its stored chunk list ``[[digest, size, key], ...]``).

        Raises:
            CommitNotFoundError.
        """

    @abstractmethod
    def _read_chunks(self, manifest, indices: list[int], out: memoryview, commit_id: str) -> int:
        """Read chunks ``indices`` of ``manifest`` into their runs of ``out``, each checked against its
        digest; returns the bytes read.

        Raises:
            ChunkMissingError, ChunkCorruptError.
        """

    @abstractmethod
    def latest(self, stream: str) -> CommitRecord:
        """The newest version of ``stream`` (without bytes); CommitNotFoundError if it has none."""

    @abstractmethod
    def log(self, stream: str | None = None, *, limit: int | None = None) -> list[CommitRecord]:
        """Commits newest first, of one stream or of all; without bytes."""

    @abstractmethod
    def streams(self) -> list[str]:
        """Every stream name, sorted."""

    @abstractmethod
    def resolve(self, prefix: str) -> CommitId:
        """The one full id starting with ``prefix`` (at least 4 hex chars), for humans and the CLI."""

    def verify(self) -> list[BlobProblem]:
        """Re-read every commit, re-hashing each chunk; the problems found (empty when all is intact)."""
        problems = []
        for rec in self.log():
            try:
                self.fetch(rec.id, allow_stale=True)
            except StoreCorruptError as e:
                problems.append(BlobProblem(commit=rec.id, problem=str(e)))
            except CommitNotFoundError:
                pass  # removed by a concurrent gc
        return problems


class Lineage(ABC):
    """The dependency graph of commits and its invalidation: who depends on whom, what went stale, in order."""

    @abstractmethod
    def invalidate(self, commit_id: str, *, reason: str) -> list[StaleEvent]:
        """Mark ``commit_id`` and every transitive dependent stale; returns the new events.

        Commits already stale keep their first cause and are not re-announced.

        Raises:
            ConfigError: ``reason`` is blank or longer than :data:`MAX_REASON_CHARS` once
                stripped (see :func:`check_reason`); nothing is marked.
            CommitNotFoundError: ``commit_id`` is not in this store.
        """

    @abstractmethod
    def children(self, commit_id: str) -> tuple[CommitId, ...]:
        """Ids of the commits that list ``commit_id`` as a parent."""

    @abstractmethod
    def events(self, after: str = "0", *, limit: int = 1000, wait_s: float = 0.0) -> list[StaleEvent]:
        """Stale events after cursor ``after`` ("0" = from the start), oldest first.

        With ``wait_s > 0`` it waits up to that long for the first new event.
        """


class Sharing(ABC):
    """Trust domains of one store: a handle per domain, and the commits one domain grants another."""

    @abstractmethod
    def in_domain(self, domain: str) -> "Store":
        """A handle on trust domain ``domain`` of the same store (sharing this one's connection).

        Closing it leaves this handle open; closing this one closes both.

        Raises:
            ConfigError: ``domain`` is not a valid trust-domain name.
        """

    @abstractmethod
    def grant(self, commit_id: str, domains: Sequence[str]) -> None:
        """Let each of ``domains`` find ``commit_id`` of this domain (:meth:`granted` there).

        Raises:
            CommitNotFoundError: this domain has no such commit.
            ConfigError: a domain name is not valid.
        """

    @abstractmethod
    def granted(self, commit_id: str) -> str | None:
        """The domain that granted this domain ``commit_id``, or None."""


class Admin(ABC):
    """What bounds a store and keeps it clean: quota, retention, usage, and collecting what nothing references."""

    @abstractmethod
    def set_quota(self, max_bytes: int | None) -> None:
        """Bound this domain's stored bytes (None: no bound). Puts past it raise QuotaExceededError.

        Raises:
            ConfigError: not a number of bytes.
        """

    @abstractmethod
    def set_retention(self, stream: str | None, *, keep_last: int | None = None, ttl_s: float | None = None) -> None:
        """Keep only the last ``keep_last`` versions of ``stream`` and / or those younger than ``ttl_s``
        (both None: no retention); ``stream`` None sets this domain's default for every stream.
        Applied on every put to the stream (:func:`c2c.store.gc.retain`).
        """

    @abstractmethod
    def retention(self, stream: str | None):
        """The :class:`~c2c.store.gc.Retention` of ``stream``: its own, else the domain's default
        (``stream`` None: the default alone)."""

    @abstractmethod
    def usage(self):
        """This domain's :class:`~c2c.store.usage.DomainUsage`: commits, logical and stored bytes, quota."""

    @abstractmethod
    def stats(self):
        """:class:`~c2c.store.usage.StoreStats`: the usage of every domain this handle can list."""

    @abstractmethod
    def delete_leaf(self, commit_id: str) -> bool:
        """Remove a commit, atomically, only if nothing depends on it; chunks no other commit uses are freed.

        Returns False (and changes nothing) if it has dependents. Used by :mod:`c2c.store.gc`.
        """

    @abstractmethod
    def sweep_orphans(self, grace_s: float) -> int:
        """Remove chunks and partial uploads no commit references, older than ``grace_s``."""


class Store(Commits, Lineage, Sharing, Admin):
    """Versioned, append-only commit store, in one trust domain. Open one with :func:`c2c.store.open_store`.

    Its surface splits by concern: :class:`Commits` (write and read), :class:`Lineage` (the dependency graph and
    invalidation), :class:`Sharing` (domains and grants) and :class:`Admin` (quota, retention, collection); a
    caller that needs one concern may type against that one. Every backend passes
    ``tests/store/test_store_conformance.py``. Methods raise
    :class:`CommitNotFoundError` for unknown ids, :class:`StoreWriteError` when a
    write could not be made durable (nothing half-written is ever visible), and
    :class:`StoreCorruptError` when stored bytes no longer hash to their digest.
    """

    url: str
    domain: str

    def close(self) -> None:
        """Release connections; the store must not be used afterwards."""

    def __enter__(self) -> "Store":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
