"""Cache edits: dropping spans, with and without closing the gaps, and the three repair levels."""

import pytest
import torch

from c2c.errors import ConfigError, IncompatibleCacheError, RuntimeUnsupportedError
from c2c.runtime.edit import Repair, close_gaps, drop


def conversation(rt):
    a = rt.encode("System: you are terse.")
    b = rt.encode(" Tool output one: the vault code is 4471, filed by Ada.")
    c = rt.encode(" Tool output two: the ferry leaves at noon from pier 9.")
    d = rt.encode(" User: when does the ferry leave?")
    return a, b, c, d


@pytest.fixture(scope="module")
def rt(tiny):
    return tiny("qwen2")


def test_drop_with_full_repair_equals_a_prefill_of_the_kept_tokens(rt):
    a, b, c, d = conversation(rt)
    _, cache = rt.prefill(a + b + c + d)
    edited, step = drop(rt, cache, [(len(a), len(a) + len(b))], reposition=True, repair="ratio:1")
    _, truth = rt.prefill(a + c + d)
    assert edited.token_ids == truth.token_ids and edited.end == truth.end and not edited.gaps
    assert edited.max_abs_diff(truth) < 1e-4
    assert not edited.exact and edited.edits.dropped == len(b) == step.dropped_tokens
    assert step.repositioned == len(c + d) and step.recomputed == len(c + d)
    assert step.dropped == ((len(a), len(a) + len(b)),)


def test_reposition_alone_is_approximate_and_first_k_repairs_the_first_tokens(rt):
    a, b, c, d = conversation(rt)
    _, cache = rt.prefill(a + b + c + d)
    _, truth = rt.prefill(a + c + d)
    plain, step = drop(rt, cache, [(len(a), len(a) + len(b))])
    assert step.recomputed == 0 and plain.max_abs_diff(truth) > 1e-3        # the rest attended to the dropped
    # the kept head is untouched; the moved tail differs from a prefill only by what it attended to
    assert plain.take(0, len(a)).max_abs_diff(truth.take(0, len(a))) == 0.0
    first, step = drop(rt, cache, [(len(a), len(a) + len(b))], repair="first:4")
    assert step.recomputed == 4 and step.repair == "first:4"
    g = len(a)
    # the recomputed tokens see the same context as a prefill's (the head plus earlier recomputed ones)
    assert first.take(g, g + 4).max_abs_diff(truth.take(g, g + 4)) < 1e-4
    assert plain.take(g, g + 4).max_abs_diff(truth.take(g, g + 4)) > 1e-3


def test_ratio_repair_recomputes_that_share_and_gets_closer(rt):
    a, b, c, d = conversation(rt)
    _, cache = rt.prefill(a + b + c + d)
    _, truth = rt.prefill(a + c + d)
    errs = []
    for r in ("none", "ratio:0.5", "ratio:1"):
        out, step = drop(rt, cache, [(len(a), len(a) + len(b))], repair=r)
        errs.append(out.max_abs_diff(truth))
    assert errs[2] < 1e-4 < errs[0] and errs[1] <= errs[0]


def test_drop_without_reposition_leaves_a_gap_and_continues_after_the_last_position(rt):
    a, b, c, d = conversation(rt)
    _, cache = rt.prefill(a + b + c)
    edited, step = drop(rt, cache, [(len(a), len(a) + len(b))], reposition=False)
    assert edited.gaps == ((len(a), len(b)),) and edited.end == cache.end and step.repositioned == 0
    assert edited.position_of(len(a)) == len(a) + len(b) and not edited.exact
    # the kept K/V are exactly the original ones (nothing moved)
    assert edited.take(len(a), edited.seq_len).keys[0].equal(cache.keys[0][:, :, len(a) + len(b):])
    logits, grown = rt.prefill(d, edited)
    assert grown.gaps == edited.gaps and grown.end == cache.end + len(d) and grown.edits == edited.edits
    # a later drop with reposition closes the old gap too, and the positions are contiguous again
    closed, _ = close_gaps(rt, grown)
    assert not closed.gaps and closed.end == closed.seq_len
    moved = rt.reposition(grown.take(len(a), grown.seq_len), len(a))
    assert closed.take(len(a), closed.seq_len).max_abs_diff(moved) < 1e-5
    # the new tokens went to positions cache.end... (layer 0's keys depend on token and position alone)
    k0, _ = rt.probe_layer0(d, cache.end)                    # (1, H, len(d), D)
    assert torch.allclose(grown.keys[0][:, :, -len(d):], k0, atol=1e-5)
    k_wrong, _ = rt.probe_layer0(d, edited.seq_len)
    assert not torch.allclose(k_wrong, k0, atol=1e-3)
    # scoring after a gapped cache uses the same positions as prefilling after it
    scored = rt.logits(d, edited)[-1]
    assert torch.allclose(scored, logits, atol=1e-4)


def test_two_drops_accumulate_their_record(rt):
    a, b, c, d = conversation(rt)
    _, cache = rt.prefill(a + b + c + d)
    once, _ = drop(rt, cache, [(len(a), len(a) + len(b))])
    twice, step = drop(rt, once, [(len(a), len(a) + len(c))])
    assert twice.token_ids == tuple(a + d) and twice.edits.dropped == len(b) + len(c)
    assert len(twice.edits.steps) == 2 and twice.edits.steps[1] == step
    d_ = twice.edits.to_dict()
    assert d_["dropped_tokens"] == len(b) + len(c) and d_["steps"][0]["dropped"] == [[len(a), len(a) + len(b)]]


