"""Fetch only what is missing: a commit's bytes, with the chunks the reader holds taken from its own cache.

A receiver that already holds a prefix of a commit's tokens (its team's shared
prefix, its own session) asks the store for the rest only
(:meth:`~c2c.store.interface.Commits.fetch` with a :class:`~c2c.store.manifest.HeldPrefix`),
then writes its own K/V for the held chunks into their places. Each of those is
checked against the digest the commit's signed header names: the bytes handed on
are exactly the commit's, and the usual checks (``Artifact.decode``,
:func:`c2c.trust.signing.load_signed`) pass or fail as for a whole get. A held chunk
whose bytes differ (the receiver computed those tokens in another split, say, and
rounded differently) is read from the store after all, and counted.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from c2c.runtime.kvcache import KVCache
from c2c.store.interface import CommitRecord, Store
from c2c.store.manifest import HeldPrefix, cache_parts


@dataclass(frozen=True, kw_only=True)
class FetchReport:
    """What crossed the wire for one commit.

    Attributes:
        commit: its id.
        bytes_fetched: bytes read from the store (head and chunks).
        bytes_referenced: bytes of the whole artifact.
        chunks: chunks the commit lists.
        chunks_held: chunks taken from the reader's own cache.
        chunks_refetched: chunks the reader held but whose bytes differed, read from the store after all.
        own: chunks that hold the reader's own K/V, not checked against their digests (not ``exact``).
    """

    commit: str
    bytes_fetched: int
    bytes_referenced: int
    chunks: int
    chunks_held: int = 0
    chunks_refetched: int = 0
    own: tuple[int, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return {"commit": self.commit, "bytes_fetched": self.bytes_fetched, "bytes_referenced": self.bytes_referenced,
                "chunks": self.chunks, "chunks_held": self.chunks_held, "chunks_refetched": self.chunks_refetched,
                "own": list(self.own)}


def fetch(store: Store, commit_id: str, *, held: KVCache | None = None, fingerprint=None,
          holding: HeldPrefix | None = None, allow_stale: bool = False,
          exact: bool = True) -> tuple[CommitRecord, FetchReport]:
    """``store.get(commit_id)``, reading only the chunks ``held`` does not cover.

    Args:
        held: the reader's cache from position 0 (its shared prefix, its session), or None.
        fingerprint: the :class:`~c2c.artifact.fingerprint.Fingerprint` of the model that made ``held``.
        holding: ``held``'s :class:`HeldPrefix`, if the reader keeps one (with digests, computed once:
            then only chunks whose bytes are the reader's are left out, and none is hashed again).
        exact: check the held chunks against the commit's digests (see the module docstring).

    Returns:
        The record with the whole artifact's bytes, and what was fetched.

    Raises:
        As :meth:`Store.get`.
    """
    prefix = holding
    if prefix is None and held is not None and fingerprint is not None:
        prefix = HeldPrefix.of_cache(held, fingerprint)
    got = store.fetch(commit_id, held=prefix, allow_stale=allow_stale)
    data = memoryview(got.record.data)
    known = prefix is not None and prefix.digests is not None  # held chunks matched by digest: the same bytes
    placed = _place_run(held, got.manifest, got.held, data)   # one copy per layer and head, if it can
    differ = []
    for i in got.held:
        ref = got.manifest.chunks[i]
        if not (placed or _place(held, got.manifest, i, data)) or \
                (exact and not known and ref.hash(ref.views(data)) != ref.digest):
            differ.append(i)
    fetched = got.bytes_read + (store.fill(got, differ) if differ else 0)
    report = FetchReport(commit=got.record.id, bytes_fetched=fetched, bytes_referenced=got.bytes_referenced,
                         chunks=len(got.manifest.chunks), chunks_held=len(got.held) - len(differ),
                         chunks_refetched=len(differ),
                         own=() if exact else tuple(i for i in got.held if i not in differ))
    return got.record, report


def _place(cache: KVCache, manifest, index: int, data: memoryview) -> bool:
    """Write ``cache``'s K/V of chunk ``index`` into its runs of ``data``; whether they fit."""
    ref = manifest.chunks[index]
    a, b = ref.tokens
    if any(t.shape[2] < b for t in cache.keys):
        return False
    parts = cache_parts(cache, a, b)
    if [len(p) for p in parts] != [n for _, n in ref.runs]:
        return False
    for (o, n), part in zip(ref.runs, parts):
        data[o: o + n] = part
    return True


def _place_run(cache: KVCache, manifest, indices: tuple[int, ...], data: memoryview) -> bool:
    """Write ``cache``'s K/V of the chunks ``indices`` (``0 .. m - 1``) into ``data`` at once, one copy per
    layer, K/V and head: in the artifact's layout a head's rows of consecutive chunks lie end to end.
    Whether it could (else each chunk is placed on its own)."""
    if not indices or list(indices) != list(range(len(indices))):
        return False
    refs = [manifest.chunks[i] for i in indices]
    end = refs[-1].tokens[1]
    if any(t.shape[2] < end for t in cache.keys) or len({len(r.runs) for r in refs}) != 1:
        return False
    spans = []
    for r in range(len(refs[0].runs)):
        start, length = refs[0].runs[r]
        for ref in refs[1:]:
            if ref.runs[r][0] != start + length:
                return False
            length += ref.runs[r][1]
        spans.append((start, length))
    parts = cache_parts(cache, 0, end)
    if [len(p) for p in parts] != [n for _, n in spans]:
        return False
    for (o, n), part in zip(spans, parts):
        data[o: o + n] = part
    return True
