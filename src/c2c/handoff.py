"""Handoff: pass what agent A knows to agent B, by cache or by text.

Modes:

- ``full``  B continues from A's whole cache (A skips writing, B skips reading).
- ``slice`` only A's spans with the given labels are exported; B attaches them,
  re-positioned, after its own context (never A's private spans).
- ``text``  A writes a message (decode), B reads it (prefill): the baseline and
  the fallback that always works.
- ``auto``  a cache mode when the models' fingerprints, the shared prefix and
  the trust domain match and the advisor (:mod:`c2c.advise`, with this
  machine's calibration) predicts the cache to be faster; text otherwise.
  The reason, and the advisor's prediction, are recorded.

The artifact travels through a :class:`Transport` (a directory by default, so
the bytes really hit the disk as they would between processes).
"""

from __future__ import annotations

import os
import tempfile
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Callable, Protocol

from c2c.agent import Agent
from c2c.artifact import Artifact
from c2c.artifact.codec import read_bounded, write_atomic
from c2c.errors import C2CError, ConfigError, HandoffError
from c2c.trust.isolation import decide as isolation_decide

MODES = ("full", "slice", "text", "auto")
DEFAULT_MESSAGE_PROMPT = (
    "Write a concise message for the next agent with everything it needs from the material above: "
    "the key facts, your conclusion and the evidence for it."
)


class Transport(Protocol):
    """Moves artifact bytes from sender to receiver. One method each way."""

    def send(self, key: str, payload: bytes) -> None: ...

    def receive(self, key: str) -> bytes: ...


class DirectoryTransport:
    """Artifacts as files in a directory, written atomically.

    With ``root`` the files are durable (fsynced, with their directory) and stay.
    Without it they go to a per-process temporary folder, each is deleted once
    received (one-shot handoffs leave nothing behind), and they are not fsynced:
    such a file lives for one handoff on one machine, its digest is checked when
    it is read, and after a crash the sender still holds the cache it came from.
    Skipping the fsync takes the handoff's most variable step out of it.
    """

    def __init__(self, root: str | Path | None = None):
        self.ephemeral = root is None
        self.root = Path(root) if root else Path(tempfile.gettempdir()) / f"c2c-handoff-{os.getpid()}"
        self.root.mkdir(parents=True, exist_ok=True)

    def send(self, key: str, payload: bytes) -> None:
        write_atomic(self.root / f"{key}.c2c", payload, durable=not self.ephemeral)

    def receive(self, key: str) -> bytes:
        path = self.root / f"{key}.c2c"
        data = read_bounded(path, 1 << 40)
        if self.ephemeral:
            path.unlink(missing_ok=True)
        return data


@dataclass(frozen=True, kw_only=True)
class Handoff:
    """What happened in one handoff, and why."""

    sender: str
    receiver: str
    requested: str
    used: str
    reason: str
    artifact_id: str | None = None
    artifact_bytes: int = 0
    message: str | None = None
    tokens_decoded: int = 0      # by the sender, writing a message
    tokens_prefilled: int = 0    # by the receiver, reading the message
    timings: dict[str, float] = field(default_factory=dict)
    trust: dict | None = None    # the receiver's c2c.trust.TrustReport, when its team has a keyring
    advice: dict | None = None   # auto: the advisor's c2c.advise.Advice for this hop, when calibrated

    @property
    def seconds(self) -> float:
        return sum(self.timings.values())


def decide(sender: Agent, receiver: Agent) -> tuple[bool, str]:
    """Can a cache cross from ``sender`` to ``receiver``? Returns (ok, reason)."""
    isolation = isolation_decide(sender.team.domain, receiver.team.domain)  # the one rule, in c2c.trust
    if not isolation.allows_cache:
        return False, isolation.reason
    diff = sender.fingerprint.diff(receiver.fingerprint)
    if diff:
        return False, f"models differ in {', '.join(sorted(diff))}"
    if sender.prefix != receiver.prefix:
        return False, "shared prefixes differ"
    return True, "same model, same shared prefix, same trust domain"


