"""Accepting artifact bytes: validate, hash and write them at the same time.

A put does three passes over the bytes: ``Artifact.decode`` (strict parse,
tensor digest, NaN/Inf scan), sha256 of the whole blob (its content address),
and the backend's write (a file, or chunks sent to Redis). hashlib, file I/O and
sockets release the GIL, so the three run on separate threads and a put costs
about as much as the slowest pass, not their sum.

Reading a blob back is the mirror image: :func:`hash_while_reading` hashes each
chunk on a helper thread while the next one is being read.
"""

from __future__ import annotations

import hashlib
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, TypeVar

from c2c.errors import ConfigError
from c2c.store.base import BlobDigest, CommitId, check_id, check_stream

T = TypeVar("T")


@dataclass(frozen=True, kw_only=True)
class Ingested:
    """What the store needs to know about validated artifact bytes."""

    id: CommitId
    blob: BlobDigest
    size: int
    parents: tuple[CommitId, ...]       # from the artifact header
    default_stream: str                 # producer["agent"], else "default"
    summary: dict[str, Any] = field(default_factory=dict)


def summarize(header) -> dict[str, Any]:
    """The header facts a listing shows (``Commit.summary``)."""
    return {"model": header.fingerprint.model_name, "architecture": header.fingerprint.architecture,
            "kind": header.kind, "start": header.start, "end": header.end, "dtype": header.dtype,
            "producer": dict(header.producer), "labels": dict(header.labels), "header_created": header.created}


def ingest(data: bytes | bytearray | memoryview, write: Callable[[memoryview], T],
           discard: Callable[[T], Any]) -> tuple[Ingested, T]:
    """Decode-validate ``data`` while hashing it and while ``write(view)`` stores it.

    Returns the facts and what ``write`` returned. If validation fails, what was
    written is passed to ``discard`` and the :class:`ArtifactError` propagates; if
    ``write`` fails, its exception propagates (``write`` cleans up after itself).
    """
    from c2c.artifact import Artifact

    view = memoryview(data).cast("B")
    with ThreadPoolExecutor(max_workers=2, thread_name_prefix="c2c-ingest") as pool:
        hashed = pool.submit(lambda: hashlib.sha256(view).hexdigest())
        written = pool.submit(write, view)
        try:
            artifact = Artifact.decode(view)
        except BaseException:
            # Wait for the writer so that nothing it wrote outlives the refusal.
            try:
                discard(written.result())
            except Exception:
                pass
            raise
        digest = hashed.result()
        wrote = written.result()
    header = artifact.header
    return Ingested(id=check_id(artifact.id), blob=BlobDigest(digest), size=len(view),
                    parents=tuple(CommitId(p) for p in header.parents),
                    default_stream=_stream_of(header.producer.get("agent")),
                    summary=summarize(header)), wrote


def _stream_of(agent: str | None) -> str:
    try:
        return check_stream(agent) if agent else "default"
    except ConfigError:
        return "default"


def hash_while_reading(chunks: Iterable[bytes]) -> tuple[bytes, str]:
    """Join ``chunks`` and sha256 them, hashing chunk ``i`` while chunk ``i + 1`` is read."""
    h = hashlib.sha256()
    parts: list[bytes] = []
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="c2c-hash") as pool:
        pending = []
        for chunk in chunks:
            parts.append(chunk)
            pending.append(pool.submit(h.update, chunk))  # one worker: updates run in order
        for p in pending:
            p.result()
    data = parts[0] if len(parts) == 1 else b"".join(parts)
    return data, h.hexdigest()
