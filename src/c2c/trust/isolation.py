"""Isolation: caches stay inside one trust domain, and only what may leave is exported.

Two rules:

1. **Across trust domains, always text.** K/V carry the semantics of every
   token that made them and can be inverted; a cache also skips the sender's
   output-side safety filtering. :func:`domain_rule` returns the transport the
   domains allow and the reason; :func:`c2c.decide` (the one decision of a hop)
   applies it as its ``domain`` check.
2. **Minimization.** Only non-private spans of a :class:`~c2c.context.Context`
   are exported (:func:`exportable_ranges`). Private spans (role prompt, scratch
   reasoning, tool output marked private) never leave.

Two ways to cut a slice (``Agent.export(isolation=...)``):

``"positions"`` (:func:`minimize`)
    Slice the sender's cache to the exportable ranges. It removes the private
    *positions*, but the K/V of an exported token at layers above 0 were
    computed while attending to everything before it, private spans included,
    so they still carry some of that information (it leaks through attention).
    The receiver cannot verify such a slice beyond layer 0 either: it does not
    hold the positions the slice was computed after.
``"recompute"`` (:func:`recompute_after`, :func:`recompute_clean`)
    Re-prefill the exported tokens after the shared prefix only, at the cost of
    one prefill of the exported tokens. The slice sits at positions
    ``[prefix_len, prefix_len + n)``, carries no trace of the private spans in
    any layer, and every receiver holds the context it follows (its own
    shared-prefix cache), so it can be verified at every layer. The default
    whenever a private span precedes the slice.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Literal, Sequence

from c2c.context import Context
from c2c.errors import ConfigError, HandoffError
from c2c.runtime.kvcache import KVCache
from c2c.runtime.pace import ONE_PASS, Pace
from c2c.trust.keys import check_domain

Transport = Literal["cache", "text"]
Isolation = Literal["recompute", "positions"]
ISOLATIONS: tuple[str, ...] = ("recompute", "positions")


@dataclass(frozen=True, kw_only=True)
class IsolationDecision:
    """The transport a handoff must use, and why (the handoff records ``reason``)."""

    transport: Transport
    reason: str

    @property
    def allows_cache(self) -> bool:
        return self.transport == "cache"


def domain_rule(sender_domain: str | None, receiver_domain: str | None,
                shared_with: Sequence[str] = ()) -> IsolationDecision:
    """``cache`` only when both agents are in the same, named trust domain, or when the sender's
    domain shared this context with the receiver's (``shared_with``: the domains named by the
    sender's signed share list); else ``text``."""
    if not sender_domain or not receiver_domain:
        who = "sender" if not sender_domain else "receiver"
        return IsolationDecision(transport="text", reason=f"the {who} has no trust domain; caches need one")
    if sender_domain != receiver_domain and receiver_domain in shared_with:
        return IsolationDecision(transport="cache", reason=f"shared by its publisher with {receiver_domain!r}")
    if sender_domain != receiver_domain:
        return IsolationDecision(
            transport="text",
            reason=f"crosses trust domains ({sender_domain!r} -> {receiver_domain!r}); caches never leave a domain")
    return IsolationDecision(transport="cache", reason=f"same trust domain {sender_domain!r}")


# ------------------------------------------------------------ minimization
def private_positions(ctx: Context) -> frozenset[int]:
    """Absolute positions of every private span of ``ctx``."""
    return frozenset(p for s in ctx.spans if s.private for p in range(s.start, s.end))


def exportable_ranges(ctx: Context, labels: Sequence[str] | None = None) -> tuple[tuple[int, int], ...]:
    """Token ranges ``[start, end)`` that may leave the agent, adjacent ones merged.

    The shared prefix is never included (the receiver has its own). With
    ``labels``, only spans with those labels are considered.

    Raises:
        HandoffError: a label asked for belongs to a private span, or nothing is exportable.
    """
    if labels is not None:
        asked = set(labels)
        leaking = sorted({s.label for s in ctx.spans if s.private and s.label in asked})
        if leaking:
            raise HandoffError(f"spans {leaking} are private and are never exported")
    chosen = [s for s in ctx.spans if not s.private and s.length > 0 and s.start >= ctx.prefix_len
              and (labels is None or s.label in labels)]
    if not chosen:
        raise HandoffError(f"no exportable span{' labelled ' + str(list(labels)) if labels else ''}; this "
                           f"context has {[(s.label, 'private' if s.private else 'public') for s in ctx.spans]}")
    out: list[list[int]] = []
    for s in sorted(chosen, key=lambda s: s.start):
        if out and out[-1][1] == s.start:
            out[-1][1] = s.end
        else:
            out.append([s.start, s.end])
    private = private_positions(ctx)
    for a, b in out:  # defence in depth: overlapping spans must not leak
        if any(p in private for p in range(a, b)):
            raise HandoffError(f"range [{a}:{b}) overlaps a private span; spans must not overlap")
    return tuple((a, b) for a, b in out)


def require_exportable(ctx: Context, start: int, end: int) -> None:
    """Raise :class:`HandoffError` if ``[start, end)`` holds any private position.

    Call it before exporting a full cache (``start == 0``) or any slice.
    """
    hit = sorted(s.label for s in ctx.spans if s.private and s.start < end and s.end > start)
    if hit:
        raise HandoffError(f"positions [{start}:{end}) include private spans {hit}; export only "
                           "exportable_ranges(ctx), or hand off by text")


