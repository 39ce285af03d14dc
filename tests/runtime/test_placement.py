"""The one placement rule (c2c.runtime.placement): continued on its own tokens, or appended re-positioned."""

import pytest

from c2c.errors import HandoffError
from c2c.runtime import placement


@pytest.fixture(scope="module")
def rt(tiny):
    return tiny("qwen2")


def parts(rt):
    prefix = rt.encode("System: you are terse.")
    one = rt.encode(" Analyst: the vault code is 4471.")
    two = rt.encode(" Writer: noted, filed by Ada.")
    return prefix, one, two


def test_a_full_cache_splits_into_its_prefix_and_its_body_at_their_own_positions(rt):
    prefix, one, two = parts(rt)
    _, cache = rt.prefill(prefix + one + two)
    got = placement.split(cache, full=True, prefix_ids=prefix)
    assert got.prefix.token_ids == tuple(prefix) and got.prefix.start == 0
    assert got.body.token_ids == tuple(one + two) and got.body.start == len(prefix)
    assert got.prefix.append(got.body).max_abs_diff(cache) == 0
    only = placement.split(got.prefix, full=True, prefix_ids=prefix)
    assert only.body is None and only.prefix.token_ids == tuple(prefix)
    sliced = placement.split(got.body, full=False, prefix_ids=prefix)   # a slice is all body, as it was cut
    assert sliced.prefix is None and sliced.body is got.body


def test_a_full_cache_of_another_prefix_is_refused_by_name(rt):
    prefix, one, two = parts(rt)
    _, cache = rt.prefill(prefix + one)
    with pytest.raises(HandoffError, match="does not start with the receiver's"):
        placement.split(cache, full=True, prefix_ids=rt.encode("System: you are verbose."))
    with pytest.raises(HandoffError, match="does not start with the receiver's"):
        placement.require_continues(cache.slice(len(prefix), cache.end), prefix)   # not from position 0


def test_appending_re_positions_a_slice_to_follow_what_the_receiver_holds(rt):
    prefix, one, two = parts(rt)
    _, sender = rt.prefill(prefix + one + two)
    piece = sender.slice(len(prefix) + len(one), sender.end)   # `two`, at the sender's positions
    _, held = rt.prefill(prefix)
    out = placement.append(rt, held, piece, at=held.end)
    assert out.token_ids == tuple(prefix + two) and out.start == 0 and out.end == len(prefix + two)
    assert out.head(len(prefix)).max_abs_diff(held) == 0
    # the same keys a direct re-position gives: one rule, whoever calls it
    assert out.slice(len(prefix), out.end).max_abs_diff(rt.reposition(piece, len(prefix))) == 0
    alone = placement.append(rt, None, piece, at=0)
    assert alone.start == 0 and alone.token_ids == tuple(two)


def test_laying_a_body_on_spans_keeps_every_token_at_its_own_position(rt):
    prefix, one, two = parts(rt)
    _, cache = rt.prefill(prefix + one + two)
    body = placement.split(cache, full=True, prefix_ids=prefix).body
    laid = placement.lay(body, [one, two])
    assert [c.token_ids for c in laid] == [tuple(one), tuple(two)]
    assert [c.start for c in laid] == [len(prefix), len(prefix) + len(one)]
    assert laid[0].append(laid[1]).max_abs_diff(body) == 0
    with pytest.raises(HandoffError, match="not its tokens"):
        placement.lay(body, [two, one])


def test_laying_gives_none_where_a_sliding_window_layer_no_longer_holds_a_span(tiny):
    rt = tiny("gemma3")   # sliding-window layers
    window = min(w for w in rt.facts.windows if w is not None)
    first = rt.encode("System: hi." + " x" * (window + 4))
    last = rt.encode(" The end.")
    _, cache = rt.prefill(first + last)
    body = placement.split(cache, full=True, prefix_ids=()).body   # no shared prefix: its K/V would be gone too
    assert placement.lay(body, [first, last]) is None
    assert placement.lay(body, [first + last]) is not None   # one span ending at the cache's end: held