@pytest.mark.parametrize("spans, match", [
    ([(0, 3)], "token 0"), ([(5, 999)], "outside"), ([(3, 8), (6, 9)], "overlap"), ([], "nothing to drop")])
def test_bad_spans_are_refused_and_the_cache_is_unchanged(rt, spans, match):
    a, b, c, d = conversation(rt)
    _, cache = rt.prefill(a + b)
    keys = [k.clone() for k in cache.keys]
    with pytest.raises(ConfigError, match=match):
        drop(rt, cache, spans)
    assert cache.exact and all(k.equal(k0) for k, k0 in zip(cache.keys, keys))


def test_repair_needs_reposition_and_a_known_level(rt):
    _, cache = rt.prefill(rt.encode("one two three four five six"))
    with pytest.raises(ConfigError, match="reposition"):
        drop(rt, cache, [(2, 4)], reposition=False, repair="first:2")
    for bad in ("first:0", "ratio:2", "some", "first:1.5"):
        with pytest.raises(ConfigError, match="first:K"):
            Repair.parse(bad)
    assert str(Repair.parse("ratio:0.25")) == "ratio:0.25" and str(Repair.parse(None)) == "none"


def test_a_gapped_cache_refuses_position_slicing_and_plain_reposition(rt):
    _, cache = rt.prefill(rt.encode("one two three four five six"))
    edited, _ = drop(rt, cache, [(2, 4)], reposition=False)
    with pytest.raises(RuntimeUnsupportedError, match="take"):
        edited.slice(0, 2)
    with pytest.raises(RuntimeUnsupportedError, match="close_gaps"):
        rt.reposition(edited, 3)
    with pytest.raises(IncompatibleCacheError, match="re-position"):
        edited.append(cache.take(0, 2))


def test_sliding_window_models_refuse_edits(tiny):
    rt = tiny("gemma3")
    if all(w is None for w in rt.facts.windows):
        pytest.skip("this tiny gemma3 has no sliding layer")
    _, cache = rt.prefill(rt.encode("one two three four five six"))
    with pytest.raises(RuntimeUnsupportedError, match="sliding"):
        drop(rt, cache, [(2, 4)])


def test_a_long_edit_record_folds_its_oldest_steps_and_keeps_its_totals():
    from c2c.runtime.kvcache import MAX_EDIT_STEPS, EditStep, Edits

    e = Edits()
    for i in range(MAX_EDIT_STEPS + 10):
        e = e.plus(Edits(steps=(EditStep(dropped=((100 - i, 102 - i),), repositioned=3, recomputed=1),)))
    assert len(e.steps) == MAX_EDIT_STEPS and e.steps[0].repair == "folded:11"
    assert e.dropped == 2 * (MAX_EDIT_STEPS + 10) and e.repositioned == 3 * (MAX_EDIT_STEPS + 10)
    assert e.exact_until == 100 - (MAX_EDIT_STEPS + 9) and Edits.from_dict(e.to_dict()).to_dict() == e.to_dict()


def test_a_part_before_the_first_drop_is_exact_again(rt):
    a, b, c, d = conversation(rt)
    _, cache = rt.prefill(a + b + c)
    edited, _ = drop(rt, cache, [(len(a), len(a) + len(b))])
    assert edited.head(len(a)).exact and not edited.head(len(a) + 1).exact


def test_an_unreadable_record_still_marks_a_cache_edited():
    from c2c.runtime.kvcache import Edits

    for junk in ("edited", [1, 2], {"steps": [{"dropped": "x"}]}, {"no": "steps"}):
        e = Edits.read(junk)
        assert e == Edits() and "does not read" in e.summary()


def test_a_cut_keeps_every_edit_that_reaches_a_token_it_keeps(rt):
    """Edits.before trims a cut cache's record to the edits that still reach it: never fewer (found by a review:
    a step named positions that closing an earlier open gap then moved below them)."""
    ids = list(range(3, 43))
    _, cache = rt.prefill(ids)
    one, _ = drop(rt, cache, [(10, 15)], reposition=False)          # a gap left open at 10
    two, _ = drop(rt, one, [(20, 25)], reposition=True)              # named at its gapped positions, then moved
    assert len(two.head(23).edits.steps) >= 2 and two.head(23).edits.dropped == 10   # token 20 was at 30
    closed, _ = close_gaps(rt, drop(rt, one, [(20, 25)], reposition=False)[0])
    assert closed.head(23).edits.dropped == 10
    plain, _ = drop(rt, cache, [(10, 15)])                           # no gap left open: the record trims exactly
    later, _ = drop(rt, plain, [(25, 30)])
    assert later.head(20).edits.dropped == 5 and later.head(26).edits.dropped == 10
    assert later.head(10).edits is None and later.head(10).exact


def test_an_edited_piece_placed_after_another_cache_is_never_cut_back_to_exact(rt):
    """A slice of an edited cache, re-positioned and appended after a receiver's context, keeps its record whole
    whatever the cut: its steps name the sender's positions (found by a review: a cut made it exact)."""
    ids = list(range(3, 63))
    _, cache = rt.prefill(ids)
    edited, _ = drop(rt, cache, [(20, 25)])
    piece = rt.reposition(edited.slice(40, 48), 10)
    _, mine = rt.prefill(list(range(100, 110)))
    both = mine.append(piece)
    for n in range(11, both.seq_len + 1):
        assert not both.head(n).exact, n
    assert both.head(10).exact
