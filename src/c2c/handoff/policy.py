"""`HandoffPolicy`: everything a caller chooses about one handoff, in one frozen value."""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from typing import Any, Literal

from c2c.config import settings
from c2c.errors import ConfigError
from c2c.handoff.cross_engine import CrossEnginePolicy

Mode = Literal["auto", "full", "slice", "text"]
MODES: tuple[str, ...] = ("auto", "full", "slice", "text")
DEFAULT_MESSAGE_PROMPT = (
    "Write a concise message for the next agent with everything it needs from the material above: "
    "the key facts, your conclusion and the evidence for it."
)


@dataclass(frozen=True, kw_only=True)
class HandoffPolicy:
    """How one handoff may go.

    Attributes:
        mode: ``auto`` (a cache where every check passes and the advisor agrees, else
            text, with the reason), ``full`` / ``slice`` (a cache or an error), ``text``.
        labels: the spans a ``slice`` exports.
        auto_cache_mode: the cache ``auto`` uses. With ``full``, a sender holding
            private spans exports only the non-private spans after them (minimization).
        isolation: how a slice after private spans is cut: ``recompute`` re-prefills it
            after the shared prefix only (no trace of private spans in any layer;
            verifiable); ``positions`` keeps the sender's K/V (no compute; leaks the spans
            before it through attention, and the record says so).
        message_prompt / message_tokens / min_message_tokens: the text path's message.
        critical: verify strictly (re-prefill) when the receiver's team has a keyring.
        max_hops: the longest chain of cache hops; past it, text. ``None``: ``C2C_MAX_HOPS``
            (default 3), the limit the store uses too.
        cross_engine: the opt-in to attach a cache another engine made from the same weights, in the
            same dtype (vLLM's and transformers'), carrying the fidelity measured for the pair; such a
            cache is then always verified against the receiver's model first
            (:mod:`c2c.handoff.cross_engine`). ``None`` (the default): refused, as another model.
    """

    mode: Mode = "auto"
    labels: tuple[str, ...] = ("evidence",)
    auto_cache_mode: Literal["full", "slice"] = "full"
    isolation: Literal["recompute", "positions"] = "recompute"
    message_prompt: str = DEFAULT_MESSAGE_PROMPT
    message_tokens: int = 128
    min_message_tokens: int = 0
    critical: bool = False
    max_hops: int | None = None
    cross_engine: CrossEnginePolicy | None = None

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ConfigError(f"unknown handoff mode {self.mode!r}; use one of {', '.join(MODES)}")
        if self.auto_cache_mode not in ("full", "slice"):
            raise ConfigError("auto_cache_mode must be 'full' or 'slice'")
        if self.isolation not in ("recompute", "positions"):
            raise ConfigError(f"isolation={self.isolation!r}: use 'recompute' or 'positions'")
        if not isinstance(self.labels, tuple) or not all(isinstance(x, str) for x in self.labels):
            raise ConfigError(f"labels must be a tuple of span labels, got {self.labels!r}")
        if self.message_tokens < 1 or self.min_message_tokens < 0:
            raise ConfigError("message_tokens must be >= 1 and min_message_tokens >= 0")
        if self.max_hops is not None and self.max_hops < 0:
            raise ConfigError(f"max_hops={self.max_hops}: give 0 or more")
        if self.cross_engine is not None and not isinstance(self.cross_engine, CrossEnginePolicy):
            raise ConfigError("cross_engine must be a c2c.handoff.cross_engine.CrossEnginePolicy, or None")

    @property
    def hop_limit(self) -> int:
        """``max_hops``, else ``C2C_MAX_HOPS``."""
        return settings().max_hops if self.max_hops is None else self.max_hops

    @classmethod
    def build(cls, policy: "HandoffPolicy | None" = None, **overrides: Any) -> "HandoffPolicy":
        """``policy`` (default: the defaults) with ``overrides`` applied; unknown names are a ConfigError."""
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(overrides) - known)
        if unknown:
            raise ConfigError(f"unknown handoff option(s) {unknown}; known: {sorted(known)}")
        if "labels" in overrides and overrides["labels"] is not None:
            overrides["labels"] = tuple(overrides["labels"])
        base = policy or cls()
        return replace(base, **overrides) if overrides else base
