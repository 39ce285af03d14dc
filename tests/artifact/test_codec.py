"""The exchange format: round trip, and a specific error for every bad input."""

import errno
import json
import os
import struct

import pytest
import torch

from c2c.artifact import Artifact
from c2c.artifact.codec import MAX_HEADER_BYTES
from c2c.artifact.fingerprint import Fingerprint
from c2c.artifact.prefix import PrefixRef
from c2c.canon import canonical_json
from c2c.errors import (
    ArtifactError,
    ArtifactTooLargeError,
    ArtifactWriteError,
    CorruptArtifactError,
    TruncatedArtifactError,
    UnsupportedVersionError,
)


@pytest.fixture(scope="module")
def made(tiny):
    rt = tiny("gemma3")  # sliding layers make shapes differ per layer
    ids = rt.encode("Cache handoff between two agents, checked byte by byte. " * 2)
    _, cache = rt.prefill(ids)
    art = Artifact.build(cache, fingerprint=Fingerprint.of(rt), prefix=PrefixRef.of(ids[:10]),
                         producer={"agent": "a"}, labels={"span": "all"})
    return rt, art, art.encode()


def split(data: bytes):
    (n,) = struct.unpack("<Q", data[:8])
    return json.loads(data[8:8 + n]), data[8 + n:]


def join(table: dict, body: bytes) -> bytes:
    head = json.dumps(table, separators=(",", ":")).encode()
    head += b" " * (-len(head) % 8)
    return struct.pack("<Q", len(head)) + head + body


def rewrite_header(data: bytes, change) -> bytes:
    table, body = split(data)
    h = json.loads(table["__metadata__"]["c2c.header"])
    change(h)
    table["__metadata__"]["c2c.header"] = canonical_json(h).decode()
    return join(table, body)


def test_round_trip_is_exact(made):
    _, art, data = made
    back = Artifact.decode(data)
    assert back.id == art.id and back.header == art.header
    assert back.cache.max_abs_diff(art.cache) == 0.0
    assert back.cache.windows == art.cache.windows


def test_safetensors_library_reads_it_too(made, tmp_path):
    from safetensors.torch import load_file

    _, art, data = made
    p = tmp_path / "a.c2c"
    p.write_bytes(data)
    tensors = load_file(p)
    assert torch.equal(tensors["k.000"], art.cache.keys[0]) and len(tensors) == 2 * art.cache.num_layers


@pytest.mark.parametrize("cut", [0, 5, 8, 100, -1, -1000])
def test_truncated(made, cut):
    _, _, data = made
    with pytest.raises(TruncatedArtifactError):
        Artifact.decode(data[:cut])


def test_tensor_bit_flip_is_corrupt(made):
    _, _, data = made
    for pos in (len(data) - 1, len(data) - 5000):
        bad = bytearray(data)
        bad[pos] ^= 0x10
        with pytest.raises(CorruptArtifactError, match=r"chunk \d+ \(tokens \d+\.\.\d+\) does not match its digest"):
            Artifact.decode(bytes(bad))


