"""Chunks: a cache cut into runs of a fixed number of tokens, each named by what it holds.

An artifact of format version 2 cuts its tokens ``[start, end)`` into chunks of
``tokens`` tokens (:data:`CHUNK_TOKENS`; the last chunk may be shorter). A chunk
holds, for its tokens, the K and V rows of every full-attention layer::

    for each tensor k.000, v.000, k.001, ... of a full-attention layer   # (1, H, T, D)
        for each kv head h: rows [a, b)                                   # (b - a) * D values

so its bytes lie in ``2 * layers * H`` runs of the artifact's data section, which
keeps its layer-major safetensors layout. A sliding-window layer keeps only the last
``W - 1`` tokens, which move with the cache's end: its tensors are one *tail*, never
shared between caches.

Each chunk has

- a **key**: the chained hash of its tokens (:func:`c2c.artifact.prefix.block_hashes`
  with one block per chunk), rooted in a seed that names the model fingerprint, the
  dtype, the first position, the chunk size and, for a slice, the shared prefix it
  was computed after. Two caches have the same key for chunk ``i`` exactly when the
  same model and dtype computed the same tokens up to the end of that chunk from the
  same start: the K/V they hold then depend on nothing else (causal attention), so a
  store shares the chunk between them, and a receiver that holds those tokens can tell
  which chunks it already has.
- a **digest**: ``sha256("c2c-chunk-v1\\0" || key || chunk bytes)``, its content
  address. It binds the bytes to the key, so a chunk moved to another position, cache
  or model no longer verifies.

The header lists every key and digest (``chunks``) and its ``tensor_digest`` is
``sha256(tensor table || digest_0 || ... || digest_n-1 || tail digest)``: the
signature over the header covers every chunk, and each chunk can be checked alone.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any, Iterable, NewType, Sequence

from c2c.artifact.prefix import PrefixRef, block_hashes
from c2c.canon import canonical_json

ChunkKey = NewType("ChunkKey", str)        # 64 hex chars: the chained hash of a chunk's tokens
ChunkDigest = NewType("ChunkDigest", str)  # 64 hex chars: sha256 of the chunk's key and bytes

CHUNK_TOKENS = 64          # tokens per chunk; 12 KiB/token (Qwen2.5-0.5B, bf16) makes a 768 KiB chunk
MAX_CHUNK_TOKENS = 1 << 16
_CHUNK_TAG = b"c2c-chunk-v1\0"
_TAIL_TAG = b"c2c-tail-v1\0"


def _hex(v: Any, what: str) -> str:
    if not isinstance(v, str) or len(v) != 64 or any(c not in "0123456789abcdef" for c in v):
        raise ValueError(f"{what} must be a sha256 hex digest")
    return v


@dataclass(frozen=True, kw_only=True)
class ChunkIndex:
    """The header's ``chunks`` field: chunk size, and each chunk's key and digest.

    Attributes:
        tokens: tokens per chunk.
        keys: one key per chunk, in token order.
        digests: one digest per chunk, in token order.
        tail: the digest of the sliding-window layers' bytes, or None when the model has none.
    """

    tokens: int
    keys: tuple[ChunkKey, ...]
    digests: tuple[ChunkDigest, ...]
    tail: ChunkDigest | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"tokens": self.tokens, "keys": list(self.keys), "digests": list(self.digests), "tail": self.tail}

    @classmethod
    def from_dict(cls, d: Any) -> "ChunkIndex":
        """Validate and build; anything malformed raises ``ValueError``."""
        if not isinstance(d, dict) or set(d) != {"tokens", "keys", "digests", "tail"}:
            raise ValueError("chunks must be an object with tokens, keys, digests and tail")
        n, keys, digests, tail = d["tokens"], d["keys"], d["digests"], d["tail"]
        if not isinstance(n, int) or isinstance(n, bool) or not 1 <= n <= MAX_CHUNK_TOKENS:
            raise ValueError(f"chunks tokens must be an integer in [1, {MAX_CHUNK_TOKENS}]")
        if not isinstance(keys, list) or not isinstance(digests, list) or len(keys) != len(digests):
            raise ValueError("chunks keys and digests must be lists of the same length")
        return cls(tokens=n, keys=tuple(ChunkKey(_hex(k, "a chunk key")) for k in keys),
                   digests=tuple(ChunkDigest(_hex(x, "a chunk digest")) for x in digests),
                   tail=None if tail is None else ChunkDigest(_hex(tail, "the tail digest")))

    def __len__(self) -> int:
        return len(self.keys)

    @property
    def tail_key(self) -> ChunkKey | None:
        """The tail's key (derived from the last chunk's, so it names every token), or None without a tail."""
        return None if self.tail is None else tail_key(self.keys)

    def span(self, i: int, start: int, end: int) -> tuple[int, int]:
        """Absolute token positions ``[a, b)`` of chunk ``i`` of a cache covering ``[start, end)``."""
        a = start + i * self.tokens
        return a, min(a + self.tokens, end)


def count(seq_len: int, tokens: int = CHUNK_TOKENS) -> int:
    """Chunks of a ``seq_len``-token cache."""
    return -(-seq_len // tokens)


def seed(*, fingerprint_digest: str, dtype: str, start: int, prefix: PrefixRef | None,
         tokens: int = CHUNK_TOKENS) -> bytes:
    """The 32-byte root of a cache's chunk-key chain.

    A full cache (``start == 0``) depends on its own tokens only, so its seed names no
    prefix; a slice was computed after a shared prefix, which its seed names.
    """
    after = None
    if start:
        after = {"length": prefix.length, "block_size": prefix.block_size,
                 "last": prefix.hashes[-1] if prefix.hashes else None} if prefix is not None else {}
    ctx = {"v": 1, "fingerprint": fingerprint_digest, "dtype": dtype, "start": start, "tokens": tokens,
           "after": after}
    return hashlib.sha256(b"c2c-chunk-key-v1\0" + canonical_json(ctx)).digest()


def chunk_keys(token_ids: Sequence[int], root: bytes, tokens: int = CHUNK_TOKENS) -> tuple[ChunkKey, ...]:
    """One key per chunk of ``token_ids``: the chained hash up to the chunk's last token."""
    return tuple(ChunkKey(h) for h in block_hashes(token_ids, tokens, root=root))


