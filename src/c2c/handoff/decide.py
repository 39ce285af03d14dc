"""`decide()`: the one place the handoff rules live.

Every caller that moves context between agents (``hand_off``, ``Pipeline``,
``Router``, the server) asks :func:`decide` and follows its
:class:`Decision`. The checks, in order:

==============  ==========================================================
``domain``      both parties in the same, named trust domain, or the sender's
                domain shared it with the receiver's (else: text, always;
                caches never leave a domain unshared, nor do fusers)
``fingerprint`` the same model: architecture, layers, heads, RoPE, dtype,
                tokenizer, weights, adapters, engine (else: an earned
                cross-model map for the pair, else a fuser if one exists, else
                text; a cache of another engine from the same weights only by
                opt-in, verified first: :mod:`c2c.handoff.cross_engine`)
``prefix``      the same shared prefix, block by block
``hops``        the chain stays within the hop limit (``C2C_MAX_HOPS``)
``staleness``   the context is not built on a stale commit
``exact``       the cache is what a prefill of its tokens gives, not one edited
                without a prefill (messages dropped: :mod:`c2c.runtime.edit`);
                ``auto`` takes an edited one of the receiver's own domain as
                approximate and says so (one shared by another domain: text,
                since past its first drop no K/V check covers it), an explicit
                ``full`` or ``slice`` refuses it
``advisor``     this machine's calibrated cost model predicts the cache to
                be faster (only asked in ``auto``, when calibrated)
==============  ==========================================================

``auto`` takes the cache path when every check passes, text otherwise, and says
why. When only the model differs (every other check passes), ``auto`` takes:

- ``mapped`` with a cross-model map (:class:`c2c.xmodel.MapOffer`) fitted for exactly
  ``sender -> receiver`` whose calibration record (for that very map) says the mapped
  receiver beats the sender alone: the sender's cache goes through the map and the
  receiver continues from it, unprefilled. The record's verdict is the reason. A map
  for another pair is never used, and one without an earned record neither: the
  reason says which;
- else ``fused`` when a trained fuser exists for the pair (the prefix may differ too);
- else text.

An explicit ``full`` or ``slice`` gets the cache path or, through
:meth:`Decision.refusal`, the specific error of the first failed check (a map is an
``auto`` path: it changes the cache).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace
from typing import TYPE_CHECKING, Any, Literal, Sequence

from c2c.artifact.fingerprint import Fingerprint
from c2c.artifact.prefix import PrefixRef
from c2c.errors import (C2CError, DomainMismatchError, EditedCacheError, FingerprintMismatchError, HandoffError,
                        MapMismatchError, PrefixMismatchError, StaleCommitError)
from c2c.handoff import cross_engine
from c2c.handoff.policy import HandoffPolicy
from c2c.trust.isolation import domain_rule

if TYPE_CHECKING:  # the offer is read, never imported here: decide() stays free of torch
    from c2c.xmodel.mapoffer import MapOffer

Path = Literal["cache", "fused", "mapped", "text"]
PATHS: tuple[str, ...] = ("cache", "fused", "mapped", "text")
CHECKS = ("domain", "fingerprint", "prefix", "hops", "staleness", "exact", "advisor")


@dataclass(frozen=True, kw_only=True)
class Party:
    """What :func:`decide` needs to know about one side of a hop.

    ``private`` and ``exportable`` are span labels of a live sender (an agent);
    a sender that is a stored commit has neither (its artifact is already cut).
    """

    name: str
    domain: str | None
    fingerprint: Fingerprint
    prefix: PrefixRef
    private: tuple[str, ...] = ()
    exportable: tuple[str, ...] = ()
    shared_with: tuple[str, ...] = ()   # other domains its owner granted this context to (signed)
    edited: str | None = None           # how its cache was edited without a prefill (None: it is exact)

    @classmethod
    def of(cls, agent) -> "Party":
        """The party of a :class:`~c2c.team.agent.Agent`."""
        spans = agent.context.spans
        return cls(name=agent.name, domain=agent.team.domain, fingerprint=agent.fingerprint, prefix=agent.prefix,
                   private=tuple(sorted({s.label for s in spans if s.private})),
                   exportable=agent.exportable_labels(),
                   edited=agent.cache.edits.summary() if agent.cache.edits is not None else None)


@dataclass(frozen=True, kw_only=True)
class Check:
    """One rule's verdict: ``ok`` is None when the rule was not asked (e.g. no calibration)."""

    name: str
    ok: bool | None
    detail: str
    error: type[C2CError] | None = field(default=None, repr=False, compare=False)

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "ok": self.ok, "detail": self.detail}