def test_header_byte_flip_is_refused_or_changes_the_id(made):
    """Unsigned, a flipped header byte either fails to parse or makes a different artifact.

    (A consistent edit of, say, the creation time is only detectable by id or by a
    signature; see c2c.trust.) It never yields the same id with other content.
    """
    _, art, data = made
    (n,) = struct.unpack("<Q", data[:8])
    refused = 0
    for pos in range(8, 8 + n, max(1, n // 80)):
        bad = bytearray(data)
        bad[pos] ^= 0x01
        try:
            got = Artifact.decode(bytes(bad))
        except ArtifactError:
            refused += 1
            continue
        assert got.id != art.id or got.header == art.header
    assert refused > 0


def test_declared_header_far_beyond_the_file(made):
    _, _, data = made
    with pytest.raises(ArtifactTooLargeError):
        Artifact.decode(struct.pack("<Q", 2**62) + data[8:])
    with pytest.raises(ArtifactTooLargeError):
        Artifact.decode(struct.pack("<Q", MAX_HEADER_BYTES + 1) + data[8:])
    with pytest.raises(TruncatedArtifactError):
        Artifact.decode(struct.pack("<Q", len(data)) + data[8:])


def test_size_limit(made):
    _, _, data = made
    with pytest.raises(ArtifactTooLargeError, match="limit"):
        Artifact.decode(data, max_bytes=len(data) - 1)


def test_wrong_version(made):
    _, _, data = made
    with pytest.raises(UnsupportedVersionError, match="version 3"):
        Artifact.decode(rewrite_header(data, lambda h: h.update(version=3)))


def test_tampered_tokens_do_not_match_digest(made):
    _, _, data = made

    def swap(h):
        h["tokens"][3], h["tokens"][4] = h["tokens"][4] + 1, h["tokens"][3]

    with pytest.raises(CorruptArtifactError, match="token"):
        Artifact.decode(rewrite_header(data, swap))


def test_non_canonical_header_is_refused(made):
    _, _, data = made
    table, body = split(data)
    h = json.loads(table["__metadata__"]["c2c.header"])
    table["__metadata__"]["c2c.header"] = json.dumps(h, indent=1)
    with pytest.raises(CorruptArtifactError, match="canonical"):
        Artifact.decode(join(table, body))


def test_duplicate_keys_and_injection(made):
    _, _, data = made
    table, body = split(data)
    raw = table["__metadata__"]["c2c.header"]
    table["__metadata__"]["c2c.header"] = raw[:-1] + ',"start":0}'  # a second "start"
    with pytest.raises(CorruptArtifactError, match="duplicate"):
        Artifact.decode(join(table, body))
    table["__metadata__"]["c2c.header"] = raw
    table["__metadata__"]["c2c.extra"] = "x"
    with pytest.raises(CorruptArtifactError, match="__metadata__"):
        Artifact.decode(join(table, body))
    table["__metadata__"].pop("c2c.extra")
    table["__metadata__"].pop("c2c.header")
    with pytest.raises(CorruptArtifactError, match="not a c2c artifact"):
        Artifact.decode(join(table, body))


def test_wrong_shapes_dtypes_and_offsets(made):
    _, _, data = made
    for change, msg in [
        (lambda t: t["k.000"].update(shape=[1, 2, 3, 16]), "shape"),
        (lambda t: t["k.000"].update(dtype="F16"), "dtype"),
        (lambda t: t["v.001"].update(data_offsets=[0, 8]), "data_offsets"),
        (lambda t: t.update({"k.999": t["k.000"]}), "names"),
        (lambda t: t.pop("v.005"), "names"),
    ]:
        table, body = split(data)
        change(table)
        with pytest.raises(CorruptArtifactError, match=msg):
            Artifact.decode(join(table, body))


def test_trailing_bytes_and_nan(made):
    rt, art, data = made
    with pytest.raises(CorruptArtifactError, match="unexpected bytes"):
        Artifact.decode(data + b"\0" * 8)
    keys = list(art.cache.keys)
    keys[2] = keys[2].clone()
    keys[2][0, 0, 0, 0] = float("nan")
    from dataclasses import replace

    poisoned = Artifact.build(replace(art.cache, keys=tuple(keys)), fingerprint=art.header.fingerprint,
                              prefix=art.header.prefix)
    with pytest.raises(CorruptArtifactError, match="NaN"):
        Artifact.decode(poisoned.encode())


def test_header_that_lies_about_the_span(made):
    _, _, data = made
    with pytest.raises(CorruptArtifactError):
        Artifact.decode(rewrite_header(data, lambda h: h.update(end=h["start"])))
    with pytest.raises(CorruptArtifactError):
        Artifact.decode(rewrite_header(data, lambda h: h.update(start=-1)))
    with pytest.raises(CorruptArtifactError):
        Artifact.decode(rewrite_header(data, lambda h: h["fingerprint"].update(num_layers="6")))


def test_withheld_tokens(made):
    rt, art, _ = made
    w = Artifact.build(art.cache, fingerprint=art.header.fingerprint, prefix=art.header.prefix,
                       withhold_tokens=True)
    back = Artifact.decode(w.encode())
    assert back.header.tokens is None and back.header.token_digest == art.header.token_digest
    assert b'tokens\\":null' in w.encode()


def test_atomic_write_leaves_nothing_on_disk_full(made, tmp_path, monkeypatch):
    _, art, _ = made
    target = tmp_path / "out.c2c"

    def full(fd):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "fsync", full)
    with pytest.raises(ArtifactWriteError, match="No space left"):
        art.write(target)
    assert list(tmp_path.iterdir()) == []


def test_write_where_a_directory_cannot_be_is_a_clear_error(made, tmp_path):
    _, art, _ = made
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    with pytest.raises(ArtifactWriteError, match="nothing was written"):
        art.write(blocker / "x.c2c")
    assert blocker.read_text() == "not a directory"


def test_atomic_write_keeps_the_old_file_on_failure(made, tmp_path, monkeypatch):
    _, art, data = made
    target = tmp_path / "out.c2c"
    art.write(target)
    before = target.read_bytes()
    monkeypatch.setattr(os, "replace", lambda *a: (_ for _ in ()).throw(OSError(errno.EIO, "I/O error")))
    with pytest.raises(ArtifactWriteError):
        art.write(target)
    assert target.read_bytes() == before == data
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.c2c"]


def test_missing_file_is_an_artifact_error(tmp_path):
    with pytest.raises(ArtifactError, match="no artifact"):
        Artifact.read(tmp_path / "nope.c2c")


def test_the_share_list_is_read_from_the_signed_header_only_when_well_formed():
    from dataclasses import replace

    from c2c.artifact.header import SHARE_KEY
    from c2c.testing.synthetic import synthetic_artifact

    h = synthetic_artifact().header
    assert h.shared_with == ()
    assert replace(h, extra={SHARE_KEY: ["ops", "lab"]}).shared_with == ("ops", "lab")
    assert replace(h, extra={SHARE_KEY: ["ops", 7]}).shared_with == ("ops",)
    assert replace(h, extra={SHARE_KEY: "ops"}).shared_with == ()
