"""Option log-likelihoods, matching lm-evaluation-harness's ``multiple_choice`` tasks.

The method, as lm-eval 0.4 scores ARC, OpenBookQA and MMLU-style tasks:

- the context is ``"Question: {question}\\nAnswer:"`` and each option is the
  continuation ``" " + option_text`` (the target delimiter is one space);
- the continuation's tokens are those of ``context + continuation`` after as many
  tokens as the context alone has (lm-eval's rule), and its log-likelihood is
  their summed log-probability; no BOS is added beyond the runtime's own
  ``bos_ids`` (none for Qwen2; lm-eval adds none for these models either);
- ``acc`` picks the option with the largest log-likelihood; ``acc_norm`` divides
  each by the option text's length in characters first.

The same call scores letters (``options=["A", "B", ...]`` after ``"...Answer:"``, as
lm-eval's MMLU tasks do) and scores after any cache (``past``): the noise and
slice-repair benchmarks and the fuser harness all use it, so c2c has one way
to score a multiple-choice question.

``benchmarks/lm_eval_agreement.py`` checks this against lm-eval itself on the same
questions. Tensor shapes are in the comments.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch

from c2c.errors import ConfigError
from c2c.runtime.kvcache import KVCache
from c2c.runtime.protocol import Scoring, require


def lm_eval_context(question: str) -> str:
    """The context lm-eval's ARC/OpenBookQA tasks score options after."""
    return f"Question: {question}\nAnswer:"


@dataclass(frozen=True, kw_only=True)
class OptionScores:
    """Per option: summed log-likelihood of its continuation, and its length in characters."""

    loglik: tuple[float, ...]
    chars: tuple[int, ...]

    def scores(self, metric: str = "acc") -> tuple[float, ...]:
        """What ``metric`` compares: ``"acc"`` the log-likelihoods, ``"norm"`` each per character."""
        if metric == "acc":
            return self.loglik
        if metric == "norm":
            return tuple(x / max(c, 1) for x, c in zip(self.loglik, self.chars))
        raise ConfigError(f"unknown metric {metric!r}; use 'acc' or 'norm'")

    def choice(self, metric: str = "acc") -> int:
        """Index of the option ``metric`` picks (the first of equal ones)."""
        s = self.scores(metric)
        return max(range(len(s)), key=s.__getitem__)

    def distribution(self, metric: str = "acc") -> torch.Tensor:
        """``(n_options,)`` log-probabilities over the options: ``metric``'s scores, log-softmaxed."""
        return torch.tensor(self.scores(metric), dtype=torch.float64).log_softmax(0)

    @property
    def acc_choice(self) -> int:
        """Index of the option lm-eval's ``acc`` picks."""
        return self.choice("acc")

    @property
    def norm_choice(self) -> int:
        """Index of the option lm-eval's ``acc_norm`` picks (log-likelihood per character)."""
        return self.choice("norm")


def score_options(runtime, context: str, options: Sequence[str], *, past: KVCache | None = None,
                  head: KVCache | None = None, delimiter: str = " ") -> OptionScores:
    """Log-likelihood of each ``delimiter + option`` as the continuation of ``context`` (after ``past``).

    ``head``, instead of ``past``, is a cache of the first ``k`` tokens of the scored sequence itself
    (the runtime's BOS, then ``context``'s tokens), for instance a fused cache of the context:
    only the tokens after it are run, and ``k`` must leave the context's last token to run, whose
    logits predict the first option token.

    Raises:
        ConfigError: no options, an option whose continuation has no token of its own, both
            ``past`` and ``head``, or a ``head`` that is not a beginning of the context's tokens.
    """
    if not options:
        raise ConfigError("score_options needs at least one option")
    if past is not None and head is not None:
        raise ConfigError("give score_options a past (before the context) or a head (of it), not both")
    ctx = runtime.encode(context)
    seqs, conts = [], []
    for opt in options:
        whole = runtime.encode(context + delimiter + opt)
        cut = len(ctx)  # as lm-eval: the continuation is what follows the context's own token count
        if cut >= len(whole) or cut == 0:
            raise ConfigError(f"option {opt[:40]!r} has no token of its own after the context")
        seqs.append(whole)
        conts.append((cut, len(whole)))
    lead = list(runtime.bos_ids) if past is None else []
    k = 0 if head is None else head.seq_len
    if head is not None:  # every scored sequence must start with the head's tokens (as the context does)
        if head.start != 0 or not 0 < k < len(lead) + len(ctx) or any(
                tuple(head.token_ids) != tuple(lead + s)[:k] for s in [ctx, *seqs]):
            raise ConfigError(f"head holds {k} tokens that are not a beginning of the context's "
                              f"{len(lead) + len(ctx)} (leaving its last token to run) and of every option's")
    logits = require(runtime, Scoring).logits_batch([(lead + s)[k:] for s in seqs], head if head is not None else past)
    out = []                                                          # each (len(lead) + T_i - k, vocab)
    for (a, b), s, lg in zip(conts, seqs, logits):
        logp = torch.log_softmax(lg.float(), dim=-1)                  # (T, vocab): predicts the next token
        off = len(lead) - k
        # position p's logits predict token p + 1: the continuation tokens s[a:b] come from rows a-1 .. b-2
        rows = logp[off + a - 1: off + b - 1]                         # (b - a, vocab)
        toks = torch.tensor(s[a:b], dtype=torch.long)[:, None]        # (b - a, 1)
        out.append(float(rows.gather(1, toks).sum()))
    return OptionScores(loglik=tuple(out), chars=tuple(len(o) for o in options))

