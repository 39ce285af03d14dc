"""AES-GCM envelopes: fresh nonces, every byte authenticated, bound to a domain."""

import pytest

from c2c.errors import DomainMismatchError, SealError
from c2c.trust.seal import MAGIC, envelope_info, open_sealed, seal

from .conftest import DOMAIN

PAYLOAD = b"c2c artifact bytes " * 20


def test_round_trip_and_fresh_nonces(ring):
    key = ring.seal_key(DOMAIN, create=True)
    a, b = seal(PAYLOAD, key), seal(PAYLOAD, key)
    assert a != b and envelope_info(a)["nonce"] != envelope_info(b)["nonce"]
    assert PAYLOAD not in a
    assert open_sealed(a, ring, domain=DOMAIN) == PAYLOAD == open_sealed(b, key, domain=DOMAIN)
    assert a.startswith(MAGIC) and envelope_info(a)["domain"] == DOMAIN


def test_nonces_do_not_repeat_over_many_seals(ring):
    key = ring.seal_key(DOMAIN, create=True)
    nonces = {envelope_info(seal(b"x", key))["nonce"] for _ in range(2000)}
    assert len(nonces) == 2000


def test_every_changed_byte_fails(ring):
    key = ring.seal_key(DOMAIN, create=True)
    blob = seal(PAYLOAD[:64], key)
    for i in range(len(blob)):
        bad = bytearray(blob)
        bad[i] ^= 0x01
        with pytest.raises((SealError, DomainMismatchError)):
            open_sealed(bytes(bad), ring, domain=DOMAIN)
    for cut in (0, 5, len(blob) // 2, len(blob) - 1):
        with pytest.raises(SealError):
            open_sealed(blob[:cut], ring, domain=DOMAIN)
    with pytest.raises(SealError):
        open_sealed(blob + b"\0", ring, domain=DOMAIN)


def test_domain_and_key_binding(ring, tmp_path):
    key = ring.seal_key(DOMAIN, create=True)
    other = ring.seal_key("ops", create=True)
    blob = seal(PAYLOAD, key)
    with pytest.raises(DomainMismatchError):
        open_sealed(blob, ring, domain="ops")
    with pytest.raises(SealError):
        open_sealed(blob, other, domain=DOMAIN)
    # a header rewritten to claim the other domain is caught (by domain check or by the tag)
    forged = blob.replace(b'"domain":"lab"', b'"domain":"ops"')
    with pytest.raises(SealError):
        open_sealed(forged, ring, domain="ops")
    old = seal(PAYLOAD, key)
    ring.rotate_seal_key(DOMAIN)
    assert open_sealed(old, ring, domain=DOMAIN) == PAYLOAD
    from c2c.trust.keys import Keyring
    with pytest.raises(SealError, match="cannot open"):
        open_sealed(old, Keyring(tmp_path / "empty"), domain=DOMAIN)


def test_content_tag_is_bound(ring):
    key = ring.seal_key(DOMAIN, create=True)
    blob = seal(PAYLOAD, key, content="c2c-text")
    with pytest.raises(SealError, match="holds"):
        open_sealed(blob, ring, domain=DOMAIN)
    assert open_sealed(blob, ring, domain=DOMAIN, content="c2c-text") == PAYLOAD
