"""What the receiving side checks before it reads an arena byte, and after it copied the bytes out.

In this order (:class:`~c2c.handoff.shm.channel.ShmChannel` calls them):

1. :func:`authenticate`: the offer's signature, when the receiving team has a keyring (then it is
   required): a key trusted for the receiver's domain signed this offer, for this connection (the
   receiver's nonce), between these two processes (both pids, as ``SO_PEERCRED`` gives them: an
   offer a third process relays names that process) and under a sequence number above every one
   seen, so an offer can be neither replayed nor moved to another channel
   (:class:`~c2c.errors.TrustError` subclasses).
2. :func:`fits`: the hop rules, which are :func:`c2c.handoff.decide.decide`'s as for every hop: the
   trust domain, the model fingerprint, the shared prefix and the hop limit
   (:class:`~c2c.errors.DomainMismatchError`, :class:`~c2c.errors.FingerprintMismatchError`,
   :class:`~c2c.errors.PrefixMismatchError`, :class:`~c2c.errors.HandoffError`); and a slice must
   start after the shared prefix.
3. :func:`check_tokens`, on the copied-out bytes: the ids hash to the signed ``token_digest`` and lie
   in the model's vocabulary (:class:`~c2c.errors.CorruptArtifactError`).

What is not checked: the tensor bytes carry no digest and their values are not scanned, and the
receiving domain's KV verification policy (:class:`~c2c.trust.verify_policy.VerifyPolicy`) is not run,
as for an in-process handoff.
"""

from __future__ import annotations

import os
from dataclasses import replace

import numpy as np

from c2c.artifact.fingerprint import Fingerprint
from c2c.canon import sha256_hex
from c2c.errors import BadSignatureError, CorruptArtifactError
from c2c.handoff.decide import Party, decide
from c2c.handoff.policy import HandoffPolicy
from c2c.handoff.shm.offer import ShmOffer, verify_offer
from c2c.team.agent import Agent


def authenticate(msg: dict, agent: Agent, *, nonce: str, peer_pid: int, last_seq: int) -> ShmOffer:
    """The offer of ``msg`` if it was signed (for ``agent``'s trust domain, where its team has a keyring) and
    made for this connection, between these processes, after offer ``last_seq``; raises otherwise (module
    docstring, step 1)."""
    offer = ShmOffer.from_dict(msg["offer"])
    ring, domain = agent.team.keyring, agent.team.domain
    if ring is not None:
        verify_offer(offer, msg.get("sig"), ring, domain)
    if offer.nonce != nonce:
        raise BadSignatureError("the offer was made for another connection (nonce differs): replayed")
    if (offer.sender_pid, offer.receiver_pid) != (peer_pid, os.getpid()):
        raise BadSignatureError(f"the offer was made by pid {offer.sender_pid} for pid {offer.receiver_pid}, "
                                f"not by this channel's peer {peer_pid} for this process {os.getpid()}: "
                                "relayed")
    if offer.seq <= last_seq:  # numbers only grow (a refused offer uses one up too)
        raise BadSignatureError(f"offer {offer.seq} arrived after offer {last_seq}: replayed")
    return offer


def fits(offer: ShmOffer, agent: Agent, fingerprint: Fingerprint, *, hops: int = 1) -> None:
    """Raise :func:`~c2c.handoff.decide.decide`'s refusal of this hop (domain, model ``fingerprint``, shared
    prefix, ``hops`` within the limit), or if a slice starts inside the shared prefix."""
    sender = Party(name=offer.producer.get("agent", "?"), domain=offer.producer.get("domain"),
                   fingerprint=offer.fingerprint, prefix=offer.prefix)
    receiver = replace(Party.of(agent), fingerprint=fingerprint)
    mode = "slice" if offer.labels.get("span") else "full"
    refusal = decide(sender, receiver, HandoffPolicy(mode=mode), hops=hops).refusal()
    if refusal is not None:
        raise refusal
    if offer.start != 0 and offer.start < offer.prefix.length:  # a slice follows the shared prefix
        raise CorruptArtifactError(f"a slice starting at {offer.start} lies inside the "
                                   f"{offer.prefix.length}-token shared prefix")


def check_tokens(ids: np.ndarray, offer: ShmOffer, vocab: int | None) -> None:
    """Raise unless the ``(T,)`` uint32 ``ids`` copied out of the arena are the signed ones, in the vocabulary."""
    if sha256_hex(ids.tobytes()) != offer.token_digest:
        raise CorruptArtifactError("the token ids in the arena do not match the offer's token_digest")
    if len(ids) and vocab and int(ids.max()) >= vocab:
        raise CorruptArtifactError(f"a token id in the offer ({int(ids.max())}) is outside the model's "
                                   f"vocabulary of {vocab}")