@dataclass(frozen=True, kw_only=True)
class Decision:
    """The path one hop takes, why, and every check behind it."""

    path: Path                     # "cache" | "fused" | "mapped" | "text"
    mode: str                      # "full" | "slice" | "text" | "fused" (a mapped path maps a full cache or a slice)
    reason: str
    checks: tuple[Check, ...]
    labels: tuple[str, ...] = ()   # the spans a slice exports
    advice: dict | None = None     # the advisor's Advice, when it was asked
    map_id: str | None = None      # the map a mapped path applies (c2c.xmodel.MapOffer.map_id)
    verify: str | None = None      # a cache of another engine: the K/V check to run before attaching it
    fidelity: dict | None = None   # ... and the engines' measured EngineFidelity it was allowed on

    def check(self, name: str) -> Check:
        return next(c for c in self.checks if c.name == name)

    @property
    def failed(self) -> tuple[Check, ...]:
        return tuple(c for c in self.checks if c.ok is False)

    def refusal(self) -> C2CError | None:
        """For an explicit cache mode: the specific error of the first failed check, else None."""
        for c in self.failed:
            if c.error is not None:  # None: an explicit mode overrides it (the advisor, role adapters)
                return c.error(c.detail)
        return None

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["checks"] = [c.to_dict() for c in self.checks]
        return d


def decide(sender: Party, receiver: Party, policy: HandoffPolicy = HandoffPolicy(), *, hops: int = 1,
           stale: str | None = None, advice=None, advice_note: str = "", fuser_available: bool = False,
           maps: Sequence["MapOffer"] = ()) -> Decision:
    """Which path a hop from ``sender`` to ``receiver`` takes under ``policy``.

    Args:
        hops: the number of cache hops the chain holds once this one is made (1 for
            a first handoff); more than ``policy.hop_limit`` sends text.
        stale: why the sender's context is stale (a commit's ``stale_reason``), or None.
        advice: the advisor's :class:`~c2c.advise.Advice` (predicted costs) for this hop, or
            None when not calibrated (``advice_note`` then says so).
        fuser_available: a trained fuser exists for ``sender -> receiver``.
        maps: the cross-model maps on offer (:class:`c2c.xmodel.MapOffer`, any pairs): ``auto``
            takes the mapped path with one fitted for this pair whose record says it earns it.
    """
    checks = _checks(sender, receiver, policy, hops, stale, advice, advice_note)
    by = {c.name: c for c in checks}
    adv = advice.to_dict() if advice is not None else None
    cross = cross_engine.terms(sender.fingerprint, receiver.fingerprint, policy.cross_engine)
    if policy.mode == "text":
        return Decision(path="text", mode="text", reason="text requested", checks=checks, advice=adv)
    if policy.mode in ("full", "slice"):
        mode, labels, why = policy.mode, policy.labels if policy.mode == "slice" else (), f"{policy.mode} requested"
        if mode == "full" and sender.private:
            why += f" (includes private spans {list(sender.private)})"
        return _across_engines(Decision(path="cache", mode=mode, reason=why, checks=checks, labels=labels,
                                        advice=adv), cross)
    # auto: an edited cache of the receiver's own domain is taken as approximate (the reason says so); one
    # shared by another domain is read as text (past its first drop no K/V check can cover it)
    own = sender.domain == receiver.domain
    blocking = [c for c in checks if c.ok is False and (c.name != "exact" or not own)]
    only_model = blocking and all(c.name in ("fingerprint", "prefix") for c in blocking)
    if blocking:
        offer, map_note = (_map_for(maps, sender, receiver) if [c.name for c in blocking] == ["fingerprint"]
                           else (None, ""))
        if offer is not None:
            return _cache_decision("mapped", sender, policy, checks, adv, map_id=offer.map_id,
                                   reason=f"{blocking[0].detail}; {map_note}")
        note = f"; {map_note}" if map_note else ""
        if only_model and fuser_available and by["domain"].ok:
            return Decision(path="fused", mode="fused", checks=checks, advice=adv,
                            reason=f"{blocking[0].detail}{note}; a trained fuser exists for {sender.name} -> "
                                   f"{receiver.name}")
        tail = "" if not only_model or not by["domain"].ok else "; no trained fuser for this pair"
        return Decision(path="text", mode="text", checks=checks, advice=adv,
                        reason=f"fell back to text: {blocking[0].detail}{note}{tail}")
    reason = "same model, same shared prefix, same trust domain"
    if by["exact"].ok is False:
        reason += f"; approximate: {by['exact'].detail}"
    if by["advisor"].ok is not None or advice_note:
        reason += f"; {by['advisor'].detail}"
    return _across_engines(_cache_decision("cache", sender, policy, checks, adv, reason=reason), cross)


