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

from c2c.agent import Agent, Team
from c2c.errors import C2CError
from c2c.handoff import Handoff, decide, hand_off
from c2c.trust.isolation import decide as isolation_decide


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
        if not isolation_decide(sender.team.domain, receiver.team.domain).allows_cache:
            return "text", reason  # no fuser crosses a trust boundary either
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


# ---------------------------------------------------------------------- demo
def demo(receiver_name: str = "Qwen2.5-Coder-0.5B-Instruct", small_name: str = "SmolLM2-135M-Instruct",
         fuser_checkpoint: str | None = None, answer_tokens: int = 32) -> dict:
    """Triage (small model) -> coder -> reviewer (same big model) -> summary (small model).

    The first hop is fused when a trained fuser checkpoint for small -> big is given,
    text otherwise; the middle hop is a cache handoff; the last is text (no fuser
    for big -> small).
    """
    from c2c.prefix import SharedPrefix
    from c2c.runtime import zoo

    big, small = zoo.load(receiver_name), zoo.load(small_name)
    fused = []
    if fuser_checkpoint:
        from c2c.fuser.infer import FusedReceiver

        fused = [FusedReceiver.load([fuser_checkpoint], receiver=big, sharers={small.name: small})]
    team = Team(shared=SharedPrefix.build("A team that handles bug reports.", context={"product": "c2c"}))
    triage = Agent("triage", small, team, role="You are the triage agent. Classify the report.")
    coder = Agent("coder", big, team, role="You are the coder.")
    reviewer = Agent("reviewer", big, team, role="You are the reviewer.")
    summary = Agent("summary", small, team, role="You write one-line summaries.")
    router = Router(fused)
    triage.read("Bug report: exporting a 2 GB cache on a full disk leaves a half-written file behind, "
                "and the next import crashes inside torch instead of raising a clear error.")
    outputs = {"triage": triage.respond("Classify: which component and how severe?",
                                        max_new_tokens=answer_tokens).text}
    hops = []
    for sender, receiver, task in [(triage, coder, "Propose a fix in two sentences."),
                                   (coder, reviewer, "Review the proposed fix: any risk?"),
                                   (reviewer, summary, "Summarize the outcome in one line.")]:
        t0 = time.perf_counter()
        h = router.hand_off(sender, receiver, message_tokens=answer_tokens)
        hop_s = time.perf_counter() - t0
        outputs[receiver.name] = receiver.respond(task, max_new_tokens=answer_tokens).text
        hops.append({"sender": sender.name, "receiver": receiver.name, "path": h.used, "reason": h.reason,
                     "hop_s": hop_s, "bytes": h.artifact_bytes})
    return {"hops": hops, "outputs": outputs}


def format_demo(report: dict) -> str:
    lines = [f"{'hop':<22}{'path':<8}{'seconds':>9}  reason"]
    for h in report["hops"]:
        lines.append(f"{h['sender'] + ' -> ' + h['receiver']:<22}{h['path']:<8}{h['hop_s']:>9.2f}  {h['reason']}")
    lines.append("")
    lines += [f"[{who}] {text.strip()}" for who, text in report["outputs"].items()]
    return "\n".join(lines)
