"""`Artifact`: a KV-cache plus its header, as safetensors-compatible bytes. Never pickle.

Byte layout (readable by the ``safetensors`` library too)::

    u64 LE  N                      header length
    N bytes JSON                   {"__metadata__": {"c2c.header": <canonical header>,
                                                     "c2c.signature": <JSON, optional>},
                                    "k.000": {"dtype": "F32", "shape": [1, H, T, D],
                                              "data_offsets": [a, b]}, "v.000": ..., ...}
    data                           tensors back to back, in name order

Version 2 cuts the cache into chunks of a fixed number of tokens (:mod:`c2c.artifact.chunks`):
the data section keeps this layout, and the header names each chunk's key and digest.

The parser is our own and strict: it bounds the header size before reading it,
rejects duplicate keys, unknown dtypes, shapes that disagree with the
fingerprint, offsets that overlap or leave gaps, a data section shorter or longer
than declared, a header that is not byte-for-byte canonical, digests that do not
match, and NaN/Inf values. Each failure is a specific :class:`ArtifactError`.
"""

from __future__ import annotations

import hashlib
import json
import os
import struct
import warnings
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Sequence

import torch

from c2c._io import open_for_read, write_atomic
import c2c.artifact.chunks as chunks
from c2c.artifact.chunks import ChunkGeometry, ChunkIndex
from c2c.artifact.fingerprint import Fingerprint
from c2c.artifact.header import EDIT_KEY, ArtifactHeader
from c2c.artifact.prefix import PrefixRef
from c2c.canon import canonical_json, token_digest, utc_now
from c2c.config import settings
from c2c.errors import ArtifactTooLargeError, ConfigError, CorruptArtifactError, TruncatedArtifactError
from c2c.runtime.kvcache import Edits, KVCache

# NOTE: a header of 1M tokens is ~8 MB of JSON; 16 MiB bounds what rejecting a garbage header costs.
MAX_HEADER_BYTES = 16 << 20
def max_artifact_bytes(limit: int | None = None) -> int:
    """``limit``, else ``C2C_MAX_ARTIFACT_BYTES`` (default 16 GiB)."""
    return settings().max_artifact_bytes if limit is None else limit

