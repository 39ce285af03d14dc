"""llama.cpp's sequence-state and slot-file bytes (pure parsing; no llama.cpp needed)."""

from __future__ import annotations

import struct

import pytest
import torch

from c2c.errors import CorruptArtifactError, RuntimeUnsupportedError
from c2c.runtime import llama_state as ls

L, H, D, T = 3, 2, 4, 5


def kv(dtype=torch.float16, seed=0):
    g = torch.Generator().manual_seed(seed)
    keys = tuple(torch.randn(1, H, T, D, generator=g).to(dtype) for _ in range(L))
    values = tuple(torch.randn(1, H, T, D, generator=g).to(dtype) for _ in range(L))
    return keys, values


@pytest.mark.parametrize("v_trans", [False, True])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
def test_state_bytes_round_trip_exactly(v_trans, dtype):
    keys, values = kv(dtype)
    blob = ls.build_seq_state(keys, values, range(T), v_trans=v_trans)
    st = ls.parse_seq_state(blob, kv_heads=H, head_dim=D, num_layers=L)
    assert st.positions == tuple(range(T)) and st.v_trans is v_trans
    assert all(torch.equal(a, b) for a, b in zip(st.keys + st.values, keys + values))
    assert ls.build_seq_state(st.keys, st.values, st.positions, v_trans=v_trans) == blob
    assert bytes(ls.unwrap(ls.wrap(blob))) == blob


def test_the_layout_is_llama_cpps():
    """One layer, one head, one cell by hand: rows of K are cells; transposed V rows are dimensions."""
    k = torch.tensor([[[[1.0, 2.0]], ]]).half().view(1, 1, 1, 2)
    v = torch.tensor([[[[3.0, 4.0]]]]).half()
    blob = ls.build_seq_state((k,), (v,), [7], v_trans=True)
    head = struct.pack("<II", 1, 1) + struct.pack("<iIi", 7, 1, 0) + struct.pack("<II", 1, 1)
    k_part = struct.pack("<iQ", 1, 4) + torch.tensor([1.0, 2.0]).half().numpy().tobytes()
    v_part = struct.pack("<iII", 1, 2, 2) + torch.tensor([3.0, 4.0]).half().numpy().tobytes()
    assert blob == head + k_part + v_part


def test_hostile_state_bytes_get_specific_errors():
    keys, values = kv()
    good = ls.build_seq_state(keys, values, range(T), v_trans=True)
    with pytest.raises(CorruptArtifactError, match="ends after"):
        ls.parse_seq_state(good[:-1], kv_heads=H, head_dim=D, num_layers=L)
    with pytest.raises(CorruptArtifactError, match="bytes follow"):
        ls.parse_seq_state(good + b"\0", kv_heads=H, head_dim=D, num_layers=L)
    with pytest.raises(CorruptArtifactError, match="layers"):
        ls.parse_seq_state(good, kv_heads=H, head_dim=D, num_layers=L + 1)
    with pytest.raises(CorruptArtifactError, match="rows are"):
        ls.parse_seq_state(good, kv_heads=H, head_dim=D * 2, num_layers=L)
    with pytest.raises(RuntimeUnsupportedError, match="streams"):
        ls.parse_seq_state(struct.pack("<I", 2) + good[4:], kv_heads=H, head_dim=D, num_layers=L)
    with pytest.raises(CorruptArtifactError, match="claims"):
        ls.parse_seq_state(struct.pack("<II", 1, 1 << 30) + good[8:], kv_heads=H, head_dim=D, num_layers=L)
    # a quantized K type (q8_0 = 8) is refused by name, not misread
    at = 8 + T * 12 + 8
    quant = good[:at] + struct.pack("<i", 8) + good[at + 4:]
    with pytest.raises(RuntimeUnsupportedError, match="ggml type 8"):
        ls.parse_seq_state(quant, kv_heads=H, head_dim=D, num_layers=L)
    with pytest.raises(CorruptArtifactError, match="magic"):
        ls.unwrap(b"\0" * 12)


def test_slot_files_round_trip_and_refuse_lies():
    keys, values = kv()
    state = ls.build_seq_state(keys, values, range(T), v_trans=False)
    data = ls.build_slot_file([5, 6, 7, 8, 9], state)
    tokens, got = ls.parse_slot_file(data)
    assert tokens == (5, 6, 7, 8, 9) and bytes(got) == state
    with pytest.raises(CorruptArtifactError, match="not a llama.cpp slot file"):
        ls.parse_slot_file(b"GGUF" + data[4:])
    with pytest.raises(CorruptArtifactError, match="claims"):
        ls.parse_slot_file(data[:8] + struct.pack("<I", 1 << 28) + data[12:])
    with pytest.raises(CorruptArtifactError, match="shorter"):
        ls.parse_slot_file(data[:6])
