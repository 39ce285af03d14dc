"""Prefill with reuse: bring a held cache up to a rendering, computing only what it lacks.

The held cache (a session's) is cut to the longest common token prefix with the
rendering: the K/V of a prefix depend on that prefix alone, so whatever the
cache and the new conversation share is exact to reuse, and nothing after the
first differing token ever is. A part that comes with its K/V (an attached
commit) is imported, re-positioned if needed, instead of prefilled, and always
whole: reuse stops where the first such part starts, even when the held cache
shares some of its tokens (chat-template tokens, or an earlier attachment's), so
an attached commit's K/V is what the request continues from. Everything else is
prefilled, except the last token, whose logits the generation needs.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from c2c.errors import RuntimeUnsupportedError
from c2c.runtime import placement
from c2c.runtime.pace import ONE_PASS, Pace
from c2c.runtime.protocol import Runtime
from c2c.runtime.kvcache import KVCache
from c2c.conversation import Conversation


@dataclass(frozen=True, kw_only=True)
class Prepared:
    """A cache covering ``rendering[:len(cache)]`` and the tokens still to feed (never empty).

    Attributes:
        reused: tokens taken from the held cache.
        imported: tokens whose K/V came with the rendering (attachments).
        prefilled: tokens prefilled here (``pending`` not included).
        per_part: ``(reused, imported, computed)`` tokens of each part of the rendering, in order;
            computed = prefilled here or pending. Each triple adds up to the part's length.
    """

    cache: KVCache | None
    pending: tuple[int, ...]
    reused: int
    imported: int
    prefilled: int
    per_part: tuple[tuple[int, int, int], ...] = ()

    @property
    def cached(self) -> int:
        """Prompt tokens not computed for this request (OpenAI's ``cached_tokens``)."""
        return self.reused + self.imported


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n


def truncate(cache: KVCache | None, n: int) -> KVCache | None:
    """The first ``n`` tokens of ``cache`` (which starts at 0), or None when there are none or
    a sliding-window layer no longer holds what the cut needs (then nothing is reused)."""
    if cache is None or n <= 0:
        return None
    if n >= cache.seq_len:
        return cache
    try:
        return cache.head(n)
    except RuntimeUnsupportedError:
        return None


def prepare(runtime: Runtime, held: KVCache | None, rendering: Conversation, pace: Pace = ONE_PASS) -> Prepared:
    """Reuse ``held``, import the rendering's K/V parts, prefill the rest but the last token(s).

    What comes before an imported part (a slice's prefix) is prefilled here, at ``pace``: in passes
    of ``pace.chunk`` tokens, the model's turn free to pass on between them."""
    target = rendering.token_ids
    if not target:
        raise ValueError("nothing to prefill")  # render() always yields at least the generation prompt
    n = common_prefix(held.token_ids, target) if held is not None and held.start == 0 else 0
    bounds = rendering.bounds()
    # An attachment's K/V is imported whole: reuse ends where the first one starts. (The prefix's
    # own K/V, which a full cache brings, equals the caller's by the prefix check: reuse wins there.)
    first_kv = min((a for (a, _), p in zip(bounds[1:], rendering.parts[1:]) if p.kv is not None), default=n)
    cache = truncate(held, min(n, first_kv, len(target) - 1))
    reused = cache.seq_len if cache is not None else 0
    covered = reused              # tokens before this are in `cache` or `pending`
    pending: list[int] = []
    imported = prefilled = 0
    per_part = []
    for part, (a, b) in zip(rendering.parts, bounds):
        kept = max(0, min(b, reused) - a)
        if b <= covered:
            per_part.append((kept, 0, 0))
            continue
        if part.kv is not None and a == covered and b < len(target):
            if pending:
                _, cache = pace.prefill(runtime, pending, cache)
                prefilled += len(pending)
                pending = []
            cache = placement.append(runtime, cache, part.kv, at=a)  # the part's K/V at positions [a, b)
            imported += b - a
            per_part.append((0, b - a, 0))
        else:
            pending += target[max(a, covered):b]
            per_part.append((kept, 0, b - max(a, covered)))
        covered = b
    return Prepared(cache=cache, pending=tuple(pending), reused=reused, imported=imported, prefilled=prefilled,
                    per_part=tuple(per_part))


def extend(runtime: Runtime, held: KVCache | None, target: Sequence[int],
           pace: Pace = ONE_PASS) -> tuple[KVCache, int]:
    """``held`` made to cover exactly ``target`` (cut to the common prefix, the rest prefilled at ``pace``).

    Returns the cache and the number of tokens prefilled.
    """
    cache = truncate(held, common_prefix(held.token_ids, target) if held is not None else 0)
    have = cache.seq_len if cache is not None else 0
    if have == len(target):
        return cache, 0
    _, cache = pace.prefill(runtime, list(target[have:]), cache)
    return cache, len(target) - have
