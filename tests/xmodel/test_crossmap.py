"""The map file: round trip, refused on any other pair, refused when tampered with. Never pickle."""

from __future__ import annotations

import json
import struct

import pytest
import torch
from safetensors import safe_open

from c2c.artifact.fingerprint import Fingerprint
from c2c.errors import CorruptArtifactError, MapMismatchError
from c2c.xmodel import load, map_cache


def test_save_then_load_gives_the_same_map(small_to_big, tmp_path):
    path = tmp_path / "m.c2cmap"
    mid = small_to_big.save(path)
    back = load(path, expect_id=mid)
    assert back.id == mid == small_to_big.id
    assert back.layer_sources("k") == small_to_big.layer_sources("k") and back.fit == small_to_big.fit
    for name, t in small_to_big.weights.items():
        assert torch.equal(back.weights[name], t)
    with safe_open(str(path), "pt") as f:  # plain safetensors: any reader can list it
        meta = f.metadata()
        assert set(f.keys()) == set(small_to_big.weights)
    header = json.loads(meta["c2c.map"])
    assert header["source"]["weights_digest"] == small_to_big.source.weights_digest
    assert header["target"]["weights_digest"] == small_to_big.target.weights_digest
    assert len(header["layers"]) == 5 and "r2" in header["layers"][0]["k"]


def test_a_map_is_refused_on_any_other_pair(small_to_big, tiny_models):
    small, big, other = tiny_models["small"], tiny_models["big"], tiny_models["big_other"]
    _, cache = small.prefill(list(range(30)))
    with pytest.raises(MapMismatchError) as e:  # same shapes as the target, other weights
        map_cache(small_to_big, cache, source=small, target=other)
    assert set(e.value.differences) == {"target.weights_digest"}
    with pytest.raises(MapMismatchError):  # the pair reversed
        small_to_big.check_pair(Fingerprint.of(big), Fingerprint.of(small))
    with pytest.raises(MapMismatchError):  # a source of another depth
        small_to_big.check_pair(Fingerprint.of(big), Fingerprint.of(big))
    small_to_big.check_pair(Fingerprint.of(small), Fingerprint.of(big))  # its own pair passes


def _saved(m, tmp_path) -> tuple[bytearray, int]:
    path = tmp_path / "m.c2cmap"
    m.save(path)
    data = bytearray(path.read_bytes())
    return data, 8 + struct.unpack("<Q", data[:8])[0]


def test_a_flipped_tensor_byte_is_refused(small_to_big, tmp_path):
    data, head = _saved(small_to_big, tmp_path)
    data[head + 100] ^= 0x01
    (tmp_path / "bad.c2cmap").write_bytes(data)
    with pytest.raises(CorruptArtifactError, match="tensor_digest"):
        load(tmp_path / "bad.c2cmap")


def test_an_edited_header_is_refused(small_to_big, tmp_path):
    data, head = _saved(small_to_big, tmp_path)
    text = bytes(data[:head])
    # re-point target layer 0 at another source layer, keeping every length the same
    old = b'\\"k\\":{\\"alpha\\"'
    assert old in text
    s0 = small_to_big.layers[0]["k"].source
    edited = text.replace(f'\\"source\\":{s0}'.encode(), f'\\"source\\":{(s0 + 1) % 3}'.encode(), 1)
    assert edited != text
    (tmp_path / "bad.c2cmap").write_bytes(edited + bytes(data[head:]))
    with pytest.raises(CorruptArtifactError, match="id"):
        load(tmp_path / "bad.c2cmap")


def test_truncated_or_foreign_files_and_a_wrong_pin_are_refused(small_to_big, tmp_path):
    data, head = _saved(small_to_big, tmp_path)
    (tmp_path / "short.c2cmap").write_bytes(data[: head + 50])
    with pytest.raises(CorruptArtifactError):
        load(tmp_path / "short.c2cmap")
    (tmp_path / "junk.c2cmap").write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{}" + b" " * 40)
    with pytest.raises(CorruptArtifactError):
        load(tmp_path / "junk.c2cmap")
    with pytest.raises(CorruptArtifactError):
        load(tmp_path / "m.c2cmap", expect_id="0" * 64)


def test_cli_map_info_checks_and_describes_a_map(small_to_big, tmp_path, capsys):
    from c2c.cli.main import main

    path = tmp_path / "m.c2cmap"
    mid = small_to_big.save(path)
    assert main(["map", "info", str(path), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["id"] == mid and len(out["layers"]) == 5 and out["source"] == "tiny-small"
    data = bytearray(path.read_bytes())
    data[-3] ^= 0xFF
    path.write_bytes(data)
    assert main(["map", "info", str(path)]) == 2
    assert "CorruptArtifactError" in capsys.readouterr().err
