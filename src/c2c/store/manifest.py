"""A commit's manifest: the head of its artifact and the chunks its bytes are made of.

The store keeps a commit as a *head* (bytes kept with the commit) and a list of
*chunks*, each stored once per trust domain under its digest and shared by every
commit of the domain that lists it (reference-counted):

- **format 2** (artifacts of format version 2): the head is the artifact's first
  ``8 + n`` bytes (length, tensor table, signed header, signature); the chunks are
  the header's (:mod:`c2c.artifact.chunks`): one per run of tokens, then the tail
  of the sliding-window layers, if any. A chunk's bytes lie in many runs of the
  artifact (one per layer, K/V and head), which the store writes and reads in place.
- **format 1** (artifacts of format version 1, and commits of stores from before
  chunks): no head; the artifact's bytes are *pieces* back to back, each under its
  plain sha256.

A commit's ``blob`` is the manifest digest, ``sha256(tag || head || every chunk
digest)``. A read re-checks it, then (format 2) that the head's header hashes to the
commit id and names exactly the chunks listed, then every chunk against its digest:
a stored byte, a chunk, the order of the chunks or the head cannot change unnoticed.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, replace
from typing import Any, Sequence

import torch

import c2c.artifact.chunks as chunks
from c2c.artifact.chunks import CHUNK_TOKENS, ChunkKey
from c2c.artifact.codec import chunk_geometry, dtype_name, head_length, read_head
from c2c.artifact.header import ArtifactHeader
from c2c.errors import ArtifactError, ChunkCorruptError

_MANIFEST_TAG = b"c2c-manifest-v1\0"
_CHUNK_TAG = b"c2c-chunk-v1\0"


@dataclass(frozen=True, kw_only=True)
class ChunkRef:
    """One chunk of a commit.

    Attributes:
        digest: its content address (format 2: keyed, :func:`c2c.artifact.chunks.digest`; format 1: sha256).
        size: its bytes.
        key: its chunk key (format 2), or None for a piece of a format-1 commit.
        runs: where its bytes lie in the artifact, ``(offset, length)`` in digest order.
        tokens: absolute positions ``[a, b)`` of a token chunk; None for a tail or a piece.
    """

    digest: str
    size: int
    key: str | None
    runs: tuple[tuple[int, int], ...]
    tokens: tuple[int, int] | None = None

    def views(self, buf: memoryview) -> list[memoryview]:
        """This chunk's runs as views into ``buf`` (the artifact's bytes)."""
        return [buf[o: o + n] for o, n in self.runs]

    def hash(self, parts) -> str:
        """The digest of ``parts`` (this chunk's bytes, in run order) under this chunk's key."""
        h = hashlib.sha256(_CHUNK_TAG + bytes.fromhex(self.key)) if self.key is not None else hashlib.sha256()
        for p in parts:
            h.update(p)
        return h.hexdigest()

    def verify(self, parts, *, commit: str, index: int) -> None:
        """Raise :class:`ChunkCorruptError` unless ``parts`` hash to this chunk's digest."""
        got = self.hash(parts)
        if got != self.digest:
            where = f" (tokens {self.tokens[0]}..{self.tokens[1] - 1})" if self.tokens else ""
            raise ChunkCorruptError(f"chunk {index}{where} of commit {commit[:12]} does not hash to its digest "
                                    f"{self.digest[:12]} (got {got[:12]}): tampered, or swapped for another; "
                                    "run `c2c store verify`")


@dataclass(frozen=True, kw_only=True)
class HeldPrefix:
    """What a receiver already holds: the chunk keys (and, if computed, digests) of its own cache from
    position 0.

    A store's :meth:`~c2c.store.interface.Commits.fetch` then leaves out every chunk of a commit
    whose key is among them: same model, dtype and tokens up to that chunk's end, so the same
    K/V positions. With ``digests`` (computed once for a cache the receiver keeps, such as its
    team's shared prefix), only chunks whose bytes are the receiver's too are left out, so
    nothing needs hashing when they are put back.
    """

    keys: tuple[ChunkKey, ...]
    tokens_per_chunk: int = CHUNK_TOKENS
    digests: tuple[str, ...] | None = None

    @property
    def tokens(self) -> int:
        return len(self.keys) * self.tokens_per_chunk

    @classmethod
    def of(cls, token_ids: Sequence[int], *, fingerprint, dtype, tokens_per_chunk: int = CHUNK_TOKENS
           ) -> "HeldPrefix":
        """The held prefix of a cache of ``token_ids`` (from position 0) made by ``fingerprint``'s model in
        ``dtype`` (a torch dtype or a header name such as ``BF16``); whole chunks only."""
        name = dtype if isinstance(dtype, str) else dtype_name(dtype)
        whole = len(token_ids) // tokens_per_chunk * tokens_per_chunk
        root = chunks.seed(fingerprint_digest=fingerprint.digest, dtype=name, start=0, prefix=None,
                           tokens=tokens_per_chunk)
        return cls(keys=chunks.chunk_keys(list(token_ids[:whole]), root, tokens_per_chunk),
                   tokens_per_chunk=tokens_per_chunk)

    @classmethod
    def of_cache(cls, cache, fingerprint, *, digests: bool = False) -> "HeldPrefix":
        """The held prefix of a :class:`~c2c.runtime.kvcache.KVCache` that starts at position 0; with
        ``digests``, each whole chunk's digest too (one sha256 pass over the cache)."""
        if cache.start != 0:
            return cls(keys=())
        held = cls.of(cache.token_ids, fingerprint=fingerprint, dtype=cache.dtype)
        if not digests:
            return held
        return replace(held, digests=tuple(
            chunks.digest(k, cache_parts(cache, i * held.tokens_per_chunk, (i + 1) * held.tokens_per_chunk))
            for i, k in enumerate(held.keys)))


def cache_parts(cache, a: int, b: int) -> list:
    """Chunk rows ``[a, b)`` of ``cache`` (from position 0) as byte arrays, in a chunk's run order: each
    full-attention layer's K then V, head by head."""
    out = []
    for layer, window in enumerate(cache.windows):
        if window is None:
            for t in (cache.keys[layer], cache.values[layer]):  # (1, H, T, D)
                rows = t[0, :, a:b]
                out += [rows[h].detach().to("cpu").contiguous().view(-1).view(torch.uint8).numpy()
                        for h in range(rows.shape[0])]
    return out


@dataclass(frozen=True, kw_only=True)
class Manifest:
    """The head and chunks of one commit, and where each chunk lies in the artifact's bytes.

    Attributes:
        format: 2 (chunked by tokens) or 1 (pieces).
        size: bytes of the whole artifact.
        head: the artifact's head (format 2), or ``b""``.
        chunks: in order.
        header: the parsed header (format 2), else None.
    """

    format: int
    size: int
    head: bytes
    chunks: tuple[ChunkRef, ...]
    header: ArtifactHeader | None = None

    # ------------------------------------------------------------ making one
    @classmethod
    def for_put(cls, view: memoryview, header: ArtifactHeader, *, piece_bytes: int) -> "Manifest":
        """The manifest of artifact bytes ``view`` whose (checked) header is ``header``.

        Format 1 pieces are ``piece_bytes`` long and their digests are still unknown (``""``):
        :meth:`with_digests` fills them in once hashed.
        """
        if header.chunks is None:
            n = max(1, -(-len(view) // piece_bytes))
            pieces = tuple(ChunkRef(digest="", size=min(piece_bytes, len(view) - i * piece_bytes), key=None,
                                    runs=((i * piece_bytes, min(piece_bytes, len(view) - i * piece_bytes)),))
                           for i in range(n))
            return cls(format=1, size=len(view), head=b"", chunks=pieces)
        head = bytes(view[: head_length(view)])
        stored = [[d, None, k] for d, k in zip(header.chunks.digests, header.chunks.keys)]
        if header.chunks.tail is not None:
            stored.append([header.chunks.tail, None, header.chunks.tail_key])
        return cls._format2(header, head, stored, len(view))

    @classmethod
    def _format2(cls, header: ArtifactHeader, head: bytes, stored: Sequence, size: int) -> "Manifest":
        geo = chunk_geometry(header)
        c, base = header.chunks, len(head)
        refs = []
        for i in range(geo.count):
            runs = tuple((base + o, n) for o, n in geo.runs(i))
            refs.append(ChunkRef(digest=stored[i][0], size=geo.size(i), key=stored[i][2], runs=runs,
                                 tokens=c.span(i, header.start, header.end)))
        if geo.has_tail:
            refs.append(ChunkRef(digest=stored[-1][0], size=geo.tail_size, key=stored[-1][2],
                                 runs=tuple((base + o, n) for o, n in geo.tail)))
        return cls(format=2, size=size, head=head, chunks=tuple(refs), header=header)

    def with_digests(self, digests: Sequence[str]) -> "Manifest":
        """This manifest with its pieces' digests (format 1)."""
        return replace(self, chunks=tuple(replace(c, digest=d) for c, d in zip(self.chunks, digests)))

    @classmethod
    def load(cls, *, commit_id: str, blob: str, format: int, size: int, head: bytes, stored: Sequence) -> "Manifest":
        """The manifest of a stored commit, checked against what the commit record says.

        Raises:
            ChunkCorruptError: the head or the chunk list does not match the commit's manifest
                digest, or (format 2) the head's header is not this commit's or names other chunks.
        """
        if format == 1:
            refs, off = [], 0
            for d, n, _ in stored:
                refs.append(ChunkRef(digest=d, size=int(n), key=None, runs=((off, int(n)),)))
                off += int(n)
            m = cls(format=1, size=size, head=b"", chunks=tuple(refs))
            if off != size:
                raise ChunkCorruptError(f"the pieces of commit {commit_id[:12]} add up to {off} bytes, not {size}")
        else:
            try:
                header, _ = read_head(head)
            except ArtifactError as e:
                raise ChunkCorruptError(f"the stored head of commit {commit_id[:12]} is damaged: {e}") from None
            if header.digest != commit_id:
                raise ChunkCorruptError(f"the stored head of commit {commit_id[:12]} holds another artifact's "
                                        f"header ({header.digest[:12]}): swapped or tampered")
            m = cls._format2(header, bytes(head), stored, size)
            named = list(header.chunks.digests) + ([header.chunks.tail] if header.chunks.tail else [])
            if [c.digest for c in m.chunks] != named or any(int(s[1]) != c.size for s, c in zip(stored, m.chunks)) \
                    or len(stored) != len(named):
                raise ChunkCorruptError(f"the chunk list of commit {commit_id[:12]} differs from the one its "
                                        "signed header names: swapped or tampered")
        if m.digest != blob:
            raise ChunkCorruptError(f"the head or chunk list of commit {commit_id[:12]} does not hash to its "
                                    f"manifest digest {blob[:12]}: tampered; run `c2c store verify`")
        return m

    # ------------------------------------------------------------ using one
    @property
    def digest(self) -> str:
        """``sha256(tag || head || every chunk digest)``: the commit's ``blob``."""
        h = hashlib.sha256(_MANIFEST_TAG + self.head)
        for c in self.chunks:
            h.update(bytes.fromhex(c.digest))
        return h.hexdigest()

    def stored(self) -> list[list[Any]]:
        """What the commit record keeps: ``[[digest, size, key or None], ...]``."""
        return [[c.digest, c.size, c.key] for c in self.chunks]

    def held(self, held: HeldPrefix | None) -> tuple[int, ...]:
        """Indices of the chunks that ``held`` covers: the longest run of token chunks from position 0
        whose keys the holder has (chained keys, so a match at chunk ``i`` means every earlier one matches)."""
        h = self.header
        if held is None or h is None or h.start != 0 or h.chunks.tokens != held.tokens_per_chunk:
            return ()
        n = 0
        for i, (ref, key) in enumerate(zip(self.chunks, held.keys)):
            if ref.tokens is None or ref.key != key or (held.digests is not None and held.digests[i] != ref.digest):
                break
            n += 1
        return tuple(range(n))

    def to_write(self, have: set[str]) -> tuple[list[int], int]:
        """What a put must write when its domain already holds the chunks ``have``: the index of each
        missing chunk's first use, and the bytes they and the head add."""
        which, seen, adding = [], set(), len(self.head)
        for i, c in enumerate(self.chunks):
            if c.digest not in have and (c.digest not in seen or not c.digest):
                seen.add(c.digest)
                which.append(i)
                adding += c.size
        return which, adding

    def distinct(self) -> dict[str, tuple[int, int]]:
        """``{digest: (size, uses)}``: each chunk once, with how often this commit lists it."""
        out: dict[str, tuple[int, int]] = {}
        for c in self.chunks:
            size, uses = out.get(c.digest, (c.size, 0))
            out[c.digest] = (size, uses + 1)
        return out

