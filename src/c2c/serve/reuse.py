"""Prefill with reuse: bring a held cache up to a rendering, computing only what it lacks.

The held cache (a session's) is cut to the longest common token prefix with the
rendering: the K/V of a prefix depend on that prefix alone, so whatever the
cache and the new conversation share is exact to reuse, and nothing after the
first differing token ever is. A part that comes with its K/V (an attached
commit) is imported, re-positioned if needed, instead of prefilled. Everything
else is prefilled, except the last token, whose logits the generation needs.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from c2c.errors import RuntimeUnsupportedError
from c2c.runtime.engine import Runtime
from c2c.runtime.kvcache import KVCache
from c2c.serve.render import Rendering


@dataclass(frozen=True, kw_only=True)
class Prepared:
    """A cache covering ``rendering[:len(cache)]`` and the tokens still to feed (never empty).

    Attributes:
        reused: tokens taken from the held cache.
        imported: tokens whose K/V came with the rendering (attachments).
        prefilled: tokens prefilled here (``pending`` not included).
    """

    cache: KVCache | None
    pending: tuple[int, ...]
    reused: int
    imported: int
    prefilled: int

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
        return cache.slice(0, n)
    except RuntimeUnsupportedError:
        return None


def prepare(runtime: Runtime, held: KVCache | None, rendering: Rendering) -> Prepared:
    """Reuse ``held``, import the rendering's K/V parts, prefill the rest but the last token(s)."""
    target = rendering.token_ids
    if not target:
        raise ValueError("nothing to prefill")  # render() always yields at least the generation prompt
    n = common_prefix(held.token_ids, target) if held is not None and held.start == 0 else 0
    cache = truncate(held, min(n, len(target) - 1))
    reused = cache.seq_len if cache is not None else 0
    covered = reused              # tokens before this are in `cache` or `pending`
    pending: list[int] = []
    imported = prefilled = 0
    offset = 0
    for part in rendering.parts:
        a, b = offset, offset + len(part.token_ids)
        offset = b
        if b <= covered:
            continue
        if part.kv is not None and a == covered and b < len(target):
            if pending:
                _, cache = runtime.prefill(pending, cache)
                prefilled += len(pending)
                pending = []
            kv = runtime.reposition(part.kv, a)  # (1, H, T, D) per layer, at positions [a, b)
            cache = kv if cache is None else cache.append(kv)
            imported += b - a
        else:
            pending += target[max(a, covered):b]
        covered = b
    return Prepared(cache=cache, pending=tuple(pending), reused=reused, imported=imported, prefilled=prefilled)


def extend(runtime: Runtime, held: KVCache | None, target: Sequence[int]) -> tuple[KVCache, int]:
    """``held`` made to cover exactly ``target`` (cut to the common prefix, the rest prefilled).

    Returns the cache and the number of tokens prefilled.
    """
    cache = truncate(held, common_prefix(held.token_ids, target) if held is not None else 0)
    have = cache.seq_len if cache is not None else 0
    if have == len(target):
        return cache, 0
    _, cache = runtime.prefill(list(target[have:]), cache)
    return cache, len(target) - have
