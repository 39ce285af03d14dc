"""The four ways context crosses a hop, one small class each: text, cache, fused, mapped.

Each ``run`` does the work of one path and returns its :class:`~c2c.handoff.record.Handoff`;
which path runs is :func:`c2c.handoff.decide.decide`'s business, never theirs.
"""

from __future__ import annotations

import time
from typing import Callable

from c2c.artifact import Artifact
from c2c.errors import HandoffError
from c2c.handoff.policy import HandoffPolicy
from c2c.handoff.record import Handoff
from c2c.handoff.transport import SharedTransport, Transport
from c2c.team.agent import Agent
from c2c.trust import check_received as trust_check
from c2c.trust.signing import decode_exact
from c2c.trust.verify import slice_context
from c2c.xmodel.apply import map_received

_ISOLATION_REASONS = {
    "recompute": "isolation recompute: the slice was re-prefilled after the shared prefix only (no trace of "
                 "private spans in any layer)",
    "positions": "isolation positions: the slice keeps the sender's K/V at their positions, which leak the "
                 "spans before it through attention",
}


class TextPath:
    """The sender writes a message (decode); the receiver reads it (prefill). Always available."""

    def run(self, sender: Agent, receiver: Agent, policy: HandoffPolicy, *, requested: str, reason: str
            ) -> Handoff:
        before = receiver.stats
        gen = sender.respond(policy.message_prompt, max_new_tokens=policy.message_tokens,
                             min_new_tokens=policy.min_message_tokens, label="message")
        receiver.read_role()  # the receiver's own role turn is not part of reading the message
        t0 = time.perf_counter()
        receiver.read(f"Message from {sender.name}:\n{gen.text}", label="message")
        t1 = time.perf_counter()
        return Handoff(sender=sender.name, receiver=receiver.name, requested=requested, used="text", reason=reason,
                       message=gen.text, tokens_decoded=len(gen.token_ids),
                       tokens_prefilled=receiver.stats.prefilled - before.prefilled,
                       timings={"write_message_s": gen.prefill_s + gen.decode_s, "read_message_s": t1 - t0})


def receive(receiver: Agent, data: bytes | bytearray, *, critical: bool = False,
            engine: bool = True) -> tuple[Artifact, dict | None]:
    """The receiving side of every cache path: decode ``data`` and, where the receiver's team has a
    keyring, run its trust checks (signature for its domain, prefix, KV per its policy).

    ``engine=False`` leaves the engine out of the fingerprint check, for a caller that asks
    :func:`decide` next (which rules on the engine: another engine's cache is refused unless the
    policy opts in) and runs the K/V check a cross-engine decision forces
    (:func:`c2c.handoff.cross_engine.enforce`) before attaching.

    Returns the artifact and the trust report (None without a keyring).

    Raises:
        ArtifactError, TrustError, PrefixMismatchError, FingerprintMismatchError: it may not be attached.
    """
    keyring = receiver.team.keyring
    got = decode_exact(data) if keyring is not None else Artifact.decode(data)
    if keyring is None:
        return got, None
    # a slice that cannot be verified (UnverifiableError) makes auto fall back to text
    prefix_ids = receiver.context.token_ids[:receiver.context.prefix_len]
    report = trust_check(got, keyring, receiver.team.domain, runtime=receiver.runtime, critical=critical,
                         prefix_ids=prefix_ids, engine=engine,
                         context=slice_context(got.header.start, prefix_ids, receiver.team.prefix_cache))
    return got, report.to_dict()


