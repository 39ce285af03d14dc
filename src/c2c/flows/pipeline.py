"""Pipelines of agents (A -> B -> C) with a per-hop choice of path.

Hybrid rollout, as the sources recommend: hops use text by default, and a
cache mode only on hops marked ``expensive``; a run of cache hops longer than
the hop limit (``C2C_MAX_HOPS``, or ``HandoffPolicy.max_hops``) falls back to
text, by :func:`c2c.handoff.decide`. Every hop records which path it took and why.
Stages may run different models: with cross-model maps offered (``maps``), an
expensive hop from one model to another is mapped where ``decide()`` accepts a map.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

from c2c.errors import ConfigError
from c2c.handoff import Handoff, HandoffPolicy, hand_off
from c2c.team.agent import Agent


@dataclass(frozen=True, kw_only=True)
class HopPolicy:
    """Which mode each hop asks for (the hop limit is the handoff decision's, see ``HandoffPolicy``)."""

    default_mode: str = "text"     # hybrid: text unless a hop is marked expensive
    expensive_mode: str = "auto"   # cache where it can cross, text otherwise

    def mode_for(self, stage: "Stage") -> tuple[str, str]:
        if not stage.expensive:
            return self.default_mode, "hop not marked expensive: hybrid default"
        return self.expensive_mode, "hop marked expensive"


@dataclass(frozen=True, kw_only=True)
class Stage:
    """One agent of a pipeline and what it must do with what it receives."""

    agent: Agent
    instruction: str
    expensive: bool = False        # the hop INTO this stage is worth a cache
    max_new_tokens: int = 48


@dataclass(frozen=True, kw_only=True)
class HopRecord:
    sender: str
    receiver: str
    policy_reason: str
    handoff: Handoff


@dataclass(frozen=True, kw_only=True)
class PipelineRun:
    hops: tuple[HopRecord, ...]
    outputs: dict[str, str]
    seconds: float
    final: str = field(default="")


class Pipeline:
    """Run stages in order; the first reads the material, each later one receives a handoff."""

    def __init__(self, stages: Sequence[Stage], *, policy: HopPolicy = HopPolicy(),
                 handoff: HandoffPolicy = HandoffPolicy(), check: Callable | None = None, maps: Sequence[Any] = ()):
        """``maps``: cross-model maps on offer to every hop (:class:`c2c.xmodel.MapOffer`)."""
        if len(stages) < 2:
            raise ConfigError("a pipeline needs at least two stages")
        names = [s.agent.name for s in stages]
        if len(set(names)) != len(names):
            raise ConfigError(f"agent names must be unique in a pipeline, got {names}")
        self.stages = tuple(stages)
        self.policy = policy
        self.handoff = handoff
        self.check = check
        self.maps = tuple(maps)

    def run(self, material: str) -> PipelineRun:
        t0 = time.perf_counter()
        first = self.stages[0]
        first.agent.read(material, label="evidence")
        outputs = {first.agent.name: first.agent.respond(first.instruction, max_new_tokens=first.max_new_tokens).text}
        hops: list[HopRecord] = []
        cache_run = 0
        for prev, stage in zip(self.stages, self.stages[1:]):
            mode, why = self.policy.mode_for(stage)
            h = hand_off(prev.agent, stage.agent, self.handoff, mode=mode, check=self.check, hops=cache_run + 1,
                         maps=self.maps)
            cache_run = cache_run + 1 if h.used != "text" else 0
            hops.append(HopRecord(sender=prev.agent.name, receiver=stage.agent.name, policy_reason=why, handoff=h))
            outputs[stage.agent.name] = stage.agent.respond(stage.instruction,
                                                            max_new_tokens=stage.max_new_tokens).text
        last = self.stages[-1].agent.name
        return PipelineRun(hops=tuple(hops), outputs=outputs, seconds=time.perf_counter() - t0,
                           final=outputs[last])
