"""Edit a conversation's cache without a prefill: drop token spans, re-position what follows, repair.

A tool-using agent's context grows with every tool response; its framework keeps it
bounded by deleting old messages. Re-prefilling everything after the first deleted
message costs more the longer the agent runs. Instead, :func:`drop` takes the K/V of
the dropped spans out of the cache and keeps everyone else's:

- ``reposition=True`` re-rotates the keys after each gap (:meth:`Runtime.reposition`)
  so positions are contiguous again (:func:`close_gaps`); ``False`` leaves the gaps
  open (:attr:`KVCache.gaps`): the next tokens go after the last position used, and a
  later drop with ``reposition=True`` closes every gap at once;
- a :class:`Repair` recomputes some of the tokens after the gaps through the whole
  model (:func:`c2c.runtime.repair.recompute`): none, the first ``K`` after each gap,
  or the ``R`` share that deviates most from a probe (:func:`c2c.runtime.repair.deviation`).

The tokens after a gap attended, when they were computed, to what is now dropped, so the
result is *not* what a prefill of the kept tokens gives (unless everything after the
first gap is recomputed): the cache carries an :class:`~c2c.runtime.kvcache.Edits`
record and is never called exact (:attr:`KVCache.exact`).

Spans are token indices ``[a, b)`` into the cache. Token 0 is never dropped (a
continuation starts at position 0), and every layer must attend to the whole context
(a sliding-window layer no longer holds what closing a gap needs).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Sequence

import torch

from c2c.errors import ConfigError, RuntimeUnsupportedError
from c2c.runtime.kvcache import EditStep, Edits, KVCache
from c2c.runtime.pace import ONE_PASS, Pace
from c2c.runtime.protocol import Runtime
from c2c.runtime.repair import deviation, recompute

REPAIR_KINDS = ("none", "first", "ratio")


@dataclass(frozen=True)
class Repair:
    """How much of what follows the gaps is recomputed: ``none``, ``first:K`` (the first ``K`` tokens after
    each gap) or ``ratio:R`` (the ``R`` share, 0..1, of all tokens after the first gap that deviate most)."""

    kind: str = "none"
    amount: float = 0

    @classmethod
    def parse(cls, text: "str | Repair | None") -> "Repair":
        """``"none"``, ``"first:16"`` or ``"ratio:0.2"`` as a :class:`Repair`; :class:`ConfigError` otherwise."""
        if isinstance(text, Repair):
            return text
        if text is None or text == "none":
            return cls()
        kind, _, amount = str(text).partition(":")
        try:
            value = float(amount)
        except ValueError:
            value = math.nan
        if kind == "first" and value.is_integer() and 0 < value <= 1 << 20:
            return cls("first", int(value))
        if kind == "ratio" and 0 < value <= 1:
            return cls("ratio", value)
        raise ConfigError(f"repair {str(text)[:40]!r} is not one of 'none', 'first:K' (K a positive whole number "
                          "of tokens) or 'ratio:R' (0 < R <= 1)")

    def __str__(self) -> str:
        """The level as :meth:`parse` reads it back, to the same value (``first:1048576``, ``ratio:0.25``):
        it is signed into a commit's edit record."""
        if self.kind == "none":
            return "none"
        amount = float(self.amount)
        return f"{self.kind}:{int(amount) if amount.is_integer() else repr(amount)}"


