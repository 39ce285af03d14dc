"""Accepting artifact bytes: validate them while their new chunks are written.

A put first reads the artifact's head (the header, bounded; no tensor byte), which
names every chunk (:mod:`c2c.store.manifest`). The backend then says which chunks it
lacks (and refuses a put past the domain's quota before anything is written). Then
two passes over the bytes run at once: ``Artifact.read_header`` (strict parse, every chunk
digest, NaN/Inf scan) and the backend's write of the chunks it lacks (files, or keys
sent to Redis). hashlib, file I/O and sockets release the GIL, so they overlap.

An artifact of format version 1 names no chunks: it is kept as pieces, hashed on a
third thread.
"""

from __future__ import annotations

import hashlib
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence, TypeVar

from c2c.errors import ConfigError
from c2c.store.interface import BlobDigest, CommitId, check_id, check_stream, check_summary

T = TypeVar("T")


@dataclass(frozen=True, kw_only=True)
class Ingested:
    """What the store needs to know about validated artifact bytes."""

    id: CommitId
    blob: BlobDigest                    # the manifest digest
    size: int
    parents: tuple[CommitId, ...]       # from the artifact header
    default_stream: str                 # producer["agent"], else "default"
    summary: dict[str, Any] = field(default_factory=dict)
    manifest: Any = None                # c2c.store.manifest.Manifest


def summarize(header) -> dict[str, Any]:
    """The header facts a listing shows (``Commit.summary``)."""
    return {"model": header.fingerprint.model_name, "architecture": header.fingerprint.architecture,
            "kind": header.kind, "start": header.start, "end": header.end, "dtype": header.dtype,
            "producer": dict(header.producer), "labels": dict(header.labels), "header_created": header.created}


def ingest(data: bytes | bytearray | memoryview, *, plan: Callable[[str, Any], Sequence[int]],
           stage: Callable[[memoryview, Any, Sequence[int]], T], discard: Callable[[T], Any],
           piece_bytes: int) -> tuple[Ingested, T]:
    """Decode-validate ``data`` while ``stage`` writes the chunks ``plan`` asks for.

    ``plan(commit id, manifest)`` returns the indices of the chunks to write (those the
    store lacks), or raises (:class:`~c2c.errors.QuotaExceededError`) before anything is
    written. ``stage(view, manifest, indices)`` writes them somewhere not yet visible.

    Returns the facts and what ``stage`` returned. If validation fails, what was staged
    is passed to ``discard`` and the :class:`ArtifactError` propagates; if ``stage``
    fails, its exception propagates (``stage`` cleans up after itself).
    """
    from c2c.artifact import Artifact  # lazy: torch loads only when bytes are decoded
    from c2c.store.manifest import Manifest  # lazy: with the codec, as above

    view = memoryview(data).cast("B")
    head, _ = Artifact.peek(view)  # header, table and size checked, no tensor byte read: refuse early
    manifest = Manifest.for_put(view, head, piece_bytes=piece_bytes)
    which = list(plan(check_id(head.digest), manifest))
    with ThreadPoolExecutor(max_workers=3, thread_name_prefix="c2c-ingest") as pool:
        written = pool.submit(stage, view, manifest, which)
        hashed = pool.submit(_piece_digests, view, manifest) if manifest.format == 1 else None
        decoded = pool.submit(_decode_single_threaded, view)
        try:
            header = decoded.result()
            # The store keeps these strings in every listing: it bounds them itself, whatever the parser allowed.
            summary = check_summary(summarize(header))
            cid, parents = check_id(header.digest), tuple(check_id(p, "parent") for p in header.parents)
        except BaseException:
            # Wait for the writer so that nothing it wrote outlives the refusal.
            try:
                discard(written.result())
            except Exception:
                pass
            raise
        if hashed is not None:
            manifest = manifest.with_digests(hashed.result())
        wrote = written.result()
    return Ingested(id=cid, blob=BlobDigest(manifest.digest), size=len(view), parents=parents,
                    default_stream=_stream_of(header.producer.get("agent")), summary=summary,
                    manifest=manifest), wrote


def prepare_put(data, *, stream: str | None, parents: Sequence[str], plan: Callable[[str, Any], Sequence[int]],
                stage: Callable[[memoryview, Any, Sequence[int]], T], discard: Callable[[T], Any],
                piece_bytes: int) -> tuple[Ingested, T, str, tuple[CommitId, ...]]:
    """The part of ``Store.put`` every backend shares: check the arguments, ingest the bytes.

    Returns ``(ingested, what stage returned, the stream, every parent)``: the parents
    are the header's and ``parents``, deduplicated in order. Nothing is committed yet.

    Raises:
        ConfigError: a bad stream name or parent id, or a commit that names itself as parent
            (what was staged is discarded first).
        ArtifactError: the bytes are not a valid artifact (ditto).
        QuotaExceededError: from ``plan``; nothing was written.
    """
    if stream is not None:
        check_stream(stream)
    extra = [check_id(p, "parent") for p in parents]
    ing, written = ingest(data, plan=plan, stage=stage, discard=discard, piece_bytes=piece_bytes)
    all_parents = tuple(dict.fromkeys((*ing.parents, *extra)))
    if ing.id in all_parents:
        discard(written)
        raise ConfigError(f"commit {ing.id[:12]} cannot be its own parent")
    return ing, written, stream or ing.default_stream, all_parents


def _piece_digests(view: memoryview, manifest) -> list[str]:
    return [hashlib.sha256(view[o: o + n]).hexdigest() for c in manifest.chunks for o, n in c.runs]


def _decode_single_threaded(view: memoryview):
    """``Artifact.decode`` with one torch intra-op thread, on this (pool) thread only.

    NOTE: the decode's NaN/Inf scan is an OpenMP loop. Next to the hash and write
    threads (and whatever else the host runs) an OpenMP team oversubscribes the
    cores and its spinning barrier makes the scan 10x slower (measured: 2.0 s
    instead of 0.18 s for 64 MB on 2 loaded cores). OpenMP's thread count is a
    per-thread setting, so pinning it here leaves the caller's threads alone;
    torch's global default is put back before the thread ends.
    """
    import torch  # lazy: torch loads only when bytes are decoded

    from c2c.artifact import Artifact  # lazy: torch loads only when bytes are decoded

    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return Artifact.read_header(view)
    finally:
        torch.set_num_threads(previous)


def _stream_of(agent: str | None) -> str:
    try:
        return check_stream(agent) if agent else "default"
    except ConfigError:
        return "default"