def _cache_decision(path: Path, sender: Party, policy: HandoffPolicy, checks: tuple[Check, ...], adv: dict | None,
                    *, reason: str, map_id: str | None = None) -> Decision:
    """``auto``'s cache (or mapped) path: ``policy.auto_cache_mode``, minimized to the spans after the
    sender's private ones (which never leave), or text when nothing is left to export."""
    mode, labels = policy.auto_cache_mode, policy.labels if policy.auto_cache_mode == "slice" else ()
    if mode == "full" and sender.private:
        if not sender.exportable:
            return Decision(path="text", mode="text", checks=checks, advice=adv,
                            reason="fell back to text: nothing exportable after the private spans")
        mode, labels = "slice", sender.exportable
        reason += f"; minimized to spans {list(labels)} (private {list(sender.private)} never leave)"
    return Decision(path=path, mode=mode, reason=reason, checks=checks, labels=labels, advice=adv, map_id=map_id)


def _map_for(maps: Sequence["MapOffer"], sender: Party, receiver: Party) -> tuple["MapOffer | None", str]:
    """The offered map that earns the mapped path for ``sender -> receiver``, and why; or None and why not.

    A map earns it only when fitted for exactly this pair (:meth:`MapOffer.check_pair`) and its
    calibration record measured that very map and says the mapped receiver beats the sender alone.
    """
    if not maps:
        return None, ""
    mismatches, verdicts = [], []
    for m in maps:
        try:
            m.check_pair(sender.fingerprint, receiver.fingerprint)
        except MapMismatchError as e:
            mismatches.append(str(e))
            continue
        name = f"map {m.map_id[:12]} ({m.pair})"
        rec = m.calibration
        if rec is None:
            verdicts.append(f"{name} has no calibration record (benchmarks/xmodel_map.py --calibrate makes one), so "
                            "nothing says it beats the sender alone; not used")
            continue
        try:
            rec.require_for(m.map_id)
        except MapMismatchError as e:
            verdicts.append(f"{name} not used: {e}")
            continue
        if rec.earned:
            return m, f"{name}: {rec.reason}"
        verdicts.append(f"{name} not used: {rec.reason}")
    if verdicts:
        return None, verdicts[0]
    if len(maps) == 1:
        return None, f"no map for this pair: {mismatches[0]}"
    return None, f"none of the {len(maps)} maps offered fits this pair; the first: {mismatches[0]}"


