"""Ed25519 signatures over artifacts.

What is signed is one canonical JSON message::

    {"v": "c2c-sig-v1", "alg": "ed25519", "domain": D, "key_id": K,
     "header": sha256(canonical header), "signed_at": T}

The canonical header embeds ``tensor_digest`` (sha256 over the tensor table and
every tensor byte) and ``token_digest``, so the signature covers every byte of
the cache, the claimed tokens, the model fingerprint and the prefix. It also
covers the domain and key id, so neither can be edited on the signature dict.
A signature copied onto another artifact names a header digest that is not that
artifact's, and fails.

The signature dict (every field of the message, plus ``sig`` in base64) lives in
``Artifact.signature``, which the codec stores outside the signed header.

Byte-exactness: :meth:`Artifact.decode` accepts a few byte-level variants of the
same content (whitespace in the safetensors table, key order of the signature
JSON). :func:`load_signed` re-encodes and insists on the exact bytes, so *any*
changed byte of a signed artifact is refused, not only those that change its
content.
"""

from __future__ import annotations

import base64
import binascii
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

from c2c.artifact.codec import Artifact, read_file
from c2c.artifact.header import ArtifactHeader
from c2c.canon import canonical_json, utc_now
from c2c.errors import BadSignatureError, CorruptArtifactError, DomainMismatchError, UnsignedArtifactError
from c2c.trust.keys import KeyId, Keyring, SigningKey

SIGNATURE_VERSION = "c2c-sig-v1"
ALGORITHM = "ed25519"
_FIELDS = {"v", "alg", "domain", "key_id", "header", "signed_at", "sig"}


@dataclass(frozen=True, kw_only=True)
class SignerInfo:
    """Who signed an artifact that verified, and for which domain."""

    key_id: KeyId
    domain: str
    label: str
    signed_at: str


def _message(fields: dict[str, Any]) -> bytes:
    return canonical_json({k: fields[k] for k in sorted(_FIELDS - {"sig"})})


def sign(artifact: Artifact, key: SigningKey) -> Artifact:
    """Return ``artifact`` carrying ``key``'s signature for ``key.domain`` (any old one is replaced)."""
    fields = {"v": SIGNATURE_VERSION, "alg": ALGORITHM, "domain": key.domain, "key_id": key.key_id,
              "header": artifact.header.digest, "signed_at": utc_now()}
    fields["sig"] = base64.b64encode(key.sign(_message(fields))).decode()
    return artifact.with_signature(fields)


def verify_signature(artifact: Artifact, keyring: Keyring, *, domain: str | None = None) -> SignerInfo:
    """Check that a key trusted for ``domain`` signed exactly this artifact (see :func:`verify_header`)."""
    return verify_header(artifact.header, artifact.signature, keyring, domain=domain)


