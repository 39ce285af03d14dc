"""Signing keys, seal keys and the keyring that maps trust domains to trusted keys.

A *trust domain* is a team whose agents may hand each other caches (e.g. one
deployment, one tenant). Each signer holds an Ed25519 private key that belongs
to one domain; every receiver holds a keyring naming, per domain, the public
keys it trusts, the keys revoked anywhere, the domain's verification policy and
the domain's symmetric *seal key* (AES-256-GCM, :mod:`c2c.trust.seal`).

On disk (``C2C_HOME/keys`` by default, or any folder given), every file 0600,
the folder 0700, like ``~/.ssh``::

    keys/
      keyring.json                   trusted public keys per domain, revocations, policies
      private/<domain>.<id16>.pem    Ed25519 private keys (PKCS#8, unencrypted)
      seal/<domain>.json             the domain's seal keys (newest is current)

Files readable by group or others are refused (:class:`KeyringError`), so a
leaked permission is noticed rather than silently used. Changes are written
atomically under an exclusive lock, so two processes adding keys at once do not
lose each other's changes.

A key id is the sha256 of the raw 32-byte public key, as 64 hex characters.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator, NewType

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from c2c._io import private_dir, read_private, write_atomic
from c2c.canon import canonical_json, sha256_hex, utc_now
from c2c.config import c2c_home
from c2c.errors import ConfigError, KeyringError, RevokedSignerError, UnknownSignerError

KeyId = NewType("KeyId", str)  # 64 hex chars: sha256 of the raw Ed25519 public key
KEYRING_VERSION = 1
_DOMAIN_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")  # always fullmatch: "$" would let "name\n" through
_PRIVATE_RE = re.compile(r"(?P<domain>.+)\.(?P<kid>[0-9a-f]{16})\.pem")  # private/<domain>.<id16>.pem
_MAX_KEY_FILE = 1 << 20


def check_domain(domain: str) -> str:
    """Return ``domain`` if it is a valid trust-domain name (it is used in file names)."""
    if not isinstance(domain, str) or not _DOMAIN_RE.fullmatch(domain):
        raise ConfigError(f"trust domain {domain!r} is not valid; use 1-64 letters, digits, '.', '_' or '-'")
    return domain


def key_id_of(public_raw: bytes) -> KeyId:
    return KeyId(sha256_hex(public_raw))


# --------------------------------------------------------------------- keys
@dataclass(frozen=True, kw_only=True)
class SigningKey:
    """An Ed25519 private key that signs for one trust domain."""

    domain: str
    private: Ed25519PrivateKey = field(repr=False)

    @classmethod
    def generate(cls, domain: str) -> "SigningKey":
        return cls(domain=check_domain(domain), private=Ed25519PrivateKey.generate())

    @property
    def public_raw(self) -> bytes:
        return self.private.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)

    @property
    def key_id(self) -> KeyId:
        return key_id_of(self.public_raw)

    @property
    def public(self) -> "PublicKey":
        return PublicKey(raw=self.public_raw, domain=self.domain)

    def sign(self, message: bytes) -> bytes:
        return self.private.sign(message)

    def to_pem(self) -> bytes:
        return self.private.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                          serialization.NoEncryption())

    @classmethod
    def from_pem(cls, data: bytes, domain: str) -> "SigningKey":
        try:
            key = serialization.load_pem_private_key(data, password=None)
        except (ValueError, TypeError) as e:
            raise KeyringError(f"not an unencrypted PEM private key: {e}") from None
        if not isinstance(key, Ed25519PrivateKey):
            raise KeyringError(f"expected an Ed25519 private key, got {type(key).__name__}")
        return cls(domain=check_domain(domain), private=key)


@dataclass(frozen=True, kw_only=True)
class PublicKey:
    """A public key as exchanged between teams: raw bytes plus the domain it signs for.

    The file format (``c2c keys new`` writes it, ``c2c keys trust`` reads it) is a
    small JSON object: ``{"alg": "ed25519", "domain": ..., "key_id": ..., "public_key": <base64>}``.
    """

    raw: bytes
    domain: str
    label: str = ""

    @property
    def key_id(self) -> KeyId:
        return key_id_of(self.raw)

    def verifier(self) -> Ed25519PublicKey:
        return Ed25519PublicKey.from_public_bytes(self.raw)

    def verify(self, signature: bytes, message: bytes) -> bool:
        try:
            self.verifier().verify(signature, message)
            return True
        except InvalidSignature:
            return False

    def to_json(self) -> bytes:
        return canonical_json({"alg": "ed25519", "domain": self.domain, "key_id": self.key_id,
                               "public_key": base64.b64encode(self.raw).decode(), "label": self.label})

    @classmethod
    def from_json(cls, data: bytes) -> "PublicKey":
        try:
            d = json.loads(data)
            if not isinstance(d, dict) or d.get("alg") != "ed25519":
                raise ValueError("not an ed25519 public key file")
            raw = base64.b64decode(d["public_key"], validate=True)
            if len(raw) != 32:
                raise ValueError(f"public key is {len(raw)} bytes, expected 32")
            key = cls(raw=raw, domain=check_domain(d["domain"]), label=str(d.get("label", "")))
        except (ValueError, KeyError, TypeError) as e:
            raise KeyringError(f"malformed public key file: {e}") from None
        if "key_id" in d and d["key_id"] != key.key_id:
            raise KeyringError("public key file's key_id does not match its key")
        return key


@dataclass(frozen=True, kw_only=True)
class SealKey:
    """A domain's 256-bit AEAD key. ``key_id`` names it inside sealed envelopes."""

    domain: str
    secret: bytes = field(repr=False)

    @property
    def key_id(self) -> str:
        return sha256_hex(b"c2c-seal-key-id" + self.secret)[:16]

    @classmethod
    def generate(cls, domain: str) -> "SealKey":
        return cls(domain=check_domain(domain), secret=os.urandom(32))