_DTYPES = {"F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16}
_NAMES = {v: k for k, v in _DTYPES.items()}


def dtype_name(dtype: torch.dtype) -> str:
    """The header's name for a tensor dtype (``F32``, ``F16``, ``BF16``); CorruptArtifactError for others."""
    if dtype not in _NAMES:
        raise CorruptArtifactError(f"cannot export a cache of dtype {dtype}")
    return _NAMES[dtype]


def _tensor_names(num_layers: int) -> list[str]:
    return [f"{kv}.{i:03d}" for i in range(num_layers) for kv in ("k", "v")]


def _tensor_table(names: Sequence[str], dtype: str, shapes: Sequence[Sequence[int]]) -> bytes:
    return canonical_json([[n, dtype, list(s)] for n, s in zip(names, shapes)])


def _digest_tensors(table: bytes, data: bytes | memoryview) -> str:
    h = hashlib.sha256(table)
    h.update(data)
    return h.hexdigest()


@dataclass(frozen=True, kw_only=True)
class Artifact:
    """An exchanged cache: ``header`` (what it is) + ``cache`` (the tensors) + optional signature.

    ``own`` lists chunks whose K/V are the receiver's own for the same tokens (model, dtype:
    the same chunk keys), put in their places instead of the sender's, and so not checked
    against the header's digests (see :meth:`decode`). Such an artifact is for attaching
    only: :meth:`encode` refuses it.
    """

    header: ArtifactHeader
    cache: KVCache
    signature: dict[str, Any] | None = None
    own: tuple[int, ...] = ()

    @property
    def id(self) -> str:
        """Content address: sha256 of the canonical header (which covers every tensor byte)."""
        return self.header.digest

    # ------------------------------------------------------------- building
    @classmethod
    def build(cls, cache: KVCache, *, fingerprint: Fingerprint, prefix: PrefixRef,
              withhold_tokens: bool = False, producer: dict[str, str] | None = None,
              parents: Sequence[str] = (), labels: dict[str, str] | None = None,
              extra: dict[str, Any] | None = None) -> "Artifact":
        dtype = _NAMES.get(cache.dtype)
        if dtype is None:
            raise CorruptArtifactError(f"cannot export a cache of dtype {cache.dtype}")
        if cache.gaps:
            raise ConfigError("a cache with dropped positions left open cannot be exported; close them first "
                              "(c2c.runtime.edit.close_gaps, or reposition: true)")
        if cache.edits is not None:  # signed with the header: a receiver never takes it for exact
            extra = {**(extra or {}), EDIT_KEY: cache.edits.to_dict()}
        names, tensors = _ordered(cache)
        table = _tensor_table(names, dtype, [t.shape for t in tensors])
        data = memoryview(b"".join(_bytes(t) for t in tensors))
        header = ArtifactHeader(
            fingerprint=fingerprint, prefix=prefix, start=cache.start, end=cache.end,
            tokens=None if withhold_tokens else tuple(cache.token_ids),
            token_digest=token_digest(cache.token_ids), tensor_digest="0" * 64,
            dtype=dtype, producer=dict(producer or {}), created=utc_now(), parents=tuple(parents),
            labels=dict(labels or {}), extra=dict(extra or {}),
        )
        keys = chunks.chunk_keys(cache.token_ids, header.chunk_seed(), chunks.CHUNK_TOKENS)
        sizes = [t.numel() * t.element_size() for t in tensors]
        spans = [(sum(sizes[:i]), sum(sizes[: i + 1])) for i in range(len(sizes))]
        geometry = ChunkGeometry.of(spans=spans, shapes=[t.shape for t in tensors], windows=cache.windows,
                                    seq_len=cache.seq_len)
        digests, tail = chunks.digests_of(geometry, data, keys)
        index = ChunkIndex(tokens=chunks.CHUNK_TOKENS, keys=keys, digests=digests, tail=tail)
        header = replace(header, chunks=index, tensor_digest=chunks.tensor_digest(table, digests, tail))
        return cls(header=header, cache=cache)

    def with_signature(self, signature: dict[str, Any] | None) -> "Artifact":
        return replace(self, signature=signature)

    # ------------------------------------------------------------- encoding
    def encode(self) -> bytes:
        if self.own:
            raise CorruptArtifactError(f"chunks {list(self.own)[:4]} of artifact {self.id[:12]} hold the receiver's own "
                                       "K/V, not the signed bytes: it cannot be encoded again; re-export the cache")
        _, tensors = _ordered(self.cache)
        return self.encode_head() + b"".join(_bytes(t) for t in tensors)

    def encode_head(self) -> bytes:
        """The first ``8 + n`` bytes :meth:`encode` writes: the length and the table (no tensor bytes)."""
        names, tensors = _ordered(self.cache)
        meta = {"c2c.header": self.header.canonical().decode("utf-8")}
        if self.signature is not None:
            meta["c2c.signature"] = canonical_json(self.signature).decode("utf-8")
        table: dict[str, Any] = {"__metadata__": meta}
        offset = 0
        for n, t in zip(names, tensors):
            size = t.numel() * t.element_size()
            table[n] = {"dtype": self.header.dtype, "shape": list(t.shape), "data_offsets": [offset, offset + size]}
            offset += size
        head = json.dumps(table, separators=(",", ":"), ensure_ascii=True).encode()
        head += b" " * (-len(head) % 8)  # safetensors aligns the data section to 8 bytes
        return struct.pack("<Q", len(head)) + head

    @classmethod
    def decode(cls, data: bytes | bytearray | memoryview, *, max_bytes: int | None = None,
               own: Sequence[int] = ()) -> "Artifact":
        """Parse and fully validate artifact bytes (see module docstring).

        A ``bytearray`` is used in place (its tensors share it); other buffers are copied.

        Args:
            own: chunks (version 2) whose bytes are the receiver's own K/V for the same tokens,
                not the sender's: every other chunk is checked against its digest. The header
                is checked whole, and its signature still covers every chunk it names.
        """
        own = tuple(sorted(set(own)))
        header, signature, cache = _parse(data, max_artifact_bytes(max_bytes), materialize=True, own=own)
        return cls(header=header, cache=cache, signature=signature, own=own)

    @classmethod
    def peek(cls, data: bytes | bytearray | memoryview, *,
             max_bytes: int | None = None) -> tuple[ArtifactHeader, dict | None]:
        """The validated header and the signature dict, reading no tensor byte.

        The tensor table's layout and the data size are checked too, so what :meth:`decode`
        does after this is O(size) only for bytes that are already known to fit. Used to
        verify a signature before any tensor is hashed or built.
        """
        return _parse(data, max_artifact_bytes(max_bytes), materialize=None)[:2]

    @classmethod
    def read_header(cls, data: bytes | bytearray | memoryview, *, max_bytes: int | None = None) -> ArtifactHeader:
        """Every check of :meth:`decode`, without building tensors (no copy); returns the header."""
        return _parse(data, max_artifact_bytes(max_bytes), materialize=False)[0]

    # ------------------------------------------------------------------ files
    def write(self, path: str | Path) -> int:
        """Write atomically and privately (0600 temp file, fsync, rename). Returns bytes written."""
        return write_atomic(Path(path), self.encode())

    @classmethod
    def read(cls, path: str | Path, *, max_bytes: int | None = None) -> "Artifact":
        """Read and fully validate an artifact file; a bad header costs O(header) memory (:func:`read_file`)."""
        return cls.decode(read_file(path, max_bytes), max_bytes=max_bytes)


def _parse(data, max_bytes: int, *, materialize: bool | None, own: tuple[int, ...] = ()):
    buf = memoryview(data)
    if len(buf) > max_bytes:
        raise ArtifactTooLargeError(f"artifact is {len(buf)} bytes, over the limit of {max_bytes}")
    n = _header_length(bytes(buf[:8]), len(buf))
    header, signature, table = _parse_head(bytes(buf[8: 8 + n]))
    layout = _layout(header, table)
    body = buf[8 + n:]
    _check_body_size(layout, len(body))
    if materialize is None:  # peek: the head only
        return header, signature, None
    if own and (layout.geometry is None or not 0 <= min(own) <= max(own) < layout.geometry.count):
        raise CorruptArtifactError(f"chunks {list(own)[:4]} are not chunks of this artifact")
    return header, signature, _tensors(header, layout, body, materialize=materialize, own=own)


def head_length(data: bytes | bytearray | memoryview) -> int:
    """``8 + n``: the length of an artifact's head (length field and table), from its first 8 bytes.

    Raises:
        ArtifactError: as :meth:`Artifact.decode` would for the length field.
    """
    return 8 + _header_length(bytes(memoryview(data)[:8]), len(data))


def read_head(head: bytes | bytearray | memoryview) -> tuple[ArtifactHeader, dict | None]:
    """The validated header and signature dict from an artifact's head alone (its first ``8 + n`` bytes).

    The tensor table is checked against the header, as :meth:`Artifact.peek` does; no tensor byte is needed.

    Raises:
        ArtifactError: the head is malformed, or longer or shorter than it declares.
    """
    n = _header_length(bytes(memoryview(head)[:8]), len(head))
    if 8 + n != len(head):
        raise CorruptArtifactError(f"an artifact head of {len(head)} bytes declares {8 + n}")
    header, signature, table = _parse_head(bytes(memoryview(head)[8:]))
    _layout(header, table)
    return header, signature


def _header_length(lead: bytes, total: int) -> int:
    """The declared header length ``n`` from the first 8 bytes, checked against ``total``."""
    if len(lead) < 8 or total < 8:
        raise TruncatedArtifactError(f"artifact is {total} bytes; too short to hold a header length")
    (n,) = struct.unpack("<Q", lead[:8])
    if n > MAX_HEADER_BYTES:
        raise ArtifactTooLargeError(f"declared header of {n} bytes exceeds the {MAX_HEADER_BYTES}-byte limit")
    if 8 + n > total:
        raise TruncatedArtifactError(f"declared header of {n} bytes but only {total - 8} follow")
    return n


def _parse_head(head: bytes) -> tuple[ArtifactHeader, dict | None, dict]:
    """The safetensors table: (validated c2c header, signature dict or None, tensor entries)."""
    table = _parse_json(head, "tensor table")
    if not isinstance(table, dict):
        raise CorruptArtifactError("the safetensors header is not a JSON object")
    meta = table.pop("__metadata__", None)
    if not isinstance(meta, dict) or not isinstance(meta.get("c2c.header"), str):
        raise CorruptArtifactError("no c2c header in __metadata__: this is not a c2c artifact")
    extra_meta = set(meta) - {"c2c.header", "c2c.signature"}
    if extra_meta or not all(isinstance(v, str) for v in meta.values()):
        raise CorruptArtifactError(f"unexpected __metadata__ entries {sorted(extra_meta)[:4]}")
    raw_header = _utf8(meta["c2c.header"], "c2c header")
    header = ArtifactHeader.from_dict(_parse_json(raw_header, "c2c header"))
    try:
        canonical = header.canonical()
    except UnicodeEncodeError:
        raise CorruptArtifactError("the c2c header holds a lone surrogate, which UTF-8 cannot encode") from None
    except ValueError:  # e.g. 1e400 in extra parses as inf, which canonical JSON cannot write
        raise CorruptArtifactError("the c2c header holds a non-finite number") from None
    if canonical != raw_header:
        raise CorruptArtifactError("the c2c header is not in canonical form; refusing an ambiguous header")
    signature = None
    if "c2c.signature" in meta:
        signature = _parse_json(_utf8(meta["c2c.signature"], "signature"), "signature")
        if not isinstance(signature, dict):
            raise CorruptArtifactError("the signature entry is not a JSON object")
    return header, signature, table


def _utf8(text: str, what: str) -> bytes:
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError:
        raise CorruptArtifactError(f"the {what} holds a lone surrogate escape, which is not text") from None


# ------------------------------------------------------------------ helpers
def _ordered(cache: KVCache) -> tuple[list[str], list[torch.Tensor]]:
    names = _tensor_names(cache.num_layers)
    tensors = [t for pair in zip(cache.keys, cache.values) for t in pair]
    return names, tensors


def _bytes(t: torch.Tensor) -> bytes:
    t = t.detach().to("cpu").contiguous()
    return t.view(-1).view(torch.uint8).numpy().tobytes()


def _parse_json(raw: bytes, what: str) -> Any:
    def no_dupes(pairs):
        keys = [k for k, _ in pairs]
        if len(keys) != len(set(keys)):
            raise CorruptArtifactError(f"duplicate keys in the {what}")
        return dict(pairs)

    def no_constants(c):
        raise CorruptArtifactError(f"non-finite number {c} in the {what}")

    try:
        text = raw.decode("utf-8")
        obj = json.loads(text, object_pairs_hook=no_dupes, parse_constant=no_constants)
        if "\\u" in text:  # only an escape can smuggle in a lone surrogate: re-encode to find one
            json.dumps(obj, ensure_ascii=False).encode("utf-8")
        return obj
    except CorruptArtifactError:
        raise
    except UnicodeEncodeError:
        raise CorruptArtifactError(f"the {what} holds a lone surrogate escape, which is not text") from None
    except (UnicodeDecodeError, ValueError, RecursionError) as e:
        raise CorruptArtifactError(f"the {what} is not valid JSON: {str(e)[:200]}") from None


@dataclass(frozen=True)
class _Layout:
    """Where each tensor lies in the data section, as the header and table declare it."""

    names: tuple[str, ...]
    shapes: tuple[tuple[int, ...], ...]    # (1, kv_heads, T_layer, head_dim) per tensor
    spans: tuple[tuple[int, int], ...]     # byte range of each tensor in the data section
    size: int                              # bytes of the whole data section
    dtype: torch.dtype
    windows: tuple[int | None, ...]
    geometry: ChunkGeometry | None         # where each chunk lies (version 2)


def chunk_geometry(header: ArtifactHeader) -> ChunkGeometry:
    """Where each chunk of a version-2 artifact lies in its data section, from the header alone.

    Raises:
        CorruptArtifactError: the header is not version 2, or its fingerprint lists no layout.
    """
    if header.chunks is None:
        raise CorruptArtifactError(f"a version-{header.version} artifact is not cut into chunks")
    fp = header.fingerprint
    names, shapes, windows = cache_layout(fp, header.seq_len)
    itemsize = torch.empty(0, dtype=_DTYPES[header.dtype]).element_size() if header.dtype in _DTYPES else 0
    if not itemsize:
        raise CorruptArtifactError(f"unsupported dtype {header.dtype!r}")
    sizes = [s[1] * s[2] * s[3] * itemsize for s in shapes]
    spans = [(sum(sizes[:i]), sum(sizes[: i + 1])) for i in range(len(sizes))]
    return ChunkGeometry.of(spans=spans, shapes=shapes, windows=windows, seq_len=header.seq_len,
                            tokens=header.chunks.tokens)


def cache_layout(fp: Fingerprint, seq_len: int) -> tuple[list[str], list[list[int]], tuple[int | None, ...]]:
    """Names, shapes ``[1, kv_heads, T_layer, head_dim]`` and windows of a ``seq_len``-token cache of ``fp``'s model.

    Derived from the fingerprint alone, so a reader never takes a sender's word for a shape.
    """
    windows = tuple(fp.sliding_window if t == "sliding_attention" else None for t in fp.layer_types)
    if len(windows) != fp.num_layers:
        raise CorruptArtifactError("fingerprint layer_types does not list every layer")
    names = _tensor_names(fp.num_layers)
    shapes = [[1, fp.kv_heads, KVCache.layer_length(seq_len, windows[i // 2]), fp.head_dim]
              for i in range(len(names))]
    return names, shapes, windows


def _layout(header: ArtifactHeader, table: dict[str, Any]) -> _Layout:
    """Check every tensor entry against the header, without touching tensor bytes."""
    fp = header.fingerprint
    names, wants, windows = cache_layout(fp, header.seq_len)
    if sorted(table) != sorted(names):
        raise CorruptArtifactError(
            f"tensor names do not match a {fp.num_layers}-layer cache: "
            f"unexpected {sorted(set(table) - set(names))[:4]}, missing {sorted(set(names) - set(table))[:4]}")
    if header.dtype not in _DTYPES:
        raise CorruptArtifactError(f"unsupported dtype {header.dtype!r}")
    torch_dtype = _DTYPES[header.dtype]
    itemsize = torch.empty(0, dtype=torch_dtype).element_size()
    offset = 0
    shapes, spans = [], []
    for i, name in enumerate(names):
        entry = table[name]
        if not isinstance(entry, dict) or set(entry) != {"dtype", "shape", "data_offsets"}:
            raise CorruptArtifactError(f"tensor entry {name} is malformed")
        if entry["dtype"] != header.dtype:
            raise CorruptArtifactError(f"tensor {name} has dtype {str(entry['dtype'])[:16]!r}, "
                                       f"header says {header.dtype!r}")
        want = wants[i]
        if entry["shape"] != want:
            raise CorruptArtifactError(f"tensor {name} has shape {str(entry['shape'])[:64]}, "
                                       f"expected {want} from the header")
        offsets = entry["data_offsets"]
        a, b = offsets if isinstance(offsets, list) and len(offsets) == 2 else (None, None)
        size = want[1] * want[2] * want[3] * itemsize
        if not (isinstance(a, int) and isinstance(b, int)) or a != offset or b - a != size:
            raise CorruptArtifactError(f"tensor {name} has data_offsets {str(offsets)[:64]}, "
                                       f"expected [{offset}, {offset + size}]")
        offset = b
        shapes.append(tuple(want))
        spans.append((a, b))
    geometry = None
    if header.chunks is not None:
        c = header.chunks
        geometry = ChunkGeometry.of(spans=spans, shapes=shapes, windows=windows, seq_len=header.seq_len,
                                    tokens=c.tokens)
        if (c.tail is None) == geometry.has_tail:
            raise CorruptArtifactError(f"the header {'lacks' if c.tail is None else 'has'} a tail digest, but "
                                       f"the model has {'' if geometry.has_tail else 'no '}sliding-window layers")
        table_bytes = _tensor_table(names, header.dtype, shapes)
        if chunks.tensor_digest(table_bytes, c.digests, c.tail) != header.tensor_digest:
            raise CorruptArtifactError("the header's tensor_digest does not match its chunk digests")
    return _Layout(names=tuple(names), shapes=tuple(shapes), spans=tuple(spans), size=offset,
                   dtype=torch_dtype, windows=windows, geometry=geometry)


def _check_body_size(layout: _Layout, have: int) -> None:
    if layout.size > have:
        raise TruncatedArtifactError(f"tensors need {layout.size} bytes of data but only {have} are present")
    if layout.size < have:
        raise CorruptArtifactError(f"{have - layout.size} unexpected bytes after the last tensor")


def _tensors(header: ArtifactHeader, layout: _Layout, data: memoryview, *,
             materialize: bool = True, own: tuple[int, ...] = ()) -> KVCache | None:
    """Digest- and NaN-check the data section; build the cache when ``materialize``."""
    torch_dtype, names, spans = layout.dtype, layout.names, layout.spans
    if layout.geometry is None:  # version 1: one digest over every byte
        table_bytes = _tensor_table(names, header.dtype, layout.shapes)
        if _digest_tensors(table_bytes, data) != header.tensor_digest:
            raise CorruptArtifactError("tensor bytes do not match the header's tensor_digest (corrupted or tampered)")
    else:
        check_chunks(header, layout.geometry, data, [i for i in range(layout.geometry.count) if i not in own])
    if not len(data):
        flat = torch.empty(0, dtype=torch.uint8)
    elif isinstance(data.obj, bytearray) and not data.readonly:
        # NOTE: zero-copy: the tensors share the caller's bytearray, which the caller hands over.
        flat = torch.frombuffer(data, dtype=torch.uint8)
    elif not materialize:
        # only scanned, never written and never returned: a read-only view avoids a copy
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            flat = torch.frombuffer(data, dtype=torch.uint8)
    else:
        flat = torch.frombuffer(bytearray(data), dtype=torch.uint8)
    values = flat.view(torch_dtype) if len(data) else flat
    # One fp32-accumulated reduction finds any NaN/Inf (a finite sum cannot overflow fp32
    # here); only then is the exact, allocating check run to name the tensor.
    if values.numel() and not bool(torch.isfinite(values.sum(dtype=torch.float32))):
        for (a, b), name in zip(spans, names):
            if not bool(torch.isfinite(flat[a:b].view(torch_dtype)).all()):
                raise CorruptArtifactError(f"tensor {name} contains NaN or Inf")
    if not materialize:
        return None
    tensors = [flat[a:b].view(torch_dtype).view(*shape) for (a, b), shape in zip(spans, layout.shapes)]
    tokens = header.tokens if header.tokens is not None else (0,) * header.seq_len
    edits = None if header.edit is None else Edits.read(header.edit)
    return KVCache(keys=tuple(tensors[0::2]), values=tuple(tensors[1::2]), token_ids=tuple(tokens),
                   start=header.start, windows=layout.windows, edits=edits)


def check_chunks(header: ArtifactHeader, geometry: ChunkGeometry, data: memoryview, which,
                 tail: bool = True) -> None:
    """Check chunks ``which`` (and the tail) of the data section ``data`` against the header's digests.

    Raises:
        CorruptArtifactError: naming the first chunk that does not match (corrupted, tampered or swapped).
    """
    c = header.chunks
    for i in which:
        got = chunks.digest(c.keys[i], (data[o: o + n] for o, n in geometry.runs(i)))
        if got != c.digests[i]:
            a, b = c.span(i, header.start, header.end)
            raise CorruptArtifactError(f"chunk {i} (tokens {a}..{b - 1}) does not match its digest in the header "
                                       "(corrupted, tampered or swapped)")
    if tail and geometry.has_tail:
        if chunks.digest(c.tail_key, (data[o: o + n] for o, n in geometry.tail)) != c.tail:
            raise CorruptArtifactError("the sliding-window layers (the tail) do not match their digest in the header")


def read_file(path: str | Path, max_bytes: int | None = None) -> bytearray:
    """Read an artifact file, checking its header before touching the tensor region.

    The 8-byte length, the header and the tensor table are read and validated
    first (the declared data size must equal what the file holds), so a file
    with a garbage or lying header is refused at the cost of its header, never
    of its size. Only then is the rest read, into one buffer of exactly the
    file's size; :meth:`Artifact.decode` then checks digests and values.

    Raises:
        ArtifactError: as :meth:`Artifact.decode`, for the header; and for a
            missing, unreadable or oversized file.
    """
    path = Path(path)
    max_bytes = max_artifact_bytes(max_bytes)
    with open_for_read(path, "artifact") as f:
        size = os.fstat(f.fileno()).st_size
        if size > max_bytes:
            raise ArtifactTooLargeError(f"{path} is {size} bytes, over the limit of {max_bytes}")
        lead = f.read(8)
        n = _header_length(lead, size)
        head = f.read(n)
        if len(head) != n:
            raise TruncatedArtifactError(f"{path} changed while being read")
        header, _, table = _parse_head(head)
        _check_body_size(_layout(header, table), size - 8 - n)
        buf = bytearray(size)
        buf[:8], buf[8: 8 + n] = lead, head
        with memoryview(buf) as view:
            got = f.readinto(view[8 + n:])
        if got != size - 8 - n or f.read(1):
            raise TruncatedArtifactError(f"{path} changed size while being read; refusing it")
        return buf
