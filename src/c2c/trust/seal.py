"""Sealing: AES-256-GCM envelopes for artifacts that leave the process.

A signature proves who made an artifact; a seal also keeps it confidential on
the wire or on a shared disk, and authenticates every byte. Envelope layout::

    8 bytes   b"C2CSEAL1"
    u32 LE    n, length of the envelope header (at most 4096)
    n bytes   canonical JSON {"alg": "AES-256-GCM", "content": "c2c-kv", "domain": D,
                              "key_id": K, "nonce": <24 hex>}
    rest      ciphertext || 16-byte GCM tag

Everything before the ciphertext (magic, length, header with domain, content
tag, key id and nonce) is the AEAD's associated data, so no byte of the
envelope can change without :func:`open_sealed` raising :class:`SealError`.

NOTE: nonces are 96 random bits from ``os.urandom`` per seal, not a counter. A
counter would need state shared by every process sealing under the domain key,
and state restored from a backup or a forked process would repeat nonces, which
breaks GCM completely. Random nonces never repeat in practice as long as one key
seals fewer than 2**32 messages (collision probability below 2**-32, NIST SP
800-38D); rotate the seal key (:meth:`Keyring.rotate_seal_key`) long before.
"""

from __future__ import annotations

import json
import os
import struct

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from c2c.canon import canonical_json
from c2c.errors import DomainMismatchError, KeyringError, SealError
from c2c.trust.keys import Keyring, SealKey

MAGIC = b"C2CSEAL1"
ALGORITHM = "AES-256-GCM"
CONTENT = "c2c-kv"
_MAX_ENVELOPE_HEADER = 4096
_TAG = 16


def seal(payload: bytes, key: SealKey, *, content: str = CONTENT) -> bytes:
    """Encrypt and authenticate ``payload`` under ``key`` (bound to ``key.domain`` and ``content``)."""
    nonce = os.urandom(12)
    header = canonical_json({"alg": ALGORITHM, "content": content, "domain": key.domain,
                             "key_id": key.key_id, "nonce": nonce.hex()})
    aad = MAGIC + struct.pack("<I", len(header)) + header
    return aad + AESGCM(key.secret).encrypt(nonce, bytes(payload), aad)


def envelope_info(blob: bytes | bytearray | memoryview) -> dict[str, str]:
    """Parse the (unauthenticated) envelope header: alg, content, domain, key_id, nonce."""
    buf = memoryview(blob)
    if len(buf) < len(MAGIC) + 4 or bytes(buf[:len(MAGIC)]) != MAGIC:
        raise SealError("not a c2c sealed envelope (bad magic)")
    (n,) = struct.unpack("<I", buf[len(MAGIC): len(MAGIC) + 4])
    start = len(MAGIC) + 4
    if n > _MAX_ENVELOPE_HEADER or start + n + _TAG > len(buf):
        raise SealError(f"sealed envelope header of {n} bytes does not fit the {len(buf)}-byte envelope")
    raw = bytes(buf[start: start + n])
    try:
        info = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError):
        raise SealError("sealed envelope header is not JSON") from None
    fields = {"alg", "content", "domain", "key_id", "nonce"}
    if not isinstance(info, dict) or set(info) != fields or not all(isinstance(info[k], str) for k in fields):
        raise SealError(f"sealed envelope header must have string fields {sorted(fields)}")
    if canonical_json(info) != raw:
        raise SealError("sealed envelope header is not canonical")
    if info["alg"] != ALGORITHM or len(info["nonce"]) != 24:
        raise SealError(f"unsupported seal {info['alg']!r}; this build opens {ALGORITHM}")
    return info


def open_sealed(blob: bytes | bytearray | memoryview, keys: Keyring | SealKey, *, domain: str,
                content: str = CONTENT) -> bytes:
    """Authenticate and decrypt an envelope sealed for ``domain``.

    Raises:
        DomainMismatchError: the envelope was sealed for another domain.
        SealError: malformed envelope, unknown key, wrong content tag, or any
            changed byte (authentication fails).
    """
    info = envelope_info(blob)
    if info["domain"] != domain:
        raise DomainMismatchError(f"envelope is sealed for trust domain {info['domain']!r}, not {domain!r}")
    if info["content"] != content:
        raise SealError(f"envelope holds {info['content']!r}, expected {content!r}")
    if isinstance(keys, SealKey):
        if keys.domain != domain or keys.key_id != info["key_id"]:
            raise SealError(f"envelope was sealed with key {info['key_id']}, not {keys.key_id}")
        key = keys
    else:
        try:
            key = keys.seal_key(domain, info["key_id"])
        except KeyringError as e:
            raise SealError(f"cannot open: {e}") from None
    buf = memoryview(blob)
    start = len(MAGIC) + 4 + struct.unpack("<I", buf[len(MAGIC): len(MAGIC) + 4])[0]
    try:
        return AESGCM(key.secret).decrypt(bytes.fromhex(info["nonce"]), bytes(buf[start:]), bytes(buf[:start]))
    except (InvalidTag, ValueError):
        raise SealError("sealed envelope failed authentication: it was changed, truncated, or sealed "
                        "under another key") from None
