"""Isolation: cross-domain handoffs go by text; private spans are never exported."""

import pytest
import torch

from c2c.context import Context
from c2c.errors import ConfigError, HandoffError
from c2c.trust.isolation import (
    domain_rule,
    exportable_ranges,
    exported_tokens,
    minimize,
    private_positions,
    recompute_clean,
    require_exportable,
)


def test_cross_domain_is_always_text():
    same = domain_rule("lab", "lab")
    assert same.transport == "cache" and same.allows_cache and "lab" in same.reason
    for s, r in (("lab", "ops"), ("ops", "lab"), (None, "lab"), ("lab", None), ("", "")):
        d = domain_rule(s, r)
        assert d.transport == "text" and not d.allows_cache and d.reason


def agent_context(n_prefix=6):
    ctx = Context(token_ids=tuple(range(1, n_prefix + 1)), prefix_len=n_prefix)
    ctx = ctx.extend([11, 12, 13], "role")                 # private by label
    ctx = ctx.extend([21, 22, 23, 24], "evidence")
    ctx = ctx.extend([31, 32], "scratch")                  # private by label
    ctx = ctx.extend([41, 42, 43], "tool", private=True)   # tool output marked private
    ctx = ctx.extend([51, 52], "tool-public", private=False)
    ctx = ctx.extend([61, 62, 63], "conclusion")
    return ctx


def test_exportable_ranges_exclude_private_spans_and_the_prefix():
    ctx = agent_context()
    ranges = exportable_ranges(ctx)
    assert ranges == ((9, 13), (18, 23))  # evidence; tool-public + conclusion merged
    private = private_positions(ctx)
    exported = {p for a, b in ranges for p in range(a, b)}
    assert not exported & private and min(exported) >= ctx.prefix_len
    assert exported_tokens(ctx) == (21, 22, 23, 24, 51, 52, 61, 62, 63)
    assert not set(exported_tokens(ctx)) & {11, 12, 13, 31, 32, 41, 42, 43}
    assert exportable_ranges(ctx, ["conclusion"]) == ((20, 23),)


def test_asking_for_private_spans_is_refused():
    ctx = agent_context()
    with pytest.raises(HandoffError, match="private"):
        exportable_ranges(ctx, ["conclusion", "scratch"])
    with pytest.raises(HandoffError, match="no exportable"):
        exportable_ranges(Context(token_ids=(1, 2), prefix_len=2).extend([3], "role"))
    with pytest.raises(HandoffError, match="role"):
        require_exportable(ctx, 0, len(ctx.token_ids))  # a full cache would leak
    require_exportable(ctx, 18, 23)


def test_minimize_slices_keep_positions_and_drop_private_tokens(qwen):
    prefix = qwen.encode("shared system prompt")
    ctx = Context(token_ids=tuple(prefix), prefix_len=len(prefix))
    ctx = ctx.extend(qwen.encode(" secret role"), "role")
    ctx = ctx.extend(qwen.encode(" the evidence"), "evidence")
    ctx = ctx.extend(qwen.encode(" private thoughts"), "scratch")
    ctx = ctx.extend(qwen.encode(" the answer"), "conclusion")
    _, cache = qwen.prefill(list(ctx.token_ids))
    parts = minimize(cache, ctx)
    private = private_positions(ctx)
    assert len(parts) == 2
    for part, (a, b) in zip(parts, exportable_ranges(ctx)):
        assert (part.start, part.end) == (a, b) and part.token_ids == ctx.token_ids[a:b]
        assert not set(range(part.start, part.end)) & private
    with pytest.raises(ConfigError):
        minimize(cache.slice(0, 5), ctx)

    # the naive slice still attended to the private spans; the clean one did not
    _, pcache = qwen.prefill(list(prefix))
    clean = recompute_clean(qwen, ctx, pcache)
    assert clean.start == ctx.prefix_len and clean.token_ids == exported_tokens(ctx)
    _, ref = qwen.prefill(list(prefix) + list(exported_tokens(ctx)))
    assert clean.max_abs_diff(ref.slice(ctx.prefix_len, ref.end)) < 1e-5
    naive = parts[1]  # conclusion, at its original positions after private spans
    again = qwen.reposition(naive, clean.end - naive.seq_len)
    assert (again.values[-1] - clean.slice(clean.end - naive.seq_len, clean.end).values[-1]).abs().max() > 1e-3
    assert torch.equal(torch.tensor(clean.token_ids[-naive.seq_len:]), torch.tensor(naive.token_ids))


def test_a_span_is_named_by_its_label_or_an_alias_and_a_private_one_stays_private_by_either():
    ctx = (Context(token_ids=(1, 2), prefix_len=2).extend([3, 4], "get_weather", aliases=["call_1"])
           .extend([5, 6, 7], "get_weather", aliases=["call_2"]).extend([8], "scratch", aliases=["call_3"]))
    assert ctx.export_range(["call_2"]) == (4, 7)                 # one result of a tool called twice
    assert ctx.export_range(["get_weather"]) == (2, 7)            # every result of the tool
    assert [s.aliases for s in ctx.spans_labelled("call_1", "call_2")] == [("call_1",), ("call_2",)]
    with pytest.raises(HandoffError, match="private"):
        ctx.export_range(["call_3"])
    assert ctx.without([0]).export_range(["call_2"]) == (2, 5)    # the alias moves with its span
