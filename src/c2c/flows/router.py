"""Router: switch models mid-conversation, choosing the cheapest safe path per hop.

- same model (fingerprints, prefix and trust domain match): a cache handoff;
- different models with a trained fuser for the pair: a fused handoff (the
  receiver continues from its own cache of the conversation with the sender's
  cache fused in, see :mod:`c2c.fuser.infer`);
- otherwise: text.

Each hop's :class:`~c2c.handoff.Handoff` records the path and the reason.
"""

from __future__ import annotations

from typing import Sequence

from c2c.errors import C2CError
from c2c.handoff import FusedPath, Handoff, HandoffPolicy, Party, decide, hand_off
from c2c.team.agent import Agent


class Router:
    """Routes hops between agents; ``fused`` lists the trained fusers available."""

    def __init__(self, fused: Sequence = ()):
        self._fused = list(fused)  # c2c.fuser.infer.FusedReceiver objects

    def fuser_for(self, sender: Agent, receiver: Agent):
        for fr in self._fused:
            if fr.receiver is receiver.runtime and any(
                    link.sharer is sender.runtime for link in fr.links):
                return fr
        return None

    def route(self, sender: Agent, receiver: Agent) -> tuple[str, str]:
        """The path a hop will take, and why (:func:`c2c.handoff.decide`)."""
        d = decide(Party.of(sender), Party.of(receiver), HandoffPolicy(mode="auto"),
                   fuser_available=self.fuser_for(sender, receiver) is not None)
        return d.path, d.reason

    def hand_off(self, sender: Agent, receiver: Agent, **options) -> Handoff:
        path, reason = self.route(sender, receiver)
        if path == "cache":
            return hand_off(sender, receiver, mode="auto", **options)
        if path == "fused":
            try:
                return FusedPath(self.fuser_for(sender, receiver)).run(sender, receiver, requested="route",
                                                                        reason=reason)
            except C2CError as e:
                reason = f"fused handoff failed ({type(e).__name__}: {e}); fell back to text"
        h = hand_off(sender, receiver, mode="text", **options)
        return Handoff(**{**h.__dict__, "requested": "route", "reason": reason})
