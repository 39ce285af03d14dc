"""Signatures: who signed, for which domain, over every byte; replays and edits fail."""

import pytest

from c2c.artifact import Artifact
from c2c.errors import (
    ArtifactError,
    BadSignatureError,
    C2CError,
    CorruptArtifactError,
    DomainMismatchError,
    RevokedSignerError,
    TrustError,
    UnknownSignerError,
    UnsignedArtifactError,
)
from c2c.testing.synthetic import synthetic_artifact
from c2c.trust.keys import SigningKey
from c2c.trust.signing import decode_exact, load_signed, sign, verify_signature

from .conftest import DOMAIN


def test_sign_and_verify_through_bytes(ring, key, qwen_art):
    signed = sign(qwen_art, key)
    assert signed.header == qwen_art.header  # the signature is outside the header
    sig = signed.signature
    assert sig["alg"] == "ed25519" and sig["key_id"] == key.key_id and sig["domain"] == DOMAIN
    assert sig["header"] == qwen_art.id
    art, who = load_signed(signed.encode(), ring, domain=DOMAIN)
    assert who.key_id == key.key_id and who.domain == DOMAIN and who.label == "alice"
    assert art.cache.max_abs_diff(qwen_art.cache) == 0


def test_load_signed_reads_files(ring, key, tmp_path):
    path = tmp_path / "a.c2c"
    sign(synthetic_artifact(), key).write(path)
    assert load_signed(path, ring, domain=DOMAIN)[1].key_id == key.key_id


def test_refusals_are_specific(ring, key, tmp_path):
    art = synthetic_artifact()
    with pytest.raises(UnsignedArtifactError):
        verify_signature(art, ring, domain=DOMAIN)
    with pytest.raises(UnknownSignerError):
        verify_signature(sign(art, SigningKey.generate(DOMAIN)), ring, domain=DOMAIN)
    with pytest.raises(DomainMismatchError):
        verify_signature(sign(art, key), ring, domain="ops")
    stolen = ring.create_key(DOMAIN)
    ring.revoke(stolen.key_id)
    with pytest.raises(RevokedSignerError):
        verify_signature(sign(art, stolen), ring, domain=DOMAIN)
    assert verify_signature(sign(art, key), ring).domain == DOMAIN  # domain=None: the signature's own


def test_replayed_signature_fails(ring, key):
    a, b = sign(synthetic_artifact(seed=1), key), synthetic_artifact(seed=2)
    replay = b.with_signature(a.signature)
    with pytest.raises(BadSignatureError, match="another artifact"):
        verify_signature(replay, ring, domain=DOMAIN)
    # also when the attacker rewrites the signature's header digest to match
    forged = b.with_signature(dict(a.signature, header=b.id))
    with pytest.raises(BadSignatureError, match="does not verify"):
        verify_signature(forged, ring, domain=DOMAIN)


def test_compromised_signer_outside_the_keyring_cannot_re_sign(ring, key):
    art = sign(synthetic_artifact(), key)
    tampered = Artifact.build(art.cache, fingerprint=art.header.fingerprint, prefix=art.header.prefix,
                              labels={"span": "evil"})
    with pytest.raises(UnknownSignerError):
        verify_signature(sign(tampered, SigningKey(domain=DOMAIN, private=SigningKey.generate(DOMAIN).private)),
                         ring, domain=DOMAIN)


def test_every_single_bit_flip_of_a_signed_artifact_is_refused(ring, key):
    data = sign(synthetic_artifact(T=3), key).encode()
    assert load_signed(data, ring, domain=DOMAIN)
    sig_at = data.index(b'"c2c.signature"')
    kinds = set()
    for i in range(len(data)):  # every byte; every bit of the signature entry (all bits: benchmarks/trust_fuzz.py)
        for bit in range(8) if sig_at <= i < sig_at + 400 else [i % 8]:
            bad = bytearray(data)
            bad[i] ^= 1 << bit
            with pytest.raises(C2CError) as e:
                load_signed(bytes(bad), ring, domain=DOMAIN)
            assert isinstance(e.value, (ArtifactError, TrustError)), (i, e.value)
            kinds.add(type(e.value).__name__)
    assert len(kinds) >= 3, kinds  # truncation, corruption and signature failures all occur


def test_decode_exact_refuses_variants_that_decode_accepts(key):
    data = sign(synthetic_artifact(), key).encode()
    spaced = data.replace(b'{"__metadata__"', b'{ "__metadata__"', 1)
    import struct
    (n,) = struct.unpack("<Q", data[:8])
    spaced = struct.pack("<Q", n + 1) + spaced[8:]
    assert Artifact.decode(spaced).id == Artifact.decode(data).id  # same content, other bytes
    with pytest.raises(CorruptArtifactError, match="canonical"):
        decode_exact(spaced)
    assert decode_exact(data).id == Artifact.decode(data).id


def test_non_canonical_base64_signature_is_refused(ring, key):
    art = sign(synthetic_artifact(), key)
    s = art.signature["sig"]
    assert s.endswith("==")  # 64 bytes: the last char before '==' carries 4 unused bits
    alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"
    twin = s[:-3] + alphabet[alphabet.index(s[-3]) ^ 1] + "=="
    import base64
    assert base64.b64decode(twin) == base64.b64decode(s)  # same bytes, other text
    with pytest.raises(BadSignatureError, match="canonical"):
        verify_signature(art.with_signature(dict(art.signature, sig=twin)), ring, domain=DOMAIN)


@pytest.mark.parametrize("kind", ["signed", "signed-bf16", "signed-slice", "signed-withheld", "signed-sliding",
                                  "unsigned"])
def test_canonical_head_is_what_encode_writes(key, kind):
    from c2c.testing.hostile import base_artifacts
    from c2c.trust.signing import canonical_head
    art = dict(base_artifacts(key))[kind]
    data = art.encode()
    head = canonical_head(art)
    assert data[:len(head)] == head and len(data) - len(head) == art.cache.nbytes


def test_load_signed_checks_the_signature_before_reading_any_tensor_byte(ring, key, monkeypatch):
    import c2c.artifact.codec as codec

    good = sign(synthetic_artifact(), key).encode()
    unsigned = bytearray(synthetic_artifact().encode())
    unsigned[-1] ^= 0xFF  # a corrupt tensor byte: only a tensor read would notice
    foreign = bytearray(sign(synthetic_artifact(), SigningKey.generate(DOMAIN)).encode())
    foreign[-1] ^= 0xFF
    reads = []
    real = codec._tensors
    monkeypatch.setattr(codec, "_tensors", lambda *a, **kw: reads.append(1) or real(*a, **kw))
    with pytest.raises(UnsignedArtifactError):
        load_signed(unsigned, ring, domain=DOMAIN)
    with pytest.raises(UnknownSignerError):
        load_signed(foreign, ring, domain=DOMAIN)
    assert reads == []  # refused on the header: no tensor hashed or built
    load_signed(good, ring, domain=DOMAIN)
    assert reads == [1]
    bad = bytearray(good)
    bad[-1] ^= 0xFF  # signed header, changed tensor byte: the tensor digest catches it
    with pytest.raises(CorruptArtifactError):
        load_signed(bad, ring, domain=DOMAIN)