def verify_header(header: ArtifactHeader, sig: dict | None, keyring: Keyring, *,
                  domain: str | None = None) -> SignerInfo:
    """Check that a key trusted for ``domain`` signed exactly this header.

    The header pins every tensor byte by ``tensor_digest``, which :meth:`Artifact.decode`
    checks; so a signature can be verified from :meth:`Artifact.peek` alone, before the
    tensors are hashed or built.

    Args:
        header, sig: an artifact's header and signature dict.
        keyring: the receiver's keyring.
        domain: the trust domain the receiver works in; ``None`` accepts the
            domain named by the signature (its key must still be trusted there).

    Raises:
        UnsignedArtifactError: no signature.
        BadSignatureError: malformed signature, one made for another artifact
            (replay), or bytes that do not verify.
        DomainMismatchError: signed for another domain.
        RevokedSignerError: the key was revoked.
        UnknownSignerError: the key is not trusted for the domain.
    """
    if sig is None:
        raise UnsignedArtifactError(
            "artifact is not signed; ask the sender to export with a signing key (`--sign-as DOMAIN`)")
    if not isinstance(sig, dict) or set(sig) != _FIELDS or not all(isinstance(sig[k], str) for k in _FIELDS):
        raise BadSignatureError(f"malformed signature: expected string fields {sorted(_FIELDS)}")
    if sig["v"] != SIGNATURE_VERSION or sig["alg"] != ALGORITHM:
        raise BadSignatureError(f"unsupported signature {sig['v']}/{sig['alg']}; this build checks "
                                f"{SIGNATURE_VERSION}/{ALGORITHM}")
    if domain is not None and sig["domain"] != domain:
        raise DomainMismatchError(
            f"artifact was signed for trust domain {sig['domain']!r}, not {domain!r}; "
            "caches do not cross trust domains, hand off by text")
    public = keyring.public_key(sig["key_id"], sig["domain"])  # raises Revoked/UnknownSigner
    if sig["header"] != header.digest:
        raise BadSignatureError(
            "signature was made for another artifact (header digest differs): replayed or tampered")
    try:
        raw = base64.b64decode(sig["sig"], validate=True)
    except (binascii.Error, ValueError):
        raise BadSignatureError("signature bytes are not valid base64") from None
    if base64.b64encode(raw).decode() != sig["sig"]:  # unused low bits of the last char could vary
        raise BadSignatureError("signature bytes are not canonical base64")
    if len(raw) != 64 or not public.verify(raw, _message(sig)):
        raise BadSignatureError(f"signature by key {sig['key_id'][:16]} does not verify: the artifact or "
                                "its signature fields were changed")
    return SignerInfo(key_id=KeyId(sig["key_id"]), domain=sig["domain"], label=public.label,
                      signed_at=sig["signed_at"])


def decode_exact(data: bytes | bytearray | memoryview, *, max_bytes: int | None = None,
                 own: Sequence[int] = ()) -> Artifact:
    """Decode artifact bytes and insist that they are the canonical encoding of their content.

    Raises:
        ArtifactError: as :meth:`Artifact.decode`, and :class:`CorruptArtifactError`
            when the bytes are a non-canonical variant (e.g. edited whitespace).
    """
    artifact = Artifact.decode(data, max_bytes=max_bytes, own=own)
    # The data section is already pinned by tensor_digest (checked by decode, with exact
    # offsets and length), so only the header bytes need comparing: no re-encode of tensors.
    head = canonical_head(artifact)
    if bytes(memoryview(data)[:len(head)]) != head:
        raise CorruptArtifactError("artifact bytes are not the canonical encoding of their content "
                                   "(edited whitespace or key order); refusing a modified file")
    return artifact


def canonical_head(artifact: Artifact) -> bytes:
    """The first ``8 + n`` bytes (length and table) that :meth:`Artifact.encode` writes."""
    return artifact.encode_head()


def load_signed(source: bytes | bytearray | memoryview | str | Path, keyring: Keyring, *,
                domain: str | None = None, max_bytes: int | None = None,
                own: Sequence[int] = ()) -> tuple[Artifact, SignerInfo]:
    """Read (from bytes or a path), decode byte-exactly and verify the signature.

    Every changed byte of a signed artifact raises a :class:`~c2c.errors.C2CError`:
    an :class:`~c2c.errors.ArtifactError` when the file is malformed, else a
    :class:`~c2c.errors.TrustError`. The signature is checked on the header before
    the tensors are hashed or built: an unsigned or foreign blob costs its header only.

    ``own``: chunks the receiver filled with its own K/V of the same tokens (:mod:`c2c.store.fetch`);
    the signed header names their digests, every other chunk is checked against its own.
    """
    data = read_file(source, max_bytes) if isinstance(source, (str, Path)) else source
    header, sig = Artifact.peek(data, max_bytes=max_bytes)
    signer = verify_header(header, sig, keyring, domain=domain)  # before any tensor byte is read
    return decode_exact(data, max_bytes=max_bytes, own=own), signer
