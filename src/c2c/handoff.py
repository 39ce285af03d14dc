"""Handoff: pass what agent A knows to agent B, by cache or by text.

Modes:

- ``full``  B continues from A's whole cache (A skips writing, B skips reading).
- ``slice`` only A's spans with the given labels are exported; B attaches them,
  re-positioned, after its own context (never A's private spans). By default
  (isolation ``"recompute"``) A re-prefills them after the shared prefix only,
  so they carry no trace of A's private spans and B can verify them against its
  own prefix cache; ``"positions"`` sends A's K/V as they are (faster, but they
  leak earlier spans through attention and verify at layer 0 only).
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

import contextlib
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Callable, Protocol

from c2c.agent import Agent
from c2c.artifact import Artifact
from c2c._io import private_dir, private_tempdir, write_atomic
from c2c.artifact.codec import read_file
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
    """Artifacts as files in a directory, written atomically and privately (0600, see :mod:`c2c._io`).

    With ``root`` the files are durable (fsynced, with their directory) and stay;
    a missing ``root`` is created 0700, an existing one is used as it is.
    Without it they go to a fresh private temporary folder (``mkdtemp``: random
    name, 0700), each is deleted once received (one-shot handoffs leave nothing
    behind), and they are not fsynced: such a file lives for one handoff on one
    machine, its digest is checked when it is read, and after a crash the sender
    still holds the cache it came from. Skipping the fsync takes the handoff's
    most variable step out of it.
    """

    def __init__(self, root: str | Path | None = None):
        self.ephemeral = root is None
        self._root = None if root is None else private_dir(root)
        self._pending = 0

    @property
    def root(self) -> Path:
        if self._root is None:  # ephemeral: made on first use, removed when its last file is received
            self._root = private_tempdir("c2c-handoff-")
        return self._root

    def _path(self, key: str) -> Path:
        if not key or "/" in key or key.startswith("."):
            raise ConfigError(f"transport key {key[:80]!r} must be a plain file name")
        return self.root / f"{key}.c2c"

    def send(self, key: str, payload: bytes) -> None:
        write_atomic(self._path(key), payload, durable=not self.ephemeral)
        self._pending += 1

    def receive(self, key: str) -> bytes:
        path = self._path(key)
        data = read_file(path)
        if self.ephemeral:
            path.unlink(missing_ok=True)
            self._pending = max(self._pending - 1, 0)
            if not self._pending:
                with contextlib.suppress(OSError):
                    self._root.rmdir()
                self._root = None
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
             critical: bool = False, calibration=None, isolation: str = "recompute") -> Handoff:
    """Hand ``sender``'s knowledge to ``receiver`` in ``mode``.

    Args:
        labels: spans exported in ``slice`` mode.
        auto_cache_mode: the cache mode ``auto`` uses when a cache can cross. With
            ``"full"``, a sender holding private spans (role prompt, scratch work)
            exports only the non-private spans after them instead (minimization).
        critical: verify strictly (re-prefill) when the receiver's team has a keyring.
        isolation: how a slice is cut (:meth:`c2c.agent.Agent.export`): ``"recompute"``
            re-prefills it after the shared prefix only (no trace of private spans,
            verifiable at every layer); ``"positions"`` keeps the sender's K/V at
            their positions (no compute; leaks earlier spans through attention).
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
    if isolation not in ("recompute", "positions"):
        raise ConfigError(f"isolation={isolation!r}: use 'recompute' or 'positions'")
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
            h = _by_cache(sender, receiver, cache_mode, "auto", reason, auto_labels, transport, check, critical,
                          isolation)
            return replace(h, advice=advice.to_dict()) if advice is not None else h
        except C2CError as e:
            return _by_text(sender, receiver, "auto", f"fell back to text: {type(e).__name__}: {e}",
                            message_prompt, message_tokens, min_message_tokens)
    domains = isolation_decide(sender.team.domain, receiver.team.domain)
    if not domains.allows_cache:
        raise HandoffError(f"{mode} handoff refused: {domains.reason}; use mode text or auto")
    why = f"{mode} requested"
    if mode == "full" and any(s.private for s in sender.context.spans):
        why += f" (includes private spans {sorted({s.label for s in sender.context.spans if s.private})})"
    return _by_cache(sender, receiver, mode, mode, why, labels, transport, check, critical, isolation)


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


_ISOLATION_REASONS = {
    "recompute": "isolation recompute: the slice was re-prefilled after the shared prefix only (no trace of "
                 "private spans in any layer)",
    "positions": "isolation positions: the slice keeps the sender's K/V at their positions, which leak the "
                 "spans before it through attention",
}


def _by_cache(sender: Agent, receiver: Agent, mode: str, requested: str, reason: str,
              labels: tuple[str, ...], transport: Transport, check, critical: bool = False,
              isolation: str = "recompute") -> Handoff:
    t0 = time.perf_counter()
    if mode == "slice":
        artifact = sender.export(labels=labels, isolation=isolation)
        reason += "; " + _ISOLATION_REASONS[artifact.header.labels["isolation"]]
    else:
        artifact = sender.export()
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
        # A slice is verified against what it follows: the receiver's own shared-prefix cache. A slice
        # starting elsewhere was computed after positions the receiver does not hold: no context, so a
        # sampled or strict policy refuses it (UnverifiableError) and auto falls back to text.
        P = receiver.context.prefix_len
        context = receiver.team.prefix_cache(receiver.runtime) if got.header.start == P else None
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