# ------------------------------------------------------------------ keyring
@dataclass(frozen=True, kw_only=True)
class TrustEntry:
    """One trusted key of a domain, as listed by :meth:`Keyring.entries`."""

    key_id: KeyId
    domain: str
    label: str
    added: str
    revoked: bool
    has_private: bool


class Keyring:
    """A folder of keys; see the module docstring for the layout.

    Each method re-reads the files, so a key trusted or revoked by another
    process is seen at once. Build one per process with ``Keyring()`` (uses
    ``C2C_HOME/keys``) or ``Keyring(path)``.
    """

    def __init__(self, root: str | Path | None = None):
        self.root = Path(root).expanduser() if root is not None else c2c_home() / "keys"

    def __repr__(self) -> str:
        return f"Keyring({str(self.root)!r})"

    # ------------------------------------------------------------ queries
    def public_key(self, key_id: str, domain: str) -> PublicKey:
        """The trusted key ``key_id`` of ``domain``.

        Raises:
            RevokedSignerError: the key was revoked (in any domain).
            UnknownSignerError: the key is not trusted for ``domain``.
        """
        data = self._load()
        if key_id in data["revoked"]:
            r = data["revoked"][key_id]
            raise RevokedSignerError(
                f"signer key {key_id[:16]} was revoked at {r.get('at')} ({r.get('reason') or 'no reason given'}); "
                "ask the sender to re-sign with a current key")
        entry = data["domains"].get(domain, {}).get("keys", {}).get(key_id)
        if entry is None:
            elsewhere = sorted(d for d, v in data["domains"].items() if key_id in v.get("keys", {}))
            hint = f" (it is trusted for {', '.join(elsewhere)})" if elsewhere else ""
            raise UnknownSignerError(
                f"signer key {key_id[:16]} is not trusted for domain {domain!r}{hint}; "
                f"trust it with `c2c keys trust PUBKEY_FILE --domain {domain}` if you know its owner")
        return PublicKey(raw=base64.b64decode(entry["public_key"]), domain=domain, label=entry.get("label", ""))

    def is_revoked(self, key_id: str) -> bool:
        return key_id in self._load()["revoked"]

    def domains(self) -> list[str]:
        return sorted(self._load()["domains"])

    def entries(self) -> list[TrustEntry]:
        data = self._load()
        privates = {(domain, kid16) for domain, kid16, _ in self._private_files()}
        out = []
        for domain, d in sorted(data["domains"].items()):
            for kid, e in sorted(d.get("keys", {}).items()):
                out.append(TrustEntry(key_id=KeyId(kid), domain=domain, label=e.get("label", ""),
                                      added=e.get("added", ""), revoked=kid in data["revoked"],
                                      has_private=(domain, kid[:16]) in privates))
        return out

    def policy_dict(self, domain: str) -> dict[str, Any] | None:
        """The verification policy stored for ``domain`` (see :mod:`c2c.trust.verify_policy`)."""
        return self._load()["domains"].get(domain, {}).get("policy")

    def signing_key(self, domain: str, key_id: str | None = None) -> SigningKey:
        """The newest (or the named) non-revoked private key of ``domain`` held here."""
        check_domain(domain)
        files = sorted((p for dom, _, p in self._private_files() if dom == domain),
                       key=lambda p: p.stat().st_mtime_ns)
        revoked = self._load()["revoked"]
        for p in reversed(files):
            key = SigningKey.from_pem(read_secret_file(p), domain)
            if not p.name.endswith(f".{key.key_id[:16]}.pem"):
                raise KeyringError(f"{p} holds key {key.key_id[:16]}, not the one its name says; "
                                   f"rename it to {domain}.{key.key_id[:16]}.pem or remove it")
            if key.key_id not in revoked and (key_id is None or key.key_id.startswith(key_id)):
                return key
        raise KeyringError(f"no usable private key for domain {domain!r} in {self._private_dir()}; "
                           f"create one with `c2c keys new --domain {domain}`")

    def seal_key(self, domain: str, key_id: str | None = None, *, create: bool = False) -> SealKey:
        """The current (or the named) seal key of ``domain``; ``create`` makes one if there is none."""
        check_domain(domain)
        path = self._seal_path(domain)
        if not path.exists():
            if not create:
                raise KeyringError(f"no seal key for domain {domain!r} in {self.root}; create one with "
                                   f"`c2c keys new --domain {domain}` or import it with `c2c keys seal-key`")
            with self._locked():
                if not path.exists():
                    self._write_seal(domain, [SealKey.generate(domain)])
        keys = self._read_seal(domain)
        if key_id is None:
            return keys[-1]
        for k in keys:
            if k.key_id == key_id:
                return k
        raise KeyringError(f"no seal key {key_id} for domain {domain!r}; it was made elsewhere or rotated out")

    # ------------------------------------------------------------ changes
    def create_key(self, domain: str, *, label: str = "") -> SigningKey:
        """Generate a signing key for ``domain``, store it and trust its public half here."""
        key = SigningKey.generate(domain)
        with self._locked():
            write_private_file(self._private_dir() / f"{domain}.{key.key_id[:16]}.pem", key.to_pem())
            self._trust_locked(key.public, label=label or "local")
        return key

    def trust(self, public: PublicKey, *, domain: str | None = None, label: str = "") -> KeyId:
        """Trust ``public`` for ``domain`` (default: the domain named in the key file)."""
        pk = PublicKey(raw=public.raw, domain=check_domain(domain or public.domain), label=public.label)
        with self._locked():
            self._trust_locked(pk, label=label or public.label)
        return pk.key_id

    def revoke(self, key_id: str, *, reason: str = "") -> KeyId:
        """Revoke a key everywhere. ``key_id`` may be a unique prefix of at least 8 hex chars."""
        with self._locked():
            data = self._load()
            full = self._resolve(data, key_id)
            data["revoked"][full] = {"at": utc_now(), "reason": reason}
            self._save(data)
        return KeyId(full)

    def set_policy(self, domain: str, policy: dict[str, Any]) -> None:
        with self._locked():
            data = self._load()
            data["domains"].setdefault(check_domain(domain), {"keys": {}})["policy"] = dict(policy)
            self._save(data)

    def import_seal_key(self, key: SealKey) -> None:
        """Add a seal key received out of band; it becomes the domain's current one."""
        with self._locked():
            keys = self._read_seal(key.domain) if self._seal_path(key.domain).exists() else []
            keys = [k for k in keys if k.key_id != key.key_id] + [key]
            self._write_seal(key.domain, keys)

    def rotate_seal_key(self, domain: str) -> SealKey:
        """Make a new current seal key; older ones still open what they sealed."""
        key = SealKey.generate(domain)
        self.import_seal_key(key)
        return key

    # ------------------------------------------------------------ files
    def _private_dir(self) -> Path:
        return self.root / "private"

    def _private_files(self) -> list[tuple[str, str, Path]]:
        """``(domain, key id prefix, path)`` of every ``private/<domain>.<id16>.pem``.

        The name is split from the right, so ``acme.eu.<id16>.pem`` belongs to ``acme.eu``
        and never to ``acme`` (a glob on ``acme.*.pem`` would match both).
        """
        d = self._private_dir()
        out = []
        for p in sorted(d.iterdir()) if d.is_dir() else ():
            m = _PRIVATE_RE.fullmatch(p.name)
            if m and _DOMAIN_RE.fullmatch(m["domain"]):
                out.append((m["domain"], m["kid"], p))
        return out

    def _seal_path(self, domain: str) -> Path:
        return self.root / "seal" / f"{check_domain(domain)}.json"

    def _path(self) -> Path:
        return self.root / "keyring.json"

    def _resolve(self, data: dict, key_id: str) -> str:
        known = set(data["revoked"]) | {k for d in data["domains"].values() for k in d.get("keys", {})}
        if len(key_id) < 8 or any(c not in "0123456789abcdef" for c in key_id):
            raise ConfigError(f"key id {key_id!r}: give at least 8 lowercase hex characters")
        hits = sorted(k for k in known if k.startswith(key_id))
        if len(key_id) == 64 and not hits:
            return key_id  # revoking a key we never trusted is allowed
        if len(hits) != 1:
            raise KeyringError(f"key id prefix {key_id!r} matches {len(hits)} keys; give more characters")
        return hits[0]

    def _trust_locked(self, pk: PublicKey, *, label: str) -> None:
        data = self._load()
        if pk.key_id in data["revoked"]:
            raise KeyringError(f"key {pk.key_id[:16]} was revoked; a revoked key cannot be trusted again")
        d = data["domains"].setdefault(pk.domain, {"keys": {}})
        d.setdefault("keys", {})[pk.key_id] = {"public_key": base64.b64encode(pk.raw).decode(),
                                                "label": label, "added": utc_now()}
        self._save(data)

    def _load(self) -> dict[str, Any]:
        path = self._path()
        if not path.exists():
            return {"version": KEYRING_VERSION, "domains": {}, "revoked": {}}
        raw = read_secret_file(path)
        try:
            data = json.loads(raw)
            if not isinstance(data, dict) or data.get("version") != KEYRING_VERSION:
                raise ValueError(f"version {data.get('version') if isinstance(data, dict) else None!r}")
            if not isinstance(data.get("domains"), dict) or not isinstance(data.get("revoked"), dict):
                raise ValueError("missing domains or revoked")
            for domain, d in data["domains"].items():
                keys = d.get("keys") if isinstance(d, dict) else None
                if not isinstance(keys, dict):
                    raise ValueError(f"domain {domain!r} has no key table")
                for kid, e in keys.items():
                    if not isinstance(e, dict) or len(base64.b64decode(e.get("public_key", ""), validate=True)) != 32 \
                            or key_id_of(base64.b64decode(e["public_key"])) != kid:
                        raise ValueError(f"key {kid[:16]} of domain {domain!r} is malformed")
        except (ValueError, TypeError) as e:  # binascii.Error is a ValueError
            raise KeyringError(f"{path} is not a c2c keyring: {e}") from None
        return data

    def _save(self, data: dict[str, Any]) -> None:
        write_private_file(self._path(), json.dumps(data, indent=1, sort_keys=True).encode())

    def _read_seal(self, domain: str) -> list[SealKey]:
        path = self._seal_path(domain)
        try:
            d = json.loads(read_secret_file(path))
            keys = [SealKey(domain=domain, secret=base64.b64decode(k, validate=True)) for k in d["keys"]]
            if not keys or any(len(k.secret) != 32 for k in keys):
                raise ValueError("expected 32-byte keys")
        except (ValueError, KeyError, TypeError) as e:
            raise KeyringError(f"{path} is not a c2c seal key file: {e}") from None
        return keys

    def _write_seal(self, domain: str, keys: list[SealKey]) -> None:
        body = {"domain": domain, "keys": [base64.b64encode(k.secret).decode() for k in keys]}
        write_private_file(self._seal_path(domain), json.dumps(body, indent=1).encode())

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        _make_dir(self.root)
        fd = os.open(self.root / ".lock", os.O_RDWR | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0), 0o600)
        try:
            try:
                import fcntl  # lazy: POSIX only

                fcntl.flock(fd, fcntl.LOCK_EX)
            except ImportError:  # NOTE: no flock on Windows; writes stay atomic, but may race
                pass
            yield
        finally:
            os.close(fd)


# ------------------------------------------------------------------ helpers
def _make_dir(path: Path) -> None:
    """0700 when created; an existing directory (maybe shared) is never chmod-ed."""
    private_dir(path, error=KeyringError)


def write_private_file(path: Path, payload: bytes) -> None:
    """Atomically write ``payload`` to ``path`` with mode 0600 from the first byte (see :mod:`c2c._io`)."""
    _make_dir(path.parent)
    write_atomic(path, payload, error=KeyringError)


def read_secret_file(path: Path) -> bytes:
    return read_private(path, _MAX_KEY_FILE, error=KeyringError, what="key file")