class CachePath:
    """The sender exports its cache (whole, or a slice); it crosses ``transport``; the receiver
    checks it (signature, prefix, KV per its team's trust policy) and attaches it."""

    def __init__(self, transport: Transport, check: Callable[[Artifact], None] | None = None):
        self.transport = transport
        self.check = check

    def run(self, sender: Agent, receiver: Agent, policy: HandoffPolicy, *, mode: str, labels: tuple[str, ...],
            requested: str, reason: str) -> Handoff:
        if isinstance(self.transport, SharedTransport):
            return self._share(sender, receiver, policy, mode=mode, labels=labels, requested=requested, reason=reason)
        t0 = time.perf_counter()
        if mode == "slice":
            artifact = sender.export(labels=labels, isolation=policy.isolation)
            reason += "; " + _ISOLATION_REASONS[artifact.header.labels["isolation"]]
        else:
            artifact = sender.export()
        payload = artifact.encode()
        t1 = time.perf_counter()
        self.transport.send(artifact.id, payload)
        t2 = time.perf_counter()
        received = self.transport.receive(artifact.id)
        t3 = time.perf_counter()
        got, report = receive(receiver, received, critical=policy.critical)
        if got.id != artifact.id:
            raise HandoffError("the artifact changed in transit")
        if self.check is not None:
            self.check(got)
        receiver.attach(got)
        t4 = time.perf_counter()
        return Handoff(sender=sender.name, receiver=receiver.name, requested=requested, used=mode, reason=reason,
                       artifact_id=artifact.id, artifact_bytes=len(payload), trust=report,
                       timings={"export_s": t1 - t0, "write_s": t2 - t1, "read_s": t3 - t2, "import_s": t4 - t3})

    def _share(self, sender: Agent, receiver: Agent, policy: HandoffPolicy, *, mode: str, labels: tuple[str, ...],
               requested: str, reason: str) -> Handoff:
        """In one process and domain: the sender's tensors, checked for model and prefix, no bytes."""
        if sender.team.domain != receiver.team.domain:  # decide() sends text first; never share across
            raise HandoffError("a shared (in-process) handoff never crosses trust domains")
        t0 = time.perf_counter()
        cache, span = sender.export_cache(labels=labels if mode == "slice" else None, isolation=policy.isolation)
        if mode == "slice":
            reason += "; " + _ISOLATION_REASONS[span["isolation"]]
        t1 = time.perf_counter()
        receiver.attach_cache(cache, fingerprint=sender.fingerprint, prefix=sender.prefix, source=sender.name)
        t2 = time.perf_counter()
        return Handoff(sender=sender.name, receiver=receiver.name, requested=requested, used=mode,
                       reason=reason + "; shared in process (no bytes moved)", artifact_bytes=0,
                       timings={"export_s": t1 - t0, "import_s": t2 - t1})


class FusedPath:
    """The receiver re-reads the conversation with its own model and a trained fuser adds the
    sender's cache into it (:mod:`c2c.fuser.infer`). Works across models; never across domains."""

    def __init__(self, fused_receiver):
        self.fused_receiver = fused_receiver  # a c2c.fuser.infer.FusedReceiver

    def run(self, sender: Agent, receiver: Agent, *, requested: str, reason: str) -> Handoff:
        t0 = time.perf_counter()
        fused = self.fused_receiver.fuse(sender.messages)
        t1 = time.perf_counter()
        receiver.adopt(fused.cache, label=f"fused:{sender.name}", messages=sender.history)
        return Handoff(sender=sender.name, receiver=receiver.name, requested=requested, used="fused", reason=reason,
                       artifact_bytes=fused.cache.nbytes, timings={"fuse_s": t1 - t0, **fused.timings})


class MappedPath:
    """The sender's cache, through a cross-model map (:mod:`c2c.xmodel`), becomes the receiver's model's
    cache; the receiver continues from it without prefilling those tokens. In one process and one trust
    domain, like a shared cache: no bytes are written, and nothing is re-checked but the pair.

    The whole cache (``full``) replaces the receiver's context, as a full cache does; a slice (the spans
    after the sender's private ones) is cut as a cache path cuts it, mapped after the receiver's own K/V
    of the shared prefix, and placed after the receiver's context.
    """

    def __init__(self, offer):
        self.offer = offer  # a c2c.xmodel.MapOffer holding its map

    def run(self, sender: Agent, receiver: Agent, policy: HandoffPolicy, *, mode: str, labels: tuple[str, ...],
            requested: str, reason: str) -> Handoff:
        if sender.team.domain != receiver.team.domain:  # decide() sends text first; never map across
            raise HandoffError("a mapped (in-process) handoff never crosses trust domains")
        xmap = self.offer.require_map()
        t0 = time.perf_counter()
        if mode == "slice":
            cache, span = sender.export_cache(labels=labels, isolation=policy.isolation)
            reason += "; " + _ISOLATION_REASONS[span["isolation"]]
        else:
            cache = sender.cache
        t1 = time.perf_counter()
        # a slice follows the receiver's own K/V of the shared prefix, which it holds; a whole cache
        # replaces its context, from that same prefix K/V
        mapped = map_received(xmap, cache, source=sender.runtime, target=receiver.runtime,
                              prefix_len=sender.context.prefix_len,
                              prefix=None if mode == "slice" else receiver.team.prefix_cache(receiver.runtime))
        t2 = time.perf_counter()
        # a whole cache: the receiver continues the sender's conversation, message by message
        receiver.attach_cache(mapped, fingerprint=receiver.fingerprint, prefix=sender.prefix, source=sender.name,
                              messages=sender.history if mode == "full" else ())
        t3 = time.perf_counter()
        return Handoff(sender=sender.name, receiver=receiver.name, requested=requested, used=mode, path="mapped",
                       map_id=self.offer.map_id, reason=reason + "; mapped in process (no bytes moved)",
                       timings={"export_s": t1 - t0, "map_s": t2 - t1, "import_s": t3 - t2})
