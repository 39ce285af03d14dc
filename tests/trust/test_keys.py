"""Keyring: 0600 files, trust per domain, revocation, policies, seal keys."""

import hashlib
import json
import os
import stat

import pytest

from c2c.errors import ConfigError, KeyringError, RevokedSignerError, UnknownSignerError
from c2c.trust.keys import Keyring, PublicKey, SealKey, SigningKey

from .conftest import DOMAIN


def mode(p):
    return stat.S_IMODE(p.stat().st_mode)


def test_new_key_files_are_private(ring, key):
    files = [p for p in ring.root.rglob("*") if p.is_file() and p.parent.name != "public"]
    assert files and all(mode(p) == 0o600 for p in files), {str(p): oct(mode(p)) for p in files}
    assert mode(ring.root) == 0o700
    assert key.key_id == hashlib.sha256(key.public_raw).hexdigest()
    assert ring.public_key(key.key_id, DOMAIN).raw == key.public_raw
    assert ring.signing_key(DOMAIN).key_id == key.key_id


def test_public_key_file_round_trip_into_another_keyring(tmp_path, key):
    pk = PublicKey.from_json(key.public.to_json())
    assert pk.key_id == key.key_id and pk.domain == DOMAIN
    other = Keyring(tmp_path / "other")
    with pytest.raises(UnknownSignerError):
        other.public_key(key.key_id, DOMAIN)
    other.trust(pk, domain="ops")
    assert other.public_key(key.key_id, "ops").raw == key.public_raw
    with pytest.raises(UnknownSignerError, match="trusted for ops"):
        other.public_key(key.key_id, DOMAIN)


def test_revocation_is_global_and_final(ring, key):
    ring.trust(key.public, domain="ops")
    ring.revoke(key.key_id[:10], reason="laptop stolen")
    for domain in (DOMAIN, "ops"):
        with pytest.raises(RevokedSignerError, match="laptop stolen"):
            ring.public_key(key.key_id, domain)
    with pytest.raises(KeyringError, match="revoked"):
        ring.trust(key.public)
    with pytest.raises(KeyringError, match="no usable private key"):
        ring.signing_key(DOMAIN)
    assert [e.revoked for e in ring.entries() if e.key_id == key.key_id] == [True, True]


def test_signing_key_skips_revoked_and_picks_by_id(ring):
    a = ring.create_key(DOMAIN)
    b = ring.create_key(DOMAIN)
    assert ring.signing_key(DOMAIN, a.key_id[:12]).key_id == a.key_id
    ring.revoke(b.key_id)
    assert ring.signing_key(DOMAIN).key_id == a.key_id


def test_key_id_prefix_must_be_unique_and_hex(ring, key):
    with pytest.raises(ConfigError):
        ring.revoke("xyz")
    with pytest.raises(ConfigError):
        ring.revoke(key.key_id[:4])
    ring.revoke("0" * 64)  # a key never seen can be revoked in advance
    assert ring.is_revoked("0" * 64)


def test_loose_permissions_are_refused(ring, key):
    os.chmod(ring.root / "keyring.json", 0o644)
    with pytest.raises(KeyringError, match="chmod 600"):
        ring.public_key(key.key_id, DOMAIN)


def test_malformed_files_get_keyring_errors(ring, key, tmp_path):
    good = (ring.root / "keyring.json").read_text()
    d = json.loads(good)
    d["domains"][DOMAIN]["keys"][key.key_id]["public_key"] = "!!"
    for text in ("[1, 2", json.dumps(d), good.replace(key.key_id, "0" * 64)):
        (ring.root / "keyring.json").write_text(text)
        with pytest.raises(KeyringError, match="not a c2c keyring"):
            ring.public_key(key.key_id, DOMAIN)
    for bad in (b"{}", b'{"alg": "ed25519", "domain": "x", "public_key": "AAAA"}', b"\xff",
                json.dumps({"alg": "ed25519", "domain": "x", "public_key": "A" * 44, "key_id": "0" * 64}).encode()):
        with pytest.raises(KeyringError):
            PublicKey.from_json(bad)
    with pytest.raises(KeyringError):
        SigningKey.from_pem(b"-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\n", DOMAIN)


