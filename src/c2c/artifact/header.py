"""`ArtifactHeader`: the canonical, signable description of an exchanged cache.

The header is serialized as canonical JSON (sorted keys, no spaces, UTF-8) and
that exact byte string is what is hashed and signed. It carries:

- ``format``/``version``: ``"c2c-kv"``, :data:`FORMAT_VERSION`;
- ``fingerprint``: the producing model (see :mod:`c2c.artifact.fingerprint`);
- ``prefix``: length and chained block hashes of the shared prefix the cache
  was computed after;
- ``start``/``end``: absolute positions covered (``start == 0`` for a full cache);
- ``tokens``: the token ids, or ``None`` when withheld, and always ``token_digest``;
- ``tensor_digest``: sha256 over the tensor table and every tensor byte (version 1), or
  over the tensor table and every chunk digest (version 2);
- ``chunks`` (version 2): the chunk size and every chunk's key and digest
  (:mod:`c2c.artifact.chunks`), so that each chunk of the cache can be stored, shared and
  checked on its own;
- ``producer``, ``created``, ``parents``, ``labels``, ``extra``.

The signature is *not* in the header: it signs the header.

Versions: 2 is written; 1 (no ``chunks``) is still read, byte for byte as it was
written, so its id and signature stay valid.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Any

import c2c.artifact.chunks as _chunks
from c2c.artifact.chunks import ChunkIndex
from c2c.artifact.fingerprint import Fingerprint
from c2c.artifact.prefix import PrefixRef
from c2c.canon import canonical_json, token_digest
from c2c.errors import CorruptArtifactError, UnsupportedVersionError

FORMAT = "c2c-kv"
FORMAT_VERSION = 2
READABLE_VERSIONS = (1, 2)

# Bounds on what a header may declare: a header comes from another agent, maybe a hostile one.
MAX_TOKENS = 1 << 20          # positions one artifact covers
MAX_PARENTS = 256
MAX_TEXT = 1024               # characters of one producer or label value
MAX_KEY = 128                 # characters of one producer or label key
MAX_ENTRIES = 64              # keys in producer / labels
MAX_EXTRA_BYTES = 64 << 10    # canonical JSON of ``extra``
SHARE_KEY = "c2c.share"       # ``extra``: the other trust domains the publisher lets attach it (signed with it)
EDIT_KEY = "c2c.edit"         # ``extra``: the cache was edited (messages dropped): counts and spans, never the text


@dataclass(frozen=True, kw_only=True)
class ArtifactHeader:
    fingerprint: Fingerprint
    prefix: PrefixRef
    start: int
    end: int
    token_digest: str
    tensor_digest: str
    dtype: str
    tokens: tuple[int, ...] | None = None
    producer: dict[str, str] = field(default_factory=dict)
    created: str = ""
    parents: tuple[str, ...] = ()
    labels: dict[str, str] = field(default_factory=dict)
    extra: dict[str, Any] = field(default_factory=dict)
    chunks: ChunkIndex | None = None    # version 2 and later
    version: int = FORMAT_VERSION

    @property
    def kind(self) -> str:
        """``"full"`` when the cache starts at position 0 (it includes the prefix), else ``"slice"``."""
        return "full" if self.start == 0 else "slice"

    @property
    def seq_len(self) -> int:
        return self.end - self.start

    @property
    def shared_with(self) -> tuple[str, ...]:
        """The other trust domains the publisher's share list (``extra[SHARE_KEY]``) names; none when it
        has none, or a malformed one. Signed with the header, so only the signer's domain could write it."""
        raw = self.extra.get(SHARE_KEY)
        return tuple(d for d in raw if isinstance(d, str)) if isinstance(raw, list) else ()

    @property
    def edit(self) -> Any:
        """The publisher's record of how the cache was edited (read by :meth:`c2c.runtime.kvcache.Edits.read`),
        or None when it is what a prefill of its tokens gives. Signed with the header; any value, a malformed
        one too, marks the cache edited."""
        return self.extra.get(EDIT_KEY)

    def to_dict(self) -> dict[str, Any]:
        return {
            "format": FORMAT, "version": self.version,
            "fingerprint": self.fingerprint.to_dict(), "prefix": self.prefix.to_dict(),
            "start": self.start, "end": self.end, "tokens": list(self.tokens) if self.tokens is not None else None,
            "token_digest": self.token_digest, "tensor_digest": self.tensor_digest, "dtype": self.dtype,
            "producer": dict(self.producer), "created": self.created, "parents": list(self.parents),
            "labels": dict(self.labels), "extra": dict(self.extra),
            **({"chunks": self.chunks.to_dict()} if self.version >= 2 else {}),
        }

    def canonical(self) -> bytes:
        return canonical_json(self.to_dict())

    @property
    def digest(self) -> str:
        """sha256 of the canonical header; it covers the tensors through ``tensor_digest``."""
        return hashlib.sha256(self.canonical()).hexdigest()

    def chunk_seed(self) -> bytes:
        """The root of this cache's chunk-key chain (:func:`c2c.artifact.chunks.seed`)."""
        tokens = self.chunks.tokens if self.chunks is not None else _chunks.CHUNK_TOKENS
        return _chunks.seed(fingerprint_digest=self.fingerprint.digest, dtype=self.dtype, start=self.start,
                            prefix=self.prefix, tokens=tokens)

    @classmethod
    def from_dict(cls, d: Any) -> "ArtifactHeader":
        """Validate and build; any malformed field raises :class:`CorruptArtifactError`."""
        if not isinstance(d, dict) or d.get("format") != FORMAT:
            raise CorruptArtifactError("not a c2c artifact header (format is not 'c2c-kv')")
        version = d.get("version")
        if version not in READABLE_VERSIONS or isinstance(version, bool):
            raise UnsupportedVersionError(
                f"artifact format version {repr(version)[:32]}; this build reads versions "
                f"{', '.join(map(str, READABLE_VERSIONS))}. Upgrade c2c on the reader, or re-export with a "
                "matching version"
            )
        expected = {"format", "version", "fingerprint", "prefix", "start", "end", "tokens", "token_digest",
                    "tensor_digest", "dtype", "producer", "created", "parents", "labels", "extra"}
        if version >= 2:
            expected.add("chunks")
        if set(d) != expected:
            raise CorruptArtifactError(f"header fields differ from the format: {sorted(set(d) ^ expected)}")
        try:
            fp = Fingerprint.from_dict(_typed(d["fingerprint"], dict, "fingerprint"))
            prefix = PrefixRef.from_dict(_typed(d["prefix"], dict, "prefix"))
            start, end = _int(d["start"], "start"), _int(d["end"], "end")
            tokens = d["tokens"]
            if tokens is not None:
                tokens = _typed(tokens, list, "tokens")
                if len(tokens) > MAX_TOKENS:
                    raise CorruptArtifactError(f"header lists {len(tokens)} tokens; the limit is {MAX_TOKENS}")
                tokens = tuple(_int(t, "token id", hi=2**32 - 1) for t in tokens)
            parents = _typed(d["parents"], list, "parents")
            if len(parents) > MAX_PARENTS:
                raise CorruptArtifactError(f"header lists {len(parents)} parents; the limit is {MAX_PARENTS}")
            header = cls(
                fingerprint=fp, prefix=prefix, start=start, end=end, tokens=tokens,
                token_digest=_hex(d["token_digest"], "token_digest"),
                tensor_digest=_hex(d["tensor_digest"], "tensor_digest"),
                dtype=_text(d["dtype"], "dtype", 16),
                producer=_text_map(d["producer"], "producer"),
                created=_text(d["created"], "created", 64),
                parents=tuple(_hex(p, "parent") for p in parents),
                labels=_text_map(d["labels"], "labels"),
                extra=_bounded_extra(d["extra"]),
                chunks=ChunkIndex.from_dict(d["chunks"]) if version >= 2 else None,
                version=version,
            )
        except CorruptArtifactError:
            raise
        except (KeyError, TypeError, ValueError) as e:
            raise CorruptArtifactError(f"malformed header field: {e}") from None
        # a full cache contains the prefix; a slice lies after it
        if end - start > MAX_TOKENS:
            raise CorruptArtifactError(f"span [{start}:{end}) is longer than the {MAX_TOKENS}-token limit")
        if not (0 <= start < end) or not (prefix.length <= (end if start == 0 else start)):
            raise CorruptArtifactError(f"inconsistent span [{start}:{end}) with prefix length {prefix.length}")
        if tokens is not None:
            if len(tokens) != end - start:
                raise CorruptArtifactError(f"{len(tokens)} token ids for a span of {end - start}")
            if token_digest(tokens) != header.token_digest:
                raise CorruptArtifactError("token ids do not match token_digest")
            if start == 0 and PrefixRef.of(tokens[: prefix.length], prefix.block_size) != prefix:
                raise CorruptArtifactError("the first tokens do not hash to the declared prefix")
        if header.chunks is not None:
            c = header.chunks
            if len(c) != _chunks.count(end - start, c.tokens):
                raise CorruptArtifactError(f"header lists {len(c)} chunks for {end - start} tokens in chunks of "
                                           f"{c.tokens}; expected {_chunks.count(end - start, c.tokens)}")
            if tokens is not None and _chunks.chunk_keys(tokens, header.chunk_seed(), c.tokens) != c.keys:
                raise CorruptArtifactError("the chunk keys do not match the tokens, model, dtype and prefix")
        return header


