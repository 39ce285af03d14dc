"""lm-eval-style option scoring: one method for every condition (c2c.mc)."""

from __future__ import annotations

import pytest
import torch

from c2c.errors import ConfigError
from c2c.mc import lm_eval_context, score_options


def test_option_loglik_is_the_summed_logprob_of_the_continuation(tiny):
    rt = tiny("qwen2")
    ctx = lm_eval_context("Which gas do plants take in?")
    sc = score_options(rt, ctx, ["carbon dioxide", "oxygen"])
    # recompute the first option by hand, one token at a time
    whole, n = rt.encode(ctx + " carbon dioxide"), len(rt.encode(ctx))
    logp = torch.log_softmax(rt.logits(list(rt.bos_ids) + whole).float(), dim=-1)
    off = len(rt.bos_ids)
    want = sum(float(logp[off + i - 1, whole[i]]) for i in range(n, len(whole)))
    assert sc.loglik[0] == pytest.approx(want, abs=1e-4)
    assert sc.chars == (len("carbon dioxide"), len("oxygen"))


def test_acc_and_acc_norm_choices_and_scoring_after_a_cache(tiny):
    rt = tiny("llama")
    from c2c.mc.score import OptionScores

    s = OptionScores(loglik=(-10.0, -6.0), chars=(40, 4))
    assert (s.acc_choice, s.norm_choice) == (1, 0)
    _, past = rt.prefill([5, 6, 7])
    a = score_options(rt, "Question: x\nAnswer:", ["yes", "no"], past=past)
    b = score_options(rt, "Question: x\nAnswer:", ["yes", "no"])
    assert a.loglik != b.loglik  # the cache changes what the options follow
    with pytest.raises(ConfigError):
        score_options(rt, "Question: x\nAnswer:", [])


def test_one_scores_object_gives_acc_acc_norm_and_the_distribution_over_the_options():
    """What the noise and slice-repair benchmarks read off c2c.mc instead of scoring options themselves."""
    from c2c.mc.score import OptionScores

    s = OptionScores(loglik=(-10.0, -6.0, -6.0), chars=(40, 4, 3))
    assert s.scores("acc") == s.loglik and s.scores("norm") == (-0.25, -1.5, -2.0)
    assert (s.choice("acc"), s.choice("norm")) == (1, 0) == (s.acc_choice, s.norm_choice)
    d = s.distribution()                                              # (3,) log-probabilities
    assert float(d.exp().sum()) == pytest.approx(1.0) and d[1] == d[2] > d[0]
    assert float(d[1] - d[0]) == pytest.approx(4.0)
    assert s.distribution("norm").argmax() == 0
    with pytest.raises(ConfigError, match="unknown metric"):
        s.scores("f1")
