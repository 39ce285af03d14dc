"""`Handoff`: the record of one handoff: which path it took, why, what moved, how long it took."""

from __future__ import annotations

from dataclasses import dataclass, field


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
    decision: dict | None = None  # the c2c.handoff.decide.Decision behind it: every check and its verdict

    @property
    def seconds(self) -> float:
        return sum(self.timings.values())

    def to_dict(self) -> dict:
        return {k: getattr(self, k) for k in self.__dataclass_fields__} | {"seconds": self.seconds}
