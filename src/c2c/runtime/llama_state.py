"""llama.cpp's sequence-state bytes as c2c's per-layer K/V tensors, and back (no llama.cpp needed).

``llama_state_seq_get_data`` writes one sequence's KV cache in this layout
(llama.cpp's ``llama_kv_cache::state_write``, read by ``state_read``; little-endian)::

    u32 n_stream                                     (c2c reads and writes 1)
    u32 cell_count                                   T
    T x { i32 pos, u32 n_seq_id, i32 seq_id[n_seq_id] }
    u32 v_trans, u32 n_layer                         L
    L x { i32 k_type, u64 k_row_bytes, T rows }      a row: kv_heads x head_dim values
    v_trans == 0:  L x { i32 v_type, u64 v_row_bytes, T rows }
    v_trans == 1:  L x { i32 v_type, u32 v_elem_bytes, u32 n_embd_v, n_embd_v x T values }

In memory (``llama_state_seq_get/set_data``) these bytes follow ``u32 0xaf143cd8,
i32 seq_id`` (:func:`wrap` / :func:`unwrap`). A slot file (``llama-server
--slot-save-path``, ``llama_state_seq_save_file``) is ``u32 magic 'ggsq', u32 version
3, u32 n_tokens, i32 tokens[n_tokens]`` followed by them.

Only float KV caches are read (f32, f16, bf16: the K/V are the values themselves;
quantized KV types are refused). Keys are stored after RoPE, as in transformers.

Tensor layout crossing this module: ``[1, kv_heads, T, head_dim]`` per layer.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

import torch

from c2c.errors import CorruptArtifactError, RuntimeUnsupportedError

SEQ_MAGIC = 0x67677371           # 'ggsq'
IO_MAGIC = 0xAF143CD8            # llama_context's in-memory sequence-state header
SEQ_VERSION = 3
GGML_TYPES = {0: torch.float32, 1: torch.float16, 30: torch.bfloat16}
TYPE_IDS = {v: k for k, v in GGML_TYPES.items()}
TYPE_NAMES = {0: "f32", 1: "f16", 30: "bf16"}
MAX_CELLS = 1 << 22


@dataclass(frozen=True, kw_only=True)
class SeqState:
    """One sequence's K/V as read from llama.cpp bytes.

    Attributes:
        positions: each cell's position (consecutive for a plain sequence).
        keys, values: one ``(1, kv_heads, T, head_dim)`` tensor per layer.
        v_trans: whether llama.cpp held V transposed (it must be written back the same way).
    """

    positions: tuple[int, ...]
    keys: tuple[torch.Tensor, ...]
    values: tuple[torch.Tensor, ...]
    v_trans: bool


class _Reader:
    def __init__(self, data: bytes | bytearray | memoryview):
        self.buf = memoryview(data).cast("B")
        self.at = 0

    def take(self, n: int) -> memoryview:
        if n < 0 or self.at + n > len(self.buf):
            raise CorruptArtifactError(f"llama.cpp state ends after {len(self.buf)} bytes; {n} more were declared "
                                       f"at offset {self.at}")
        out = self.buf[self.at: self.at + n]
        self.at += n
        return out

    def u32(self) -> int:
        return struct.unpack("<I", self.take(4))[0]

    def i32(self) -> int:
        return struct.unpack("<i", self.take(4))[0]

    def u64(self) -> int:
        return struct.unpack("<Q", self.take(8))[0]


def parse_seq_state(data: bytes | bytearray | memoryview, *, kv_heads: int, head_dim: int,
                    num_layers: int) -> SeqState:
    """The K/V of a ``llama_state_seq_get_data`` blob, checked against the model's shape.

    Raises:
        CorruptArtifactError: truncated, trailing or inconsistent bytes.
        RuntimeUnsupportedError: several streams, several sequences per cell, or a quantized KV type.
    """
    r = _Reader(data)
    n_stream = r.u32()
    if n_stream != 1:
        raise RuntimeUnsupportedError(f"the llama.cpp state holds {n_stream} streams; c2c reads one (a unified KV "
                                      "cache, llama.cpp's default)")
    T = r.u32()
    if T == 0 or T > MAX_CELLS:
        raise CorruptArtifactError(f"the llama.cpp state holds {T} cells; nothing to hand over" if T == 0 else
                                   f"the llama.cpp state claims {T} cells, over the limit {MAX_CELLS}")
    positions = []
    for _ in range(T):
        pos, n_seq = r.i32(), r.u32()
        if n_seq != 1:
            raise RuntimeUnsupportedError(f"a llama.cpp cell belongs to {n_seq} sequences; export one sequence")
        r.i32()  # the seq id: the importer chooses its own
        positions.append(pos)
    v_trans, n_layer = r.u32(), r.u32()
    if n_layer != num_layers or v_trans not in (0, 1):
        raise CorruptArtifactError(f"the llama.cpp state has {n_layer} layers (v_trans {v_trans}); the model has "
                                   f"{num_layers}")
    width = kv_heads * head_dim
    keys = [_rows(r, T, width, kv_heads, head_dim, "K", layer) for layer in range(n_layer)]
    if not v_trans:
        values = [_rows(r, T, width, kv_heads, head_dim, "V", layer) for layer in range(n_layer)]
    else:
        values = []
        for layer in range(n_layer):
            dtype = _dtype(r.i32(), "V", layer)
            el, n_embd = r.u32(), r.u32()
            if el != torch.empty(0, dtype=dtype).element_size() or n_embd != width:
                raise CorruptArtifactError(f"layer {layer}: V has {n_embd} x {el}-byte elements; the model needs "
                                           f"{width}")
            raw = torch.frombuffer(bytearray(r.take(n_embd * T * el)), dtype=dtype)
            values.append(raw.view(kv_heads, head_dim, T).permute(0, 2, 1).contiguous()[None])  # (1, H, T, D)
    if r.at != len(r.buf):
        raise CorruptArtifactError(f"{len(r.buf) - r.at} bytes follow the llama.cpp state")
    return SeqState(positions=tuple(positions), keys=tuple(keys), values=tuple(values), v_trans=bool(v_trans))


def _dtype(type_id: int, what: str, layer: int) -> torch.dtype:
    if type_id not in GGML_TYPES:
        raise RuntimeUnsupportedError(f"layer {layer}: the llama.cpp {what} cache has ggml type {type_id}; c2c hands "
                                      "over float KV caches only (f32, f16, bf16: run llama.cpp with its default "
                                      "--cache-type-k/-v f16)")
    return GGML_TYPES[type_id]


def _rows(r: _Reader, T: int, width: int, H: int, D: int, what: str, layer: int) -> torch.Tensor:
    dtype = _dtype(r.i32(), what, layer)
    row = r.u64()
    if row != width * torch.empty(0, dtype=dtype).element_size():
        raise CorruptArtifactError(f"layer {layer}: {what} rows are {row} bytes; the model's are {width} values")
    raw = torch.frombuffer(bytearray(r.take(row * T)), dtype=dtype)
    return raw.view(T, H, D).permute(1, 0, 2).contiguous()[None]  # (T, H, D) -> (1, H, T, D)


def build_seq_state(keys, values, positions, *, v_trans: bool, seq_id: int = 0) -> bytes:
    """The ``llama_state_seq_set_data`` bytes of one sequence: the inverse of :func:`parse_seq_state`."""
    T = len(positions)
    out = [struct.pack("<II", 1, T)]
    out += [struct.pack("<iIi", int(p), 1, seq_id) for p in positions]
    out.append(struct.pack("<II", int(v_trans), len(keys)))

    def rows(t: torch.Tensor) -> bytes:   # (1, H, T, D) -> T rows of H*D
        return t[0].permute(1, 0, 2).contiguous().view(-1).view(torch.uint8).numpy().tobytes()

    for k in keys:
        H, D = k.shape[1], k.shape[3]
        out += [struct.pack("<iQ", TYPE_IDS[k.dtype], H * D * k.element_size()), rows(k)]
    for v in values:
        H, D = v.shape[1], v.shape[3]
        if not v_trans:
            out += [struct.pack("<iQ", TYPE_IDS[v.dtype], H * D * v.element_size()), rows(v)]
        else:  # (1, H, T, D) -> H*D rows of T
            out += [struct.pack("<iII", TYPE_IDS[v.dtype], v.element_size(), H * D),
                    v[0].permute(0, 2, 1).contiguous().view(-1).view(torch.uint8).numpy().tobytes()]
    return b"".join(out)


def wrap(state: bytes, seq_id: int = 0) -> bytes:
    """The in-memory form ``llama_state_seq_set_data`` reads: ``state`` after llama.cpp's 8-byte header."""
    return struct.pack("<Ii", IO_MAGIC, seq_id) + state


