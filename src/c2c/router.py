"""Router: switch models mid-conversation, choosing the cheapest safe path per hop.

- same model (fingerprints, prefix and trust domain match): a cache handoff;
- different models with a trained fuser for the pair: a fused handoff (the
  receiver continues from its own cache of the conversation with the sender's
  cache fused in, see :mod:`c2c.fuser.infer`);
- otherwise: text.

Each hop's :class:`~c2c.handoff.Handoff` records the path and the reason.
"""

from __future__ import annotations

import time
from typing import Sequence

from c2c.agent import Agent
from c2c.errors import C2CError
from c2c.handoff import Handoff, decide, hand_off


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
        """The path a hop will take, and why."""
        ok, reason = decide(sender, receiver)
        if ok:
            return "cache", reason
        if sender.team.domain != receiver.team.domain:
            return "text", reason
        if self.fuser_for(sender, receiver) is not None:
            return "fused", f"{reason}; a trained fuser exists for {sender.runtime.name} -> {receiver.runtime.name}"
        return "text", f"{reason}; no trained fuser for {sender.runtime.name} -> {receiver.runtime.name}"

    def hand_off(self, sender: Agent, receiver: Agent, **kwargs) -> Handoff:
        path, reason = self.route(sender, receiver)
        if path == "cache":
            return hand_off(sender, receiver, mode="auto", **kwargs)
        if path == "fused":
            try:
                return self._fused_hop(sender, receiver, reason)
            except C2CError as e:
                reason = f"fused handoff failed ({type(e).__name__}: {e}); fell back to text"
        h = hand_off(sender, receiver, mode="text", **kwargs)
        return Handoff(**{**h.__dict__, "requested": "route", "reason": reason})

    def _fused_hop(self, sender: Agent, receiver: Agent, reason: str) -> Handoff:
        fr = self.fuser_for(sender, receiver)
        t0 = time.perf_counter()
        fused = fr.fuse(sender.messages)
        t1 = time.perf_counter()
        receiver.adopt(fused.cache, label=f"fused:{sender.name}")
        receiver.messages = list(sender.messages)
        return Handoff(sender=sender.name, receiver=receiver.name, requested="route", used="fused", reason=reason,
                       artifact_bytes=fused.cache.nbytes, timings={"fuse_s": t1 - t0, **fused.timings})
