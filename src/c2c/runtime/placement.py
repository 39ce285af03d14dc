"""Placing received K/V in a receiver's sequence: the one rule the library's ``Agent`` and ``c2c serve`` share.

A receiver's sequence is ``[shared prefix: P tokens][what it holds after it ...]``. A received
cache (a commit's, or a fused or mapped one) goes into it in one of two ways:

- **continued.** A full cache starts at position 0 with the receiver's shared prefix: it is the
  conversation the receiver goes on from. Its K/V stay on the very tokens, at the very positions,
  they were computed for; nothing is re-rotated. :func:`lay` cuts them per span of the receiver's
  sequence: one span for :meth:`c2c.team.agent.Agent.adopt`, one per message for a ``c2c serve``
  request whose messages begin with a commit's conversation (:func:`c2c.conversation.render.continuation`).
- **appended.** A slice, or a full cache's body placed as a block of its own, follows what the
  receiver holds: :func:`append` re-positions it (RoPE) to start where the receiver's sequence
  ends, at ``at``.

:func:`split` takes a received cache apart first: a full cache into its shared prefix's K/V (equal
to the receiver's, by the prefix check) and its body; a slice is all body.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from c2c.errors import C2CError, HandoffError
from c2c.runtime.kvcache import KVCache
from c2c.runtime.protocol import Runtime


@dataclass(frozen=True)
class Received:
    """A received cache taken apart for placing (:func:`split`)."""

    prefix: KVCache | None   # a full cache's K/V of the shared prefix, (1, H, P, D) per layer; None: a slice, or P = 0
    body: KVCache | None     # what follows it, (1, H, n, D) per layer (a slice: at the positions it was cut at)


def split(cache: KVCache, *, full: bool, prefix_ids: Sequence[int]) -> Received:
    """``cache`` as its shared prefix's K/V and its body.

    Raises:
        HandoffError: a full cache that does not start at position 0 with ``prefix_ids``.
    """
    if not full:
        return Received(prefix=None, body=cache)
    require_continues(cache, prefix_ids)
    P = len(prefix_ids)
    return Received(prefix=cache.slice(0, P) if P else None,
                    body=cache.slice(P, cache.end) if cache.end > P else None)


def require_continues(cache: KVCache, prefix_ids: Sequence[int]) -> None:
    """A full cache is continued from the receiver's shared prefix: it must start at 0 with ``prefix_ids``.

    Raises:
        HandoffError: it does not.
    """
    P = len(prefix_ids)
    if cache.start != 0 or tuple(cache.token_ids[:P]) != tuple(prefix_ids):
        raise HandoffError("a full cache is continued from its shared prefix, and this one does not start with "
                           "the receiver's: attach it as a slice, or give the receiver the sender's system prompt")


def append(runtime: Runtime, held: KVCache | None, kv: KVCache, *, at: int) -> KVCache:
    """``held`` followed by ``kv`` re-positioned to start at position ``at`` (``held``'s next)."""
    moved = runtime.reposition(kv, at)   # (1, H, T, D) per layer, at positions [at, at + T)
    return moved if held is None else held.append(moved)


def lay(body: KVCache, spans: Sequence[Sequence[int]]) -> tuple[KVCache, ...] | None:
    """A full cache's body cut per span of the receiver's sequence, at its own positions.

    ``spans`` are the token runs that follow the receiver's prefix; together they must be exactly
    the body's tokens, in order. Returns one cache per span, or None where a sliding-window layer
    no longer holds a span (the receiver then prefills those tokens as sent).

    Raises:
        HandoffError: the spans' tokens are not the body's.
    """
    if tuple(t for s in spans for t in s) != tuple(body.token_ids):
        raise HandoffError("the spans to lay a cache on are not its tokens")
    out, at = [], body.start
    for s in spans:
        try:
            out.append(body.slice(at, at + len(s)))   # (1, H, len(s), D) per layer
        except C2CError:
            return None
        at += len(s)
    return tuple(out)
