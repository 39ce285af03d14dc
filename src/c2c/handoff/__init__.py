"""Handoff: pass what agent A knows to agent B, by cache, by a cross-model map, or by text.

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
  The reason, and the advisor's prediction, are recorded. Between two models,
  with a cross-model map offered (``maps=[MapOffer...]``, :mod:`c2c.xmodel`) that
  was fitted for exactly this pair and whose calibration record says it beats the
  sender alone: the *mapped* path (A's cache through the map; B continues from it
  without prefilling those tokens).

Modules, one idea each: :mod:`~c2c.handoff.policy` (the frozen
:class:`HandoffPolicy`), :mod:`~c2c.handoff.decide` (the one place the rules
live: :func:`decide` returns a :class:`Decision` with every check),
:mod:`~c2c.handoff.paths` (text, cache, fused and mapped paths), :mod:`~c2c.handoff.transport`
(how artifact bytes travel; a private temporary directory by default, so the
bytes really hit the disk as between processes), :mod:`~c2c.handoff.shm` (the
shared-memory channel: a cache across processes on one machine, within one trust
domain, at memory speed) and :mod:`~c2c.handoff.record` (the :class:`Handoff` record).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any, Callable, Sequence

from c2c import advise
from c2c.artifact import Artifact
from c2c.errors import C2CError, ConfigError
from c2c.handoff.decide import CHECKS, PATHS, Check, Decision, Party, decide, fall_back
from c2c.handoff.forecast import forecast
from c2c.handoff.paths import CachePath, FusedPath, MappedPath, TextPath
from c2c.handoff.policy import DEFAULT_MESSAGE_PROMPT, MODES, HandoffPolicy
from c2c.handoff.record import Handoff
from c2c.handoff.shm import ShmChannel, ShmListener
from c2c.handoff.transport import DirectoryTransport, SharedTransport, Transport
from c2c.team.agent import Agent

__all__ = ["CHECKS", "CachePath", "Check", "DEFAULT_MESSAGE_PROMPT", "Decision", "DirectoryTransport", "FusedPath",
           "Handoff", "HandoffPolicy", "MODES", "MappedPath", "PATHS", "Party", "SharedTransport", "ShmChannel",
           "ShmListener", "TextPath", "Transport", "advice_for", "decide", "fall_back", "forecast", "hand_off"]


def hand_off(sender: Agent, receiver: Agent, policy: HandoffPolicy | None = None, *,
             transport: Transport | None = None, check: Callable[[Artifact], None] | None = None,
             calibration=None, hops: int = 1, maps: Sequence[Any] = (), **options: Any) -> Handoff:
    """Hand ``sender``'s knowledge to ``receiver`` as ``policy`` (or ``**options``) says.

    ``hand_off(a, b, mode="full")`` is ``hand_off(a, b, HandoffPolicy(mode="full"))``; see
    :class:`HandoffPolicy` for every option. The path is :func:`decide`'s; the record
    says which was used and why, and carries the decision with every check.

    Args:
        transport: where artifact bytes go; a private temporary directory by default.
        check: extra verification of the received artifact (e.g. a trust policy); a
            :class:`C2CError` it raises makes ``auto`` fall back to text.
        calibration: the :class:`c2c.advise.Calibration` ``auto`` predicts latency with;
            by default the one saved for the sender's model (``c2c advise`` saves it).
        hops: cache hops in the chain once this one is made (``Pipeline`` counts them).
        maps: cross-model maps on offer (:class:`c2c.xmodel.MapOffer`, loaded with their maps):
            ``auto`` between two models takes the mapped path with one that :func:`decide` accepts
            for this pair. The record then says ``path="mapped"``, the map's id and the times.

    Raises:
        DomainMismatchError, HandoffError, FingerprintMismatchError, PrefixMismatchError, StaleCommitError, ...:
            a cache mode was asked for explicitly and a check refuses it.
    """
    policy = HandoffPolicy.build(policy, **options)
    if policy.cross_engine is not None:  # the forced K/V check runs where another engine's commit is read
        raise ConfigError("hand_off does not take a cross-engine policy: a cache of another engine (a vLLM "
                          "commit) is attached with c2c.flows.chain.pull(store, commit, agent, "
                          "policy=HandoffPolicy(cross_engine=...)), which runs the K/V check the policy forces")
    advice, note = advice_for(sender, policy, calibration) if policy.mode == "auto" else (None, "")
    decision = decide(Party.of(sender), Party.of(receiver), policy, hops=hops, advice=advice, advice_note=note,
                      maps=maps)
    record = {"decision": decision.to_dict(), "advice": decision.advice}
    if decision.path == "text":
        h = TextPath().run(sender, receiver, policy, requested=policy.mode, reason=decision.reason)
        return replace(h, **record)
    if policy.mode != "auto":
        refusal = decision.refusal()
        if refusal is not None:
            raise refusal
    if decision.path == "mapped":
        path = MappedPath(next(m for m in maps if m.map_id == decision.map_id))
    else:
        path = CachePath(transport or DirectoryTransport(), check)
    try:
        h = path.run(sender, receiver, policy, mode=decision.mode, labels=decision.labels,
                     requested=policy.mode, reason=decision.reason)
    except C2CError as e:
        decision = fall_back(decision, policy, e)  # raises in an explicit mode
        h = TextPath().run(sender, receiver, policy, requested="auto", reason=decision.reason)
        record["decision"] = decision.to_dict()
    return replace(h, **record)


def advice_for(sender: Agent, policy: HandoffPolicy, calibration=None):
    """The advisor's view of this hop: (Advice or None, one-line note)."""
    name = advise.runtime_calibration_name(sender.runtime)
    cal = calibration or advise.load_calibration(name)
    if cal is None:
        return None, (f"latency not predicted (no calibration for {name}; `c2c advise --model "
                      f"{sender.runtime.name} --dtype/--backend as it runs` makes one)")
    ctx = sender.context
    n = policy.message_tokens
    context_tokens = max(len(ctx.token_ids) - ctx.prefix_len - n, 0)
    a = advise.advise(cal, message_tokens=n, context_tokens=context_tokens, prefix_tokens=ctx.prefix_len)
    return a, a.note