def _typed(v: Any, t: type, what: str) -> Any:
    if not isinstance(v, t) or (t is int and isinstance(v, bool)):
        raise CorruptArtifactError(f"header field {what} should be {t.__name__}, got {type(v).__name__}")
    return v


def _text(v: Any, what: str, limit: int = MAX_TEXT) -> str:
    v = _typed(v, str, what)
    if len(v) > limit:
        raise CorruptArtifactError(f"header field {what} is {len(v)} characters; the limit is {limit}")
    return v


def _text_map(v: Any, what: str) -> dict[str, str]:
    v = _typed(v, dict, what)
    if len(v) > MAX_ENTRIES:
        raise CorruptArtifactError(f"header field {what} has {len(v)} entries; the limit is {MAX_ENTRIES}")
    return {_text(k, f"{what} key", MAX_KEY): _text(x, what) for k, x in v.items()}


def _bounded_extra(v: Any) -> dict[str, Any]:
    v = _typed(v, dict, "extra")
    try:
        size = len(canonical_json(v))
    except UnicodeEncodeError:
        raise CorruptArtifactError("header field extra holds a lone surrogate, which is not text") from None
    except (ValueError, RecursionError):
        raise CorruptArtifactError("header field extra holds a non-finite number or is nested too deeply") from None
    if size > MAX_EXTRA_BYTES:
        raise CorruptArtifactError(f"header field extra is {size} bytes; the limit is {MAX_EXTRA_BYTES}")
    return v


def _int(v: Any, what: str, hi: int = 2**40) -> int:
    v = _typed(v, int, what)
    if not 0 <= v <= hi:
        raise CorruptArtifactError(f"header field {what}={v} is out of range")
    return v


def _hex(v: Any, what: str) -> str:
    v = _typed(v, str, what)
    if len(v) != 64 or any(c not in "0123456789abcdef" for c in v):
        raise CorruptArtifactError(f"header field {what} is not a sha256 hex digest")
    return v