def _checks(sender: Party, receiver: Party, policy: HandoffPolicy, hops: int, stale: str | None, advice,
            advice_note: str) -> tuple[Check, ...]:
    domains = domain_rule(sender.domain, receiver.domain, sender.shared_with)
    out = [Check(name="domain", ok=domains.allows_cache, detail=domains.reason,
                 error=None if domains.allows_cache else DomainMismatchError)]
    diff = sender.fingerprint.diff(receiver.fingerprint)
    engines = cross_engine.rule(sender.fingerprint, receiver.fingerprint, policy.cross_engine)
    if engines is not None:  # only the engine differs: refused unless the policy opts in
        out.append(Check(name="fingerprint", ok=engines[0], detail=engines[1], error=FingerprintMismatchError))
    elif set(diff) == {"adapters"}:
        # Same base model under other role adapters: auto sends text; an explicit mode goes on and the
        # receiving team's AdapterPolicy (refuse / verify / re-prefill) decides at attach (c2c.team.roles).
        out.append(Check(name="fingerprint", ok=False, error=None,
                         detail="models differ in adapters (same base; the team's adapter policy decides)"))
    else:
        out.append(Check(name="fingerprint", ok=not diff, error=FingerprintMismatchError,
                         detail=f"models differ in {', '.join(sorted(diff))}" if diff else "same model fingerprint"))
    try:
        sender.prefix.require_same(receiver.prefix)
        out.append(Check(name="prefix", ok=True, detail="same shared prefix"))
    except PrefixMismatchError as e:
        out.append(Check(name="prefix", ok=False, detail=f"shared prefixes differ: {e}", error=PrefixMismatchError))
    limit = policy.hop_limit
    out.append(Check(name="hops", ok=hops <= limit, error=HandoffError,
                     detail=f"{hops} cache hop(s) within the hop limit {limit}" if hops <= limit else
                     f"{hops} cache hops would exceed the hop limit {limit} (C2C_MAX_HOPS); text with reference ids"))
    out.append(Check(name="staleness", ok=stale is None, error=StaleCommitError,
                     detail="fresh context" if stale is None else f"built on stale context: {stale}"))
    if sender.edited is None:
        exact = "what a prefill of its tokens gives"
    elif sender.domain == receiver.domain:
        exact = (f"the cache was {sender.edited} without a prefill, so it is approximate; attach it in auto, or "
                 "have its publisher re-prefill")
    else:
        exact = ("the cache was edited without a prefill and comes from another trust domain: past its first drop no "
                 "K/V check can cover it, so it is read as text")
    out.append(Check(name="exact", ok=sender.edited is None, error=EditedCacheError, detail=exact))
    if policy.mode == "auto" and advice is not None:
        out.append(Check(name="advisor", ok=advice.cache_is_faster, detail=advice_note or advice.note))
    else:
        out.append(Check(name="advisor", ok=None, detail=advice_note or "advisor not asked"))
    return tuple(out)


# ---------------------------------------------------------------- across engines (HandoffPolicy.cross_engine)
def _across_engines(decision: Decision, terms: dict) -> Decision:
    """A cache path the cross-engine opt-in allowed: it carries the K/V check the receiver must run
    first and the fidelity it was allowed on (:mod:`c2c.handoff.cross_engine`)."""
    if not terms or decision.path != "cache":
        return decision
    return replace(decision, verify=terms["verify"], fidelity=terms["fidelity"],
                   reason=f"{decision.reason}; another engine's cache (cross-engine policy): "
                          f"{terms['verify']} K/V check before attaching")


def fall_back(decision: Decision, policy: HandoffPolicy, error: C2CError) -> Decision:
    """The hop once its cache path failed after the decision (transfer, signature, KV check):
    text in ``auto``, with the reason; in an explicit mode the error itself is raised.

    The one place this rule lives, so the library, the channel and the server fall back alike.
    """
    if policy.mode != "auto":
        raise error
    return replace(decision, path="text", mode="text", labels=(), map_id=None, verify=None, fidelity=None,
                   reason=f"fell back to text: {type(error).__name__}: {error}")