def drop(runtime: Runtime, cache: KVCache, spans: Sequence[tuple[int, int]], *, reposition: bool = True,
         repair: "Repair | str | None" = None, probe_layers: int = 2,
         pace: Pace = ONE_PASS) -> tuple[KVCache, EditStep]:
    """``cache`` without the tokens of ``spans`` (index ranges ``[a, b)``), and the record of the edit.

    A repair's forward passes (its probe and its recompute) run at ``pace``: a server cuts them into
    passes of its prefill chunk, so that another tenant's request goes between them.

    Raises:
        ConfigError: a span out of range, overlapping or covering token 0; a repair without
            ``reposition`` (a repair recomputes tokens at their closed positions).
        RuntimeUnsupportedError: the model has sliding-window layers, or the runtime cannot re-position.
    """
    how = Repair.parse(repair)
    spans = _check_spans(cache, spans)
    if how.kind != "none" and not reposition:
        raise ConfigError("a repair recomputes tokens at their re-positioned places: ask for reposition too, "
                          "or drop without a repair")
    if any(w is not None for w in cache.windows):
        raise RuntimeUnsupportedError(f"{runtime.name} has sliding-window layers, which no longer hold what a "
                                      "dropped message's neighbours need; re-prefill from text instead")
    record = tuple((cache.position_of(a), cache.position_of(b - 1) + 1) for a, b in spans)
    src = replace(cache, edits=None)                            # the record is set once, at the end
    kept = _complement(spans, cache.seq_len)                    # index runs [a, b) that stay
    out = src.take(*kept[0])
    for a, b in kept[1:]:
        out = out.append(src.take(a, b), gap_ok=True)         # original positions: a gap where each span was
    moved = recomputed = 0
    if reposition:
        out, moved = close_gaps(runtime, out)
    if how.kind != "none" and spans[0][0] < out.seq_len:
        out, recomputed = _repair(runtime, out, spans, how, probe_layers, pace)
    step = EditStep(dropped=record, repositioned=moved, recomputed=recomputed, repair=str(how),
                    tokens=sum(b - a for a, b in spans))
    edits = (cache.edits or Edits()).plus(Edits(steps=(step,)))
    if reposition and cache.gaps:  # gaps left open before moved too: the record's positions no longer bound them
        edits = edits.moved(min(spans[0][0], cache.gaps[0][0]))
    return replace(out, edits=edits), step


def close_gaps(runtime: Runtime, cache: KVCache) -> tuple[KVCache, int]:
    """``cache`` with every position gap closed: each run of tokens after a gap re-positioned to follow the
    one before. Returns the cache and how many tokens moved."""
    if not cache.gaps:
        return cache, 0
    bounds = [0] + [i for i, _ in cache.gaps] + [cache.seq_len]
    out, moved = cache.take(bounds[0], bounds[1]), 0
    for a, b in zip(bounds[1:], bounds[2:]):
        run = cache.take(a, b)                                  # contiguous positions, no gaps inside
        out = out.append(runtime.reposition(replace(run, edits=None), out.end))
        moved += b - a
    edits = cache.edits.moved(cache.start + cache.gaps[0][0], moved) if cache.edits is not None else None
    return replace(out, gaps=(), edits=edits), moved


def _repair(runtime: Runtime, cache: KVCache, spans: list[tuple[int, int]], how: Repair,
            probe_layers: int, pace: Pace) -> tuple[KVCache, int]:
    """Recompute per ``how`` among the tokens after the first gap of a re-positioned ``cache``."""
    g = spans[0][0]                                             # the first token after the first gap, by index
    head, piece = cache.take(0, g), cache.take(g, cache.seq_len)
    if how.kind == "first":
        starts, removed = [], 0                                 # each gap's index in the edited cache, from g
        for a, b in spans:
            starts.append(a - removed - g)
            removed += b - a
        chosen = sorted({i for s in starts for i in range(s, min(s + int(how.amount), piece.seq_len))})
    elif math.ceil(how.amount * piece.seq_len) >= piece.seq_len:
        chosen = list(range(piece.seq_len))                     # all of it: no probe needed to rank them
    else:
        dev = deviation(runtime, head, piece, probe_layers, pace)   # (n,)
        k = math.ceil(how.amount * piece.seq_len)
        chosen = sorted(torch.topk(dev, k).indices.tolist())
    return recompute(runtime, head, piece, chosen, pace), len(chosen)


def _check_spans(cache: KVCache, spans: Sequence[tuple[int, int]]) -> list[tuple[int, int]]:
    if cache.start != 0:
        raise ConfigError("only a cache that starts at position 0 (a conversation's) can be edited")
    out = sorted((int(a), int(b)) for a, b in spans)
    if not out:
        raise ConfigError("nothing to drop: give at least one span")
    for (a, b), nxt in zip(out, out[1:] + [(cache.seq_len, cache.seq_len)]):
        if not 0 < a < b <= cache.seq_len:
            raise ConfigError(f"span [{a}:{b}) is outside tokens 1..{cache.seq_len - 1} (token 0 stays)")
        if b > nxt[0]:
            raise ConfigError(f"spans [{a}:{b}) and [{nxt[0]}:{nxt[1]}) overlap")
    return out


def _complement(spans: list[tuple[int, int]], n: int) -> list[tuple[int, int]]:
    kept, at = [], 0
    for a, b in spans:
        if a > at:
            kept.append((at, a))
        at = b
    if at < n:
        kept.append((at, n))
    return kept
