"""Demo: SmolLM2 and Qwen agents in one conversation, routed fused / cache / text per hop (``c2c demo router``)."""

from __future__ import annotations

import time

from c2c.artifact.prefix import SharedPrefix
from c2c.flows.router import Router
from c2c.runtime import zoo
from c2c.team.agent import Agent, Team


def demo(receiver_name: str = "Qwen2.5-Coder-0.5B-Instruct", small_name: str = "SmolLM2-135M-Instruct",
         fuser_checkpoint: str | None = None, answer_tokens: int = 32) -> dict:
    """Triage (small model) -> coder -> reviewer (same big model) -> summary (small model).

    The first hop is fused when a trained fuser checkpoint for small -> big is given,
    text otherwise; the middle hop is a cache handoff; the last is text (no fuser
    for big -> small).
    """
    big, small = zoo.load(receiver_name), zoo.load(small_name)
    fused = []
    if fuser_checkpoint:
        from c2c.fuser.infer import FusedReceiver  # lazy: only with a fuser checkpoint

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
        hops.append({"sender": sender.name, "receiver": receiver.name, "path": h.path, "reason": h.reason,
                     "hop_s": hop_s, "bytes": h.artifact_bytes})
    return {"hops": hops, "outputs": outputs}


def format_demo(report: dict) -> str:
    lines = [f"{'hop':<22}{'path':<8}{'seconds':>9}  reason"]
    for h in report["hops"]:
        lines.append(f"{h['sender'] + ' -> ' + h['receiver']:<22}{h['path']:<8}{h['hop_s']:>9.2f}  {h['reason']}")
    lines.append("")
    lines += [f"[{who}] {text.strip()}" for who, text in report["outputs"].items()]
    return "\n".join(lines)