def tail_key(keys: Sequence[str]) -> ChunkKey:
    return ChunkKey(hashlib.sha256(_TAIL_TAG + bytes.fromhex(keys[-1])).hexdigest())


def digest(key: str, parts: Iterable) -> ChunkDigest:
    """sha256 of a chunk's key and its bytes, given as the buffers ``parts`` in order."""
    h = hashlib.sha256(_CHUNK_TAG + bytes.fromhex(key))
    for p in parts:
        h.update(p)
    return ChunkDigest(h.hexdigest())


def tensor_digest(table: bytes, digests: Sequence[str], tail: str | None) -> str:
    """A version-2 header's ``tensor_digest``: the tensor table, then every chunk digest, then the tail's."""
    h = hashlib.sha256(table)
    for d in digests:
        h.update(bytes.fromhex(d))
    if tail is not None:
        h.update(bytes.fromhex(tail))
    return h.hexdigest()


@dataclass(frozen=True)
class ChunkGeometry:
    """Where each chunk's bytes lie in an artifact's data section.

    Attributes:
        tokens: tokens per chunk.
        seq_len: tokens of the cache.
        full: per full-attention tensor, ``(offset of the tensor, kv heads, bytes of one row)``.
        tail: per sliding-window tensor, ``(offset, length)``; whole tensors.
    """

    tokens: int
    seq_len: int
    full: tuple[tuple[int, int, int], ...]
    tail: tuple[tuple[int, int], ...]

    @classmethod
    def of(cls, *, spans: Sequence[tuple[int, int]], shapes: Sequence[Sequence[int]],
           windows: Sequence[int | None], seq_len: int, tokens: int = CHUNK_TOKENS) -> "ChunkGeometry":
        """From a tensor layout: ``spans[i]`` the byte range and ``shapes[i]`` ``(1, H, T_l, D)`` of
        tensor ``i`` (``k.000, v.000, k.001, ...``), ``windows[l]`` the sliding window of layer ``l``."""
        full, tail = [], []
        for i, ((a, b), shape) in enumerate(zip(spans, shapes)):
            if windows[i // 2] is None:
                heads, rows = shape[1], shape[2]
                full.append((a, heads, (b - a) // (heads * rows) if heads * rows else 0))
            else:
                tail.append((a, b - a))
        return cls(tokens=tokens, seq_len=seq_len, full=tuple(full), tail=tuple(tail))

    @property
    def count(self) -> int:
        return count(self.seq_len, self.tokens)

    @property
    def has_tail(self) -> bool:
        return bool(self.tail)

    def rows(self, i: int) -> tuple[int, int]:
        """Rows ``[a, b)`` of the cache (relative to its start) that chunk ``i`` holds."""
        a = i * self.tokens
        return a, min(a + self.tokens, self.seq_len)

    def runs(self, i: int) -> list[tuple[int, int]]:
        """``(offset, length)`` in the data section of each run of chunk ``i``, in digest order."""
        a, b = self.rows(i)
        T = self.seq_len
        return [(off + (h * T + a) * row, (b - a) * row) for off, heads, row in self.full for h in range(heads)]

    def size(self, i: int) -> int:
        a, b = self.rows(i)
        return (b - a) * sum(heads * row for _, heads, row in self.full)

    @property
    def tail_size(self) -> int:
        return sum(n for _, n in self.tail)


def digests_of(geometry: ChunkGeometry, data: memoryview, index: ChunkIndex | Sequence[str],
               ) -> tuple[tuple[ChunkDigest, ...], ChunkDigest | None]:
    """The digest of every chunk of ``data`` (a data section) and of its tail, under the keys of ``index``
    (a :class:`ChunkIndex`, or the keys alone)."""
    keys = index.keys if isinstance(index, ChunkIndex) else tuple(index)
    out = tuple(digest(keys[i], (data[o: o + n] for o, n in geometry.runs(i))) for i in range(geometry.count))
    tail = digest(tail_key(keys), (data[o: o + n] for o, n in geometry.tail)) if geometry.has_tail else None
    return out, tail
