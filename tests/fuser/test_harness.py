"""lm-eval-style scoring of every fuser condition, its causal controls, records and paired intervals."""

import numpy as np
import pytest

from c2c.errors import ConfigError
from c2c.fuser.data import Question
from c2c.bench.stats import bootstrap_mean
from c2c.bench.harness import CONDITIONS, HarnessEvaluator, other_question, plain, proportional_index, summarize
from c2c.fuser.infer import FusedReceiver
from c2c.mc import lm_eval_context, score_options

QUESTIONS = [Question(id=f"q{i}", question=f"Which number follows {i}?",
                      options=(("A", str(i + 1)), ("B", str(i + 3)), ("C", "none")), answer="A") for i in range(3)]


def test_scoring_from_a_head_cache_equals_scoring_from_scratch(tiny_rt):
    r = tiny_rt("qwen2")
    q = QUESTIONS[0]
    ctx, opts = lm_eval_context(q.question), [t for _, t in q.options]
    whole = score_options(r, ctx, opts)
    ids = list(plain(r, ctx).ids)
    _, cache = r.prefill(ids)
    for k in (1, len(ids) - 1):  # any beginning that leaves the last context token to run
        got = score_options(r, ctx, opts, head=cache.slice(0, k))
        assert got.loglik == pytest.approx(whole.loglik, abs=1e-4)
    with pytest.raises(ConfigError, match="beginning"):
        score_options(r, ctx, opts, head=cache)  # the last token must run: its logits predict the options
    _, other = r.prefill(list(plain(r, "Question: something else\nAnswer:").ids))
    with pytest.raises(ConfigError, match="beginning"):
        score_options(r, ctx, opts, head=other.slice(0, 14))  # past "Question: "
    with pytest.raises(ConfigError, match="not both"):
        score_options(r, ctx, opts, head=cache.slice(0, 3), past=cache)


def test_every_condition_is_recorded_and_an_untrained_fuser_is_the_identity(make_link, tiny_rt):
    r, s = tiny_rt("qwen2"), tiny_rt("gemma3")
    ev = HarnessEvaluator(r, sharer=s, fused=FusedReceiver(r, [make_link(r, s)]),
                          control=FusedReceiver(r, [make_link(r, None)]), hint_tokens=4)
    saved = []
    recs = ev.evaluate(QUESTIONS, CONDITIONS, progress=False, on_record=saved.append)
    assert len(recs) == len(saved) == 3
    for rec, q in zip(recs, QUESTIONS):
        assert set(rec["cond"]) == set(CONDITIONS) and rec["answer"] == 0
        assert isinstance(rec["hint"], str) and rec["sharer_said"] == rec["cond"]["sharer"]["acc"]
        base = rec["cond"]["receiver"]["loglik"]
        for c in ("c2c", "control", "c2c_other", "c2c_zero"):  # zero-initialised fusers add nothing
            assert rec["cond"][c]["loglik"] == pytest.approx(base, abs=1e-3)
        assert all(v < 1e-3 for v in rec["delta"].values())  # ... and leave the Receiver's cache as it was
        assert {"c2c~receiver", "control~receiver", "c2c~c2c_other", "c2c~c2c_zero"} <= set(rec["delta"])
        assert rec["cond"]["t2t"]["loglik"] != base  # a hint in the context changes the scores
        assert all(rec["cond"][c]["s"] > 0 for c in CONDITIONS)
        assert len(rec["cond"]["sharer"]["loglik"]) == len(q.options)
    # the same records are reused, not asked again
    again = ev.evaluate(QUESTIONS, CONDITIONS, progress=False, done=recs, on_record=saved.append)
    assert again == recs and len(saved) == 3


def test_the_c2c_record_is_the_options_scored_from_the_fused_cache(make_link, tiny_rt):
    from c2c.fuser.align import align_tokens
    from c2c.bench.harness import _zeros_like

    r, s = tiny_rt("qwen2"), tiny_rt("gemma3")
    fr = FusedReceiver(r, [make_link(r, s, perturb=3)])
    ev = HarnessEvaluator(r, sharer=s, fused=fr)
    q = QUESTIONS[1]
    rec = ev.ask(q, ["c2c", "c2c_zero"])
    ctx, opts = lm_eval_context(q.question), [t for _, t in q.options]
    r_text, s_text = plain(r, ctx), plain(s, ctx)
    _, r_cache = r.prefill(list(r_text.ids))
    _, s_cache = s.prefill(list(s_text.ids))
    index = align_tokens(r_text, s_text)
    name = fr.links[0].sharer_name
    for cond, given in (("c2c", s_cache), ("c2c_zero", _zeros_like(s_cache))):
        fused, _ = fr.fuse_caches(r_cache, {name: (given, index)})
        want = score_options(r, ctx, opts, head=fused.slice(0, fused.seq_len - 1))
        assert rec["cond"][cond]["loglik"] == pytest.approx(list(want.loglik), abs=1e-4), cond


def test_mismatched_parts_are_refused(make_link, tiny_rt):
    r, s, other = tiny_rt("qwen2"), tiny_rt("gemma3"), tiny_rt("llama")
    with pytest.raises(ConfigError, match="Sharer runtime"):
        HarnessEvaluator(r, sharer=other, fused=FusedReceiver(r, [make_link(r, s)]))
    with pytest.raises(ConfigError, match="control link"):
        HarnessEvaluator(r, sharer=s, control=FusedReceiver(r, [make_link(r, s)]))


