"""`forecast()`: decide a hop described by numbers and flags, before any agent exists.

``c2c advise`` and ``POST /v1/c2c/advise`` answer "would a cache pay off for a hop
like this?" They have no live agents, so this builds the two parties the flags
describe (the receiver runs ``fingerprint``, by default a stand-in for the calibrated model; the sender is in another trust domain
with ``cross_domain``, runs another model with ``other_model``; with a cross-model map ``xmap`` the hop is
between the map's two models) and asks
:func:`c2c.handoff.decide` with the advisor's predicted costs, so the answer comes
from the same rules and the same hop limit as every real hop.
"""

from __future__ import annotations

from dataclasses import replace

from c2c.advise import Calibration, advise
from c2c.artifact.fingerprint import Fingerprint
from c2c.artifact.prefix import PrefixRef
from c2c.handoff.decide import Decision, Party, decide
from c2c.handoff.policy import HandoffPolicy


def forecast(cal: Calibration, fingerprint: Fingerprint | None = None, *, message_tokens: int, context_tokens: int = 0,
             hops: int = 1, hop_limit: int | None = None, bandwidth_gbps: float | None = None,
             cross_domain: bool = False, other_model: bool = False, fuser_available: bool = False,
             xmap=None) -> Decision:
    """The decision, with the advisor's costs in ``Decision.advice``, for a hop of ``message_tokens``
    after ``context_tokens``, the ``hops``-th of its chain.

    ``xmap``: a :class:`c2c.xmodel.MapOffer` (its map need not be loaded): the hop goes from the map's
    source model to its target, with the map on offer (mapped if its record earns it, else text).

    Raises:
        ConfigError: a bad count or hop limit.
    """
    costs = advise(cal, message_tokens=message_tokens, context_tokens=context_tokens, bandwidth_gbps=bandwidth_gbps)
    fingerprint = fingerprint or _calibrated_model(cal)
    other = replace(fingerprint, weights_digest="another model") if other_model else fingerprint
    if xmap is not None:
        other, fingerprint = xmap.source, xmap.target
    prefix = PrefixRef.of(())
    receiver = Party(name="receiver", domain="here", fingerprint=fingerprint, prefix=prefix)
    sender = Party(name="sender", domain="elsewhere" if cross_domain else "here", prefix=prefix, fingerprint=other)
    policy = HandoffPolicy(mode="auto", max_hops=hop_limit)
    return decide(sender, receiver, policy, hops=hops, advice=costs, fuser_available=fuser_available,
                  maps=(xmap,) if xmap is not None else ())


def _calibrated_model(cal: Calibration) -> Fingerprint:
    """A stand-in fingerprint for the calibration's model: only its sameness with the sender's counts here."""
    return Fingerprint(architecture=cal.model, num_layers=1, layer_types=("full_attention",), kv_heads=1, head_dim=1,
                       sliding_window=None, rope="{}", dtype="calibrated", tokenizer_digest=cal.model,
                       weights_digest=cal.model, model_name=cal.model)