#: the most trust domains one commit may be shared with
MAX_SHARE = 16


def check_share(share: Sequence[str] | None, *, field: str = "publish share") -> tuple[str, ...]:
    """``share`` (the other trust domains a commit is granted to) checked and sorted, duplicates gone: the one
    rule of every front-end that publishes.

    Raises:
        ConfigError: not a list of at most :data:`MAX_SHARE` valid domain names; the message names ``field``.
    """
    if share is None:
        return ()
    if isinstance(share, (str, bytes)) or not isinstance(share, Sequence) or len(share) > MAX_SHARE:
        raise ConfigError(f"{field} must be a list of at most {MAX_SHARE} trust domains")
    try:
        return tuple(sorted({check_domain(d) for d in share}))
    except ConfigError as e:
        raise ConfigError(f"{field}: {e}") from None


def minimize(cache: KVCache, ctx: Context, labels: Sequence[str] | None = None) -> tuple[KVCache, ...]:
    """Slices of the sender's ``cache`` at :func:`exportable_ranges`, at their original positions."""
    if cache.start != 0 or cache.token_ids[: len(ctx.token_ids)] != ctx.token_ids:
        raise ConfigError("the cache does not hold this context's tokens from position 0")
    return tuple(cache.slice(a, b) for a, b in exportable_ranges(ctx, labels))


def exported_tokens(ctx: Context, labels: Sequence[str] | None = None) -> tuple[int, ...]:
    """The token ids of :func:`exportable_ranges`, concatenated in order."""
    return tuple(t for a, b in exportable_ranges(ctx, labels) for t in ctx.token_ids[a:b])


def recompute_after(runtime, prefix_cache: KVCache, ids: Sequence[int], pace: Pace = ONE_PASS) -> KVCache:
    """K/V of ``ids`` computed after ``prefix_cache`` (the shared prefix) and nothing else.

    Returns a slice at positions ``[prefix_cache.end, prefix_cache.end + len(ids))``,
    layout ``[1, kv_heads, seq_len, head_dim]`` per layer. Costs one prefill of ``ids``, at ``pace``.
    """
    if prefix_cache.start != 0:
        raise ConfigError("prefix_cache must start at position 0 (the shared prefix)")
    if not ids:
        raise HandoffError("nothing to recompute: the slice holds no token")
    _, full = pace.prefill(runtime, list(ids), prefix_cache)
    return full.slice(prefix_cache.end, full.end)


def recompute_clean(runtime, ctx: Context, prefix_cache: KVCache, labels: Sequence[str] | None = None) -> KVCache:
    """The exported tokens' K/V computed after the shared prefix *only*.

    Returns a slice at positions ``[prefix_len, prefix_len + n)``: the exported
    tokens packed right after the prefix, with no trace of private spans in any
    layer. Costs one prefill of ``n`` tokens.
    """
    if prefix_cache.start != 0 or prefix_cache.token_ids != ctx.token_ids[: ctx.prefix_len]:
        raise ConfigError("prefix_cache must be the cache of exactly this context's shared prefix")
    return recompute_after(runtime, prefix_cache, exported_tokens(ctx, labels))


def cut_slice(runtime, cache: KVCache, ctx: Context, labels: Sequence[str], *, isolation: str | None,
              prefix_cache: KVCache | Callable[[], KVCache], pace: Pace = ONE_PASS) -> tuple[KVCache, str, bool]:
    """The slice of ``cache`` covering the spans ``labels``, cut as ``isolation`` says: the one cut of every
    front-end (``Agent.export``, ``c2c serve``'s labelled publish).

    Args:
        cache: the sender's cache of ``ctx``'s tokens (the last generated token may have no K/V yet).
        isolation: ``"recompute"`` (re-prefilled after the shared prefix alone, when anything lies between
            them), ``"positions"`` (the sender's K/V at their positions), or None: ``"recompute"`` when a
            private span precedes the slice, else ``"positions"``.
        prefix_cache: the sender's K/V of the shared prefix (``[0, prefix_len)``), or a callable that gives
            it, called only when a recompute needs it.
        pace: the passes a recompute runs in (a server's prefill chunk, its turn free to pass between them).

    Returns:
        (the slice, the isolation used, whether it was re-prefilled: one prefill of its tokens).

    Raises:
        HandoffError: no such spans, or a private span between them. ConfigError: an unknown ``isolation``.
    """
    if isolation is not None and isolation not in ISOLATIONS:
        raise ConfigError(f"isolation={isolation!r}: use 'recompute' or 'positions'")
    start, end = ctx.export_range(labels)
    end = min(end, cache.end)  # the last generated token has no K/V yet
    P = ctx.prefix_len
    if isolation is None:
        isolation = "recompute" if any(s.private and s.start < start for s in ctx.spans) else "positions"
    if isolation == "recompute" and start > P:  # no trace of what lies between the prefix and the slice
        ids = ctx.token_ids[start:end]
        if P == 0:
            return pace.prefill(runtime, list(ids), None)[1], isolation, True
        prefix = prefix_cache() if callable(prefix_cache) else prefix_cache
        return recompute_after(runtime, prefix, ids, pace), isolation, True
    return cache.slice(start, end), isolation, False
