"""Router: switch models mid-conversation, choosing the cheapest safe path per hop.

- same model (fingerprints, prefix and trust domain match): a cache handoff;
- different models with a cross-model map for the pair whose calibration record says
  it beats the sender alone (:mod:`c2c.xmodel`): a mapped handoff (the sender's cache,
  mapped, is the receiver's; it continues without prefilling those tokens). Escalating
  from a small model to a big one is the case maps are fitted for;
- different models with a trained fuser for the pair: a fused handoff (the
  receiver continues from its own cache of the conversation with the sender's
  cache fused in, see :mod:`c2c.fuser.infer`);
- otherwise: text.

Which of these a hop takes is :func:`c2c.handoff.decide`'s; each hop's
:class:`~c2c.handoff.Handoff` records the path and the reason.
"""

from __future__ import annotations

import dataclasses
from typing import Sequence

from c2c.errors import C2CError, ConfigError
from c2c.handoff import FusedPath, Handoff, HandoffPolicy, Party, decide, hand_off
from c2c.team.agent import Agent


class Router:
    """Routes hops between agents; ``fused`` lists the trained fusers available, ``maps`` the
    cross-model maps (:class:`c2c.xmodel.MapOffer`, with their maps and calibration records)."""

    def __init__(self, fused: Sequence = (), maps: Sequence = ()):
        self._fused = list(fused)  # c2c.fuser.infer.FusedReceiver objects
        self._maps = tuple(maps)

    def fuser_for(self, sender: Agent, receiver: Agent):
        for fr in self._fused:
            if fr.receiver is receiver.runtime and any(
                    link.sharer is sender.runtime for link in fr.links):
                return fr
        return None

    def route(self, sender: Agent, receiver: Agent, policy: HandoffPolicy | None = None) -> tuple[str, str]:
        """The path a hop will take under ``policy`` (``auto``; its other options as given), and why
        (:func:`c2c.handoff.decide`)."""
        d = decide(Party.of(sender), Party.of(receiver), HandoffPolicy.build(policy, mode="auto"),
                   fuser_available=self.fuser_for(sender, receiver) is not None, maps=self._maps)
        return d.path, d.reason

    def hand_off(self, sender: Agent, receiver: Agent, **options) -> Handoff:
        """One hop by the path :meth:`route` chooses; ``options`` are :func:`c2c.handoff.hand_off`'s
        (the handoff policy's fields among them), but for ``mode`` and ``maps``, which are the router's."""
        taken = sorted({"mode", "maps", "policy"} & set(options))
        if taken:
            raise ConfigError(f"Router.hand_off chooses the path itself (auto, with the router's maps): drop "
                              f"{', '.join(f'{k}=' for k in taken)}; give the policy's other fields as options")
        fields_ = {f.name for f in dataclasses.fields(HandoffPolicy)}
        policy = HandoffPolicy.build(None, **{k: v for k, v in options.items() if k in fields_})
        rest = {k: v for k, v in options.items() if k not in fields_}
        path, reason = self.route(sender, receiver, policy)
        if path in ("cache", "mapped"):
            return hand_off(sender, receiver, HandoffPolicy.build(policy, mode="auto"), maps=self._maps, **rest)
        if path == "fused":
            try:
                return FusedPath(self.fuser_for(sender, receiver)).run(sender, receiver, requested="route",
                                                                        reason=reason)
            except C2CError as e:
                reason = f"fused handoff failed ({type(e).__name__}: {e}); fell back to text"
        h = hand_off(sender, receiver, HandoffPolicy.build(policy, mode="text"), **rest)
        return Handoff(**{**h.__dict__, "requested": "route", "reason": reason})