def unwrap(blob: bytes | bytearray | memoryview) -> memoryview:
    """The KV-cache bytes of a ``llama_state_seq_get_data`` blob (its 8-byte header checked and dropped)."""
    view = memoryview(blob).cast("B")
    if len(view) < 8 or struct.unpack("<I", view[:4])[0] != IO_MAGIC:
        raise CorruptArtifactError("not a llama.cpp sequence state (wrong magic)")
    return view[8:]


def parse_slot_file(data: bytes | bytearray | memoryview) -> tuple[tuple[int, ...], memoryview]:
    """(token ids, state bytes) of a llama.cpp slot / sequence-state file.

    Raises:
        CorruptArtifactError: not a 'ggsq' version-3 file, or a token count the file cannot hold.
    """
    r = _Reader(data)
    if len(r.buf) < 12:
        raise CorruptArtifactError("not a llama.cpp slot file: shorter than its 12-byte header")
    magic, version, n = r.u32(), r.u32(), r.u32()
    if magic != SEQ_MAGIC or version != SEQ_VERSION:
        raise CorruptArtifactError(f"not a llama.cpp slot file (magic {magic:08x}, version {version}); expected "
                                   f"{SEQ_MAGIC:08x} version {SEQ_VERSION}")
    if n * 4 > len(r.buf) - 12:
        raise CorruptArtifactError(f"the slot file claims {n} tokens but holds {len(r.buf) - 12} bytes")
    tokens = struct.unpack(f"<{n}i", r.take(4 * n))
    return tuple(tokens), r.buf[r.at:]


def build_slot_file(tokens, state: bytes) -> bytes:
    """A slot file llama.cpp's ``llama_state_seq_load_file`` (and llama-server's slot restore) reads."""
    return struct.pack(f"<III{len(tokens)}i", SEQ_MAGIC, SEQ_VERSION, len(tokens), *tokens) + state
