"""`Handoff`: the record of one handoff: which path it took, why, what moved, how long it took."""

from __future__ import annotations

from dataclasses import dataclass, field

_PATH_OF = {"full": "cache", "slice": "cache"}  # a cache path's record says which cache it moved in `used`


@dataclass(frozen=True, kw_only=True)
class Handoff:
    """What happened in one handoff, and why.

    ``path`` is the decision's (``cache``, ``fused``, ``mapped``, ``text``); ``used`` is what moved:
    ``full`` or ``slice`` (a cache, mapped or not), ``fused`` or ``text``. Left empty, ``path``
    follows ``used``.
    """

    sender: str
    receiver: str
    requested: str
    used: str
    reason: str
    path: str = ""
    map_id: str | None = None    # the cross-model map a mapped path applied (c2c.xmodel.MapOffer.map_id)
    artifact_id: str | None = None
    artifact_bytes: int = 0
    message: str | None = None
    tokens_decoded: int = 0      # by the sender, writing a message
    tokens_prefilled: int = 0    # by the receiver, reading the message
    timings: dict[str, float] = field(default_factory=dict)
    trust: dict | None = None    # the receiver's c2c.trust.TrustReport, when its team has a keyring
    advice: dict | None = None   # auto: the advisor's c2c.advise.Advice for this hop, when calibrated
    decision: dict | None = None  # the c2c.handoff.decide.Decision behind it: every check and its verdict

    def __post_init__(self) -> None:
        if not self.path:
            object.__setattr__(self, "path", _PATH_OF.get(self.used, self.used))

    @property
    def seconds(self) -> float:
        return sum(self.timings.values())

    def to_dict(self) -> dict:
        return {k: getattr(self, k) for k in self.__dataclass_fields__} | {"seconds": self.seconds}
