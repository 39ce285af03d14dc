"""Slice repair: r=0 is reuse, r=1 is a fresh prefill, and more recompute means closer K/V."""

import pytest

from c2c.errors import RuntimeUnsupportedError
from c2c.runtime.repair import repair


def setup(rt):
    other = rt.encode("An unrelated earlier document about gardening and tomatoes. " * 2)
    evidence = rt.encode("The meeting moved to Thursday at 10am in room B. ")
    recv_prefix = rt.encode("Receiver prefix.")
    _, sender = rt.prefill(other + evidence)
    piece = sender.slice(len(other), len(other) + len(evidence))
    _, head = rt.prefill(recv_prefix)
    moved = rt.reposition(piece, head.end)
    _, truth = rt.prefill(recv_prefix + evidence)
    return head, moved, truth


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_ratio_one_equals_fresh_prefill_and_zero_is_reuse(tiny, arch):
    rt = tiny(arch)
    head, moved, truth = setup(rt)
    full, rep = repair(rt, head, moved, ratio=1.0)
    assert len(rep.recomputed) == moved.seq_len
    assert full.max_abs_diff(truth) < 1e-4
    none, rep0 = repair(rt, head, moved, ratio=0.0)
    assert rep0.recomputed == () and none.max_abs_diff(head.append(moved)) == 0.0
    assert none.max_abs_diff(truth) > 1e-3  # reuse really is approximate here


def test_more_recompute_gets_closer(tiny):
    rt = tiny("qwen2")
    head, moved, truth = setup(rt)
    errs = [repair(rt, head, moved, ratio=r)[0].max_abs_diff(truth) for r in (0.0, 0.5, 1.0)]
    assert errs[0] > errs[2] and errs[1] <= errs[0]
    _, rep = repair(rt, head, moved, ratio=0.25)
    chosen = [p - head.end for p in rep.recomputed]
    # the recomputed tokens are the most deviating ones at the probe layer
    ranked = sorted(range(len(rep.deviation)), key=lambda i: -rep.deviation[i])[: len(chosen)]
    assert sorted(ranked) == chosen


def test_sliding_window_models_are_refused(tiny):
    rt = tiny("gemma3")
    _, head = rt.prefill(rt.encode("abc"))
    _, piece = rt.prefill(rt.encode("abcdef"))
    with pytest.raises(RuntimeUnsupportedError, match="sliding"):
        repair(rt, head, rt.reposition(piece.slice(3, 6), head.end), ratio=0.5)
