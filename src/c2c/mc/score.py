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

``benchmarks/lm_eval_agreement.py`` checks this against lm-eval itself on the same
questions. Tensor shapes are in the comments.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch

from c2c.errors import ConfigError
from c2c.runtime.kvcache import KVCache


def lm_eval_context(question: str) -> str:
    """The context lm-eval's ARC/OpenBookQA tasks score options after."""
    return f"Question: {question}\nAnswer:"


@dataclass(frozen=True, kw_only=True)
class OptionScores:
    """Per option: summed log-likelihood of its continuation, and its length in characters."""

    loglik: tuple[float, ...]
    chars: tuple[int, ...]

    @property
    def acc_choice(self) -> int:
        """Index of the option lm-eval's ``acc`` picks."""
        return max(range(len(self.loglik)), key=lambda i: self.loglik[i])

    @property
    def norm_choice(self) -> int:
        """Index of the option lm-eval's ``acc_norm`` picks (log-likelihood per character)."""
        return max(range(len(self.loglik)), key=lambda i: self.loglik[i] / max(self.chars[i], 1))


def score_options(runtime, context: str, options: Sequence[str], *, past: KVCache | None = None,
                  delimiter: str = " ") -> OptionScores:
    """Log-likelihood of each ``delimiter + option`` as the continuation of ``context`` (after ``past``).

    Raises:
        ConfigError: no options, or an option whose continuation has no token of its own.
    """
    if not options:
        raise ConfigError("score_options needs at least one option")
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
    logits = runtime.logits_batch([lead + s for s in seqs], past)   # each (len(lead) + T_i, vocab)
    out = []
    for (a, b), s, lg in zip(conts, seqs, logits):
        logp = torch.log_softmax(lg.float(), dim=-1)                  # (T, vocab): predicts the next token
        off = len(lead)
        # position p's logits predict token p + 1: the continuation tokens s[a:b] come from rows a-1 .. b-2
        rows = logp[off + a - 1: off + b - 1]                         # (b - a, vocab)
        toks = torch.tensor(s[a:b], dtype=torch.long)[:, None]        # (b - a, 1)
        out.append(float(rows.gather(1, toks).sum()))
    return OptionScores(loglik=tuple(out), chars=tuple(len(o) for o in options))

