"""`Context`: an agent's token sequence, cut into labelled spans.

Every agent's context starts with the team's shared prefix, followed by spans
such as its private role prompt, the material it read, its scratch reasoning
and its conclusion. Spans record whether they may leave the agent: only
non-private spans (e.g. ``evidence``, ``conclusion``) are ever exported as a
slice; the role prompt and scratch work never are.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Sequence

from c2c.errors import HandoffError

# Labels private by default: they never leave the agent in a slice.
PRIVATE_LABELS = frozenset({"role", "scratch", "private", "tool-private"})


@dataclass(frozen=True, kw_only=True)
class Interval:
    """``[start, end)``: of tokens (:class:`Span`) or of characters (:class:`c2c.fuser.align.Section`)."""

    start: int
    end: int

    def __post_init__(self) -> None:
        if not 0 <= self.start <= self.end:
            raise ValueError(f"[{self.start}, {self.end}) is not a range: need 0 <= start <= end")

    @property
    def length(self) -> int:
        return self.end - self.start


@dataclass(frozen=True, kw_only=True)
class Span(Interval):
    """Tokens ``[start, end)`` of a context, with a label, the other names it answers to and a privacy flag.

    ``aliases``: e.g. a tool result's call id beside its tool's name (its label), so that a slice can name
    one result of a tool that was called several times.
    """

    label: str
    private: bool
    aliases: tuple[str, ...] = ()

    def named(self, labels: Sequence[str]) -> bool:
        """Whether ``labels`` names this span, by its label or an alias."""
        return self.label in labels or any(a in labels for a in self.aliases)


@dataclass(frozen=True, kw_only=True)
class Context:
    """Token ids of an agent: ``prefix_len`` shared tokens, then labelled spans."""

    token_ids: tuple[int, ...]
    prefix_len: int
    spans: tuple[Span, ...] = ()

    def extend(self, ids: Sequence[int], label: str, *, private: bool | None = None,
               aliases: Sequence[str] = ()) -> "Context":
        """Append ``ids`` as a new span; ``private`` defaults by label (see PRIVATE_LABELS)."""
        is_private = label in PRIVATE_LABELS if private is None else private
        n = len(self.token_ids)
        span = Span(label=label, start=n, end=n + len(ids), private=is_private, aliases=tuple(aliases))
        return replace(self, token_ids=self.token_ids + tuple(ids), spans=self.spans + (span,))

    def without(self, drop: Sequence[int]) -> "Context":
        """This context without the spans at indices ``drop``: later spans move up to close the gaps."""
        gone = set(drop)
        ids, spans = list(self.token_ids[: self.prefix_len]), []
        at = self.prefix_len
        for i, s in enumerate(self.spans):
            if s.start > at:  # tokens between spans (none in an agent's context) stay
                ids += self.token_ids[at: s.start]
            at = s.end
            if i in gone:
                continue
            spans.append(replace(s, start=len(ids), end=len(ids) + s.length))
            ids += self.token_ids[s.start: s.end]
        ids += self.token_ids[at:]
        return replace(self, token_ids=tuple(ids), spans=tuple(spans))

    def spans_labelled(self, *labels: str) -> tuple[Span, ...]:
        return tuple(s for s in self.spans if s.named(labels))

    def export_range(self, labels: Sequence[str]) -> tuple[int, int]:
        """The one contiguous token range covering the spans with ``labels``.

        Raises:
            HandoffError: no such span, the spans are not contiguous, or a private
                span lies between them (it would leak).
        """
        chosen = [s for s in self.spans if s.named(labels)]
        if not chosen:
            raise HandoffError(f"no span labelled {list(labels)}; this context has {[s.label for s in self.spans]}")
        start, end = min(s.start for s in chosen), max(s.end for s in chosen)
        for s in self.spans:
            if s.start < end and s.end > start and s not in chosen:
                raise HandoffError(
                    f"span {s.label!r} [{s.start}:{s.end}) lies inside the export range [{start}:{end}); "
                    "export contiguous spans only"
                )
            if s.private and s in chosen:
                raise HandoffError(f"span {s.label!r} is private and may not be exported")
        return start, end