def test_the_other_question_is_half_the_list_away_and_never_itself():
    assert [other_question(QUESTIONS, i).id for i in range(3)] == ["q1", "q2", "q0"]
    assert other_question(QUESTIONS[:1], 0) is None


def test_evaluate_feeds_c2c_other_the_other_question(make_link, tiny_rt):
    r, s = tiny_rt("qwen2"), tiny_rt("gemma3")
    ev = HarnessEvaluator(r, sharer=s, fused=FusedReceiver(r, [make_link(r, s)]))
    recs = ev.evaluate(QUESTIONS, ["c2c_other"], progress=False)
    assert [rec["other_id"] for rec in recs] == [other_question(QUESTIONS, i).id for i in range(3)]


def test_the_causal_controls_feed_other_and_zero_caches_through_the_same_fuser(make_link, tiny_rt):
    r, s = tiny_rt("qwen2"), tiny_rt("gemma3")
    ev = HarnessEvaluator(r, sharer=s, fused=FusedReceiver(r, [make_link(r, s, perturb=3)]))
    rec = ev.ask(QUESTIONS[0], ["receiver", "c2c", "c2c_other", "c2c_zero"], other=QUESTIONS[1])
    assert rec["other_id"] == QUESTIONS[1].id
    ll = {c: rec["cond"][c]["loglik"] for c in rec["cond"]}
    assert ll["c2c"] != pytest.approx(ll["receiver"], abs=1e-3)  # a trained fuser changes the answer's scores
    assert ll["c2c_other"] != pytest.approx(ll["c2c"], abs=1e-4)  # ... and depends on what the Sharer read
    assert ll["c2c_zero"] != pytest.approx(ll["c2c"], abs=1e-4)
    d = rec["delta"]  # the fused caches moved from the Receiver's, and apart from each other
    assert d["c2c~receiver"] > 1e-3 and d["c2c~c2c_other"] > 1e-4 and d["c2c~c2c_zero"] > 1e-4
    assert "control~receiver" not in d
    s_ = summarize([{"id": "x", "answer": 0, "cond": rec["cond"], "delta": d}])
    assert s_["cache_delta"]["c2c~c2c_other"] == {"mean": pytest.approx(d["c2c~c2c_other"]), "n": 1}
    with pytest.raises(ConfigError, match="another question"):
        ev.ask(QUESTIONS[0], ["c2c_other"])
    with pytest.raises(ConfigError, match="need a Sharer"):
        HarnessEvaluator(r).ask(QUESTIONS[0], ["t2t"])
    with pytest.raises(ConfigError, match="control"):
        ev.ask(QUESTIONS[0], ["control"])


def test_summary_intervals_oracle_agreement_and_paired_differences():
    def rec(i, receiver, sharer, c2c):
        return {"id": i, "answer": 0, "cond": {
            "receiver": {"acc": receiver, "norm": receiver, "s": 1.0},
            "sharer": {"acc": sharer, "norm": sharer, "s": 0.5},
            "c2c": {"acc": c2c, "norm": c2c, "s": 2.0}}}
    # c2c is right wherever the Sharer is; the Receiver is right on a different fifth
    recs = [rec(i, 0 if i % 5 == 0 else 1, 0 if i % 2 == 0 else 1, 0 if i % 2 == 0 else 1) for i in range(200)]
    out = summarize(recs)
    c = out["conditions"]
    assert c["receiver"]["acc"] == pytest.approx(0.2) and c["c2c"]["acc"] == pytest.approx(0.5)
    assert c["oracle"]["acc"] == pytest.approx(0.6)  # right where either one is
    lo, hi = c["c2c"]["acc_ci95"]
    assert lo < 0.5 < hi and hi - lo < 0.2
    agree, shift = out["sharer_agreement"], out["sharer_agreement_shift"]
    assert agree["c2c"]["rate"] == 1.0 and agree["receiver"]["rate"] == pytest.approx(0.5)  # same choice half the time
    assert shift["receiver"]["diff"] == pytest.approx(0.5) and shift["receiver"]["clears"]
    assert set(shift) == {"receiver"} and "sharer" not in agree  # nothing else to compare; the Sharer agrees with itself
    same = summarize([r | {"cond": r["cond"] | {"c2c": r["cond"]["receiver"]}} for r in recs])
    assert same["sharer_agreement_shift"]["receiver"]["diff"] == 0.0  # c2c answering as the Receiver moved nothing
    assert not same["sharer_agreement_shift"]["receiver"]["clears"]
    assert out["paired"]["receiver"]["acc"]["clears"] and not out["paired"]["sharer"]["acc"]["clears"]
    assert out["paired"]["sharer"]["acc"]["diff"] == 0.0
    assert c["c2c"]["latency_s"] == 2.0 and "latency_s" not in c["oracle"]


def test_bootstrap_and_the_proportional_index():
    lo, hi = bootstrap_mean(np.array([1] * 80 + [0] * 20, dtype=float))
    assert 0.7 < lo < 0.8 < hi < 0.9
    idx = proportional_index(10, 4)
    assert idx[0] == 0 and idx[-1] == 3 and (np.diff(idx) >= 0).all()