def hand_off(sender: Agent, receiver: Agent, *, mode: str = "auto", labels: tuple[str, ...] = ("evidence",),
             auto_cache_mode: str = "full", transport: Transport | None = None,
             message_prompt: str = DEFAULT_MESSAGE_PROMPT, message_tokens: int = 128,
             min_message_tokens: int = 0, check: Callable[[Artifact], None] | None = None,
             critical: bool = False, calibration=None) -> Handoff:
    """Hand ``sender``'s knowledge to ``receiver`` in ``mode``.

    Args:
        labels: spans exported in ``slice`` mode.
        auto_cache_mode: the cache mode ``auto`` uses when a cache can cross. With
            ``"full"``, a sender holding private spans (role prompt, scratch work)
            exports only the non-private spans after them instead (minimization).
        critical: verify strictly (re-prefill) when the receiver's team has a keyring.
        transport: where artifact bytes go; a temporary directory by default.
        message_tokens / min_message_tokens: the message budget in ``text`` mode.
        check: extra verification of the received artifact (e.g. a trust
            policy); a :class:`C2CError` it raises makes ``auto`` fall back to text.
        calibration: the :class:`c2c.advise.Calibration` ``auto`` predicts latency
            with; by default the one saved for the sender's model (``c2c advise``
            saves it). Without one, ``auto`` does not predict and says so.

    Raises:
        HandoffError, FingerprintMismatchError, PrefixMismatchError, ...: when a
            cache mode was asked for explicitly and cannot be done.
    """
    if mode not in MODES:
        raise ConfigError(f"unknown handoff mode {mode!r}; use one of {', '.join(MODES)}")
    if auto_cache_mode not in ("full", "slice"):
        raise ConfigError("auto_cache_mode must be 'full' or 'slice'")
    transport = transport or DirectoryTransport()
    if mode == "text":
        return _by_text(sender, receiver, "text", "text requested", message_prompt, message_tokens,
                        min_message_tokens)
    if mode == "auto":
        ok, reason = decide(sender, receiver)
        if not ok:
            return _by_text(sender, receiver, "auto", f"fell back to text: {reason}", message_prompt,
                            message_tokens, min_message_tokens)
        advice, why = _advice(sender, message_tokens, calibration)
        if advice is not None and advice.decision == "text":
            h = _by_text(sender, receiver, "auto", f"fell back to text: {why}", message_prompt, message_tokens,
                         min_message_tokens)
            return replace(h, advice=advice.to_dict())
        reason += f"; {why}"
        cache_mode, auto_labels = auto_cache_mode, labels
        if auto_cache_mode == "full" and any(s.private for s in sender.context.spans):
            cache_mode, auto_labels = "slice", sender.exportable_labels()
            private = sorted({s.label for s in sender.context.spans if s.private})
            reason += f"; minimized to spans {list(auto_labels)} (private {private} never leave)"
            if not auto_labels:
                return _by_text(sender, receiver, "auto", "fell back to text: nothing exportable after the "
                                "private spans", message_prompt, message_tokens, min_message_tokens)
        try:
            h = _by_cache(sender, receiver, cache_mode, "auto", reason, auto_labels, transport, check, critical)
            return replace(h, advice=advice.to_dict()) if advice is not None else h
        except C2CError as e:
            return _by_text(sender, receiver, "auto", f"fell back to text: {type(e).__name__}: {e}",
                            message_prompt, message_tokens, min_message_tokens)
    isolation = isolation_decide(sender.team.domain, receiver.team.domain)
    if not isolation.allows_cache:
        raise HandoffError(f"{mode} handoff refused: {isolation.reason}; use mode text or auto")
    why = f"{mode} requested"
    if mode == "full" and any(s.private for s in sender.context.spans):
        why += f" (includes private spans {sorted({s.label for s in sender.context.spans if s.private})})"
    return _by_cache(sender, receiver, mode, mode, why, labels, transport, check, critical)


def _advice(sender: Agent, message_tokens: int, calibration):
    """The advisor's view of this hop: (Advice or None, one-line reason)."""
    from c2c import advise

    name = sender.runtime.name
    cal = calibration or advise.load_calibration(name)
    if cal is None:
        return None, f"latency not predicted (no calibration for {name}; `c2c advise --model {name}` makes one)"
    ctx = sender.context
    context_tokens = max(len(ctx.token_ids) - ctx.prefix_len - message_tokens, 0)
    a = advise.advise(cal, message_tokens=message_tokens, context_tokens=context_tokens,
                      prefix_tokens=ctx.prefix_len)
    if a.decision == "text":
        return a, "advisor: " + "; ".join(a.reasons)
    return a, (f"advisor predicts cache {a.cache_handoff_s * 1e3:.0f} ms vs text {a.text_handoff_s:.2f} s "
               f"for a {message_tokens}-token message")


def _by_cache(sender: Agent, receiver: Agent, mode: str, requested: str, reason: str,
              labels: tuple[str, ...], transport: Transport, check, critical: bool = False) -> Handoff:
    t0 = time.perf_counter()
    artifact = sender.export(labels=labels if mode == "slice" else None)
    payload = artifact.encode()
    t1 = time.perf_counter()
    transport.send(artifact.id, payload)
    t2 = time.perf_counter()
    received = transport.receive(artifact.id)
    t3 = time.perf_counter()
    keyring = receiver.team.keyring
    if keyring is not None:
        from c2c.trust import check as trust_check
        from c2c.trust.signing import decode_exact

        got = decode_exact(received)
    else:
        got = Artifact.decode(received)
    if got.id != artifact.id:
        raise HandoffError("the artifact changed in transit")
    report = None
    if keyring is not None:
        context = receiver.cache if got.header.start == receiver.cache.end else None
        report = trust_check(got, keyring, receiver.team.domain, runtime=receiver.runtime, critical=critical,
                             prefix_ids=receiver.context.token_ids[: receiver.context.prefix_len],
                             context=context).to_dict()
    if check is not None:
        check(got)
    receiver.attach(got)
    t4 = time.perf_counter()
    return Handoff(sender=sender.name, receiver=receiver.name, requested=requested, used=mode, reason=reason,
                   artifact_id=artifact.id, artifact_bytes=len(payload), trust=report,
                   timings={"export_s": t1 - t0, "write_s": t2 - t1, "read_s": t3 - t2, "import_s": t4 - t3})


def _by_text(sender: Agent, receiver: Agent, requested: str, reason: str, prompt: str, budget: int,
             min_tokens: int) -> Handoff:
    before = receiver.stats
    gen = sender.respond(prompt, max_new_tokens=budget, min_new_tokens=min_tokens, label="message")
    receiver.read_role()  # the receiver's own role turn is not part of reading the message
    t0 = time.perf_counter()
    receiver.read(f"Message from {sender.name}:\n{gen.text}", label="message")
    t1 = time.perf_counter()
    return Handoff(sender=sender.name, receiver=receiver.name, requested=requested, used="text", reason=reason,
                   message=gen.text, tokens_decoded=len(gen.token_ids),
                   tokens_prefilled=receiver.stats.prefilled - before.prefilled,
                   timings={"write_message_s": gen.prefill_s + gen.decode_s, "read_message_s": t1 - t0})