@pytest.mark.parametrize("name", ["", "a/b", "../up", "x" * 65, ".hidden", "sp ace", "red\n", "red\r\n", "\nred"])
def test_domain_names_are_checked(ring, name):
    """A whole-string match: "red\n" (which ``re.match`` with ``$`` let through) is refused too."""
    from c2c.trust.keys import check_domain

    with pytest.raises(ConfigError):
        ring.create_key(name)
    with pytest.raises(ConfigError):
        check_domain(name)
    with pytest.raises(ConfigError):
        ring.signing_key(name)


def test_policy_is_stored_per_domain(ring):
    assert ring.policy_dict(DOMAIN) is None
    ring.set_policy(DOMAIN, {"kv": "strict"})
    assert ring.policy_dict(DOMAIN) == {"kv": "strict"}
    assert ring.policy_dict("ops") is None


def test_seal_keys_create_rotate_import(ring, tmp_path):
    with pytest.raises(KeyringError, match="no seal key"):
        ring.seal_key(DOMAIN)
    first = ring.seal_key(DOMAIN, create=True)
    assert ring.seal_key(DOMAIN).key_id == first.key_id
    second = ring.rotate_seal_key(DOMAIN)
    assert second.key_id != first.key_id and ring.seal_key(DOMAIN).key_id == second.key_id
    assert ring.seal_key(DOMAIN, first.key_id).secret == first.secret  # old envelopes still open
    other = Keyring(tmp_path / "other")
    other.import_seal_key(SealKey(domain=DOMAIN, secret=second.secret))
    assert other.seal_key(DOMAIN).key_id == second.key_id
    assert mode(other.root / "seal" / f"{DOMAIN}.json") == 0o600
    assert "secret" not in repr(second) and repr(second.secret) not in repr(second)


def test_a_domain_never_signs_with_a_dotted_neighbours_key(ring):
    """`acme.eu.<id>.pem` is not one of `acme`'s keys, however new it is (a glob on `acme.*.pem` took it)."""
    acme = ring.create_key("acme")
    eu = ring.create_key("acme.eu")
    later = (ring.root / "private" / f"acme.{acme.key_id[:16]}.pem").stat().st_mtime + 10
    os.utime(ring.root / "private" / f"acme.eu.{eu.key_id[:16]}.pem", (later, later))  # acme.eu's is the newest
    assert ring.signing_key("acme").key_id == acme.key_id
    assert ring.signing_key("acme.eu").key_id == eu.key_id
    assert ring.public_key(ring.signing_key("acme").key_id, "acme").raw == acme.public_raw  # trusted for its own domain
    ring.revoke(acme.key_id)
    with pytest.raises(KeyringError, match="no usable private key for domain 'acme'"):
        ring.signing_key("acme")  # not acme.eu's key instead
    ring.trust(eu.public, domain="acme")  # the same public key, trusted for acme too: its private half is acme.eu's
    held = {(e.domain, e.has_private) for e in ring.entries() if e.key_id == eu.key_id}
    assert held == {("acme.eu", True), ("acme", False)}


def test_a_private_key_file_must_hold_the_key_its_name_says(ring):
    a, b = ring.create_key(DOMAIN), ring.create_key("other")
    (ring.root / "private" / f"{DOMAIN}.{a.key_id[:16]}.pem").unlink()
    os.rename(ring.root / "private" / f"other.{b.key_id[:16]}.pem",
              ring.root / "private" / f"{DOMAIN}.{a.key_id[:16]}.pem")
    with pytest.raises(KeyringError, match="not the one its name says"):
        ring.signing_key(DOMAIN)
