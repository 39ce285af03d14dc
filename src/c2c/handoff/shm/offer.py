"""The wire offer: what one handoff put in the sender's arena, signed for one connection.

Every control message is one JSON object in one ``SOCK_SEQPACKET`` message (file descriptors beside
it)::

    both ways, on connect   {"c2c": "shm-v1", "nonce": <32 random bytes, hex>}
    sender -> receiver      {"arena": size} + the memfd            (first use, or a bigger arena)
    sender -> receiver      {"offer": {...}, "sig": {...} | null}  (one per handoff)
    receiver -> sender      {"ack": seq, "seq": seq, "receiver": name, "timings": {...}}
                            | {"refused": {"type": C2CError subclass, "message": ...}, "seq": seq}

:class:`ShmOffer` is the ``offer`` (the part the signature covers); :func:`sign_offer` and
:func:`verify_offer` make and check ``sig``; :func:`peer_error` turns a ``refused`` back into the
same :class:`~c2c.errors.C2CError` subclass on the sender's side.
"""

from __future__ import annotations

import base64
import binascii
from dataclasses import dataclass, field
from typing import Any

from c2c import errors
from c2c.artifact.fingerprint import Fingerprint
from c2c.artifact.header import MAX_TOKENS
from c2c.artifact.prefix import PrefixRef
from c2c.canon import canonical_json
from c2c.errors import BadSignatureError, ChannelError, DomainMismatchError, UnsignedArtifactError

PROTOCOL = "shm-v1"
_DOMAIN_TAG = b"c2c-shm-offer-v1\n"  # what a signature is over: this tag, then the offer's canonical JSON


@dataclass(frozen=True, kw_only=True)
class ShmOffer:
    """What one handoff put in the sender's arena; the part of the wire the signature covers."""

    seq: int                      # 1, 2, ... per channel and direction
    nonce: str                    # the receiver's nonce for this connection (hex)
    sender_pid: int               # both ends as the kernel names them (SO_PEERCRED): an offer relayed
    receiver_pid: int             # by a third process names that process, not the receiver
    fingerprint: Fingerprint
    prefix: PrefixRef
    start: int                    # absolute position of the first token
    seq_len: int                  # T
    token_digest: str             # sha256 of the T ids as uint32 LE (they follow the tensors in the arena)
    producer: dict[str, str] = field(default_factory=dict)   # {"agent": ..., "domain": ...}
    labels: dict[str, str] = field(default_factory=dict)     # the span labels of a slice

    def to_dict(self) -> dict[str, Any]:
        return {"seq": self.seq, "nonce": self.nonce, "sender_pid": self.sender_pid,
                "receiver_pid": self.receiver_pid, "fingerprint": self.fingerprint.to_dict(),
                "prefix": self.prefix.to_dict(), "start": self.start, "seq_len": self.seq_len,
                "token_digest": self.token_digest, "producer": dict(self.producer), "labels": dict(self.labels)}

    @classmethod
    def from_dict(cls, d: Any) -> "ShmOffer":
        """Validate and build; anything malformed raises :class:`ChannelError`."""
        want = {"seq", "nonce", "sender_pid", "receiver_pid", "fingerprint", "prefix", "start", "seq_len",
                "token_digest", "producer", "labels"}
        if not isinstance(d, dict) or set(d) != want:
            raise ChannelError(f"malformed offer: expected the fields {sorted(want)}")
        for name, lo, hi in (("seq", 1, 1 << 62), ("start", 0, MAX_TOKENS), ("seq_len", 1, MAX_TOKENS),
                             ("sender_pid", 1, 1 << 31), ("receiver_pid", 1, 1 << 31)):
            v = d[name]
            if not isinstance(v, int) or isinstance(v, bool) or not lo <= v <= hi:
                raise ChannelError(f"malformed offer: {name} must be an integer in [{lo}, {hi}]")
        for name in ("producer", "labels"):
            v = d[name]
            if not isinstance(v, dict) or len(v) > 64 or not all(
                    isinstance(k, str) and isinstance(x, str) and len(k) + len(x) < 4096 for k, x in v.items()):
                raise ChannelError(f"malformed offer: {name} must map strings to strings")
        if not (isinstance(d["token_digest"], str) and len(d["token_digest"]) == 64
                and isinstance(d["nonce"], str) and len(d["nonce"]) == 64):
            raise ChannelError("malformed offer: token_digest and nonce must be 64 hex characters")
        try:
            fp, prefix = Fingerprint.from_dict(d["fingerprint"]), PrefixRef.from_dict(d["prefix"])
        except (ValueError, TypeError) as e:
            raise ChannelError(f"malformed offer: {e}") from None
        offer = cls(seq=d["seq"], nonce=d["nonce"], sender_pid=d["sender_pid"], receiver_pid=d["receiver_pid"],
                    fingerprint=fp, prefix=prefix, start=d["start"], seq_len=d["seq_len"],
                    token_digest=d["token_digest"], producer=dict(d["producer"]), labels=dict(d["labels"]))
        try:
            offer.canonical()  # e.g. a lone surrogate in a string cannot be signed or checked
        except (UnicodeError, ValueError):
            raise ChannelError("malformed offer: a string that is not valid Unicode") from None
        return offer

    def canonical(self) -> bytes:
        return canonical_json(self.to_dict())


def sign_offer(offer: ShmOffer, key) -> dict[str, str]:
    """The ``sig`` of ``offer``: its canonical JSON signed with ``key`` (a :class:`~c2c.trust.keys.SigningKey`)."""
    return {"domain": key.domain, "key_id": key.key_id,
            "sig": base64.b64encode(key.sign(_DOMAIN_TAG + offer.canonical())).decode()}


def verify_offer(offer: ShmOffer, sig: Any, ring, domain: str) -> None:
    """Raise unless ``sig`` is a signature of ``offer`` by a key ``ring`` trusts for ``domain``."""
    if sig is None:
        raise UnsignedArtifactError("the offer is not signed; the receiving team has a keyring, so the sending "
                                    "team needs one too (its domain's signing key)")
    if not isinstance(sig, dict) or set(sig) != {"domain", "key_id", "sig"} or not all(
            isinstance(v, str) for v in sig.values()):
        raise BadSignatureError("malformed offer signature: expected string fields domain, key_id, sig")
    if sig["domain"] != domain:
        raise DomainMismatchError(f"the offer was signed for trust domain {sig['domain']!r}, not {domain!r}; "
                                  "caches do not cross trust domains, hand off by text")
    public = ring.public_key(sig["key_id"], domain)  # raises RevokedSignerError / UnknownSignerError
    try:
        raw = base64.b64decode(sig["sig"], validate=True)
    except (binascii.Error, ValueError):
        raise BadSignatureError("offer signature bytes are not valid base64") from None
    if len(raw) != 64 or not public.verify(raw, _DOMAIN_TAG + offer.canonical()):
        raise BadSignatureError(f"offer signature by key {sig['key_id'][:16]} does not verify: the offer was changed")


def peer_error(refusal: Any) -> errors.C2CError:
    """The peer's refusal as the same C2CError subclass (ChannelError when the name is not one of ours)."""
    if not isinstance(refusal, dict):
        return ChannelError(f"the peer refused the offer: {str(refusal)[:200]}")
    name, message = str(refusal.get("type", ""))[:80], str(refusal.get("message", ""))[:2000]
    cls = getattr(errors, name, None)
    if not (isinstance(cls, type) and issubclass(cls, errors.C2CError)):
        cls = ChannelError
    return cls(f"the receiving process refused the cache: {message}")
