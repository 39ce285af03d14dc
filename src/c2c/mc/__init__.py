"""Multiple-choice scoring the way the field does it (lm-evaluation-harness), for every c2c condition.

:func:`score_options` gives each option's log-likelihood as the continuation of
``"Question: ...\\nAnswer:"``, after an optional cache (the Receiver's own, a
fused one, an attached slice), so that every condition is scored by one method.
"""

from c2c.mc.score import OptionScores, lm_eval_context, score_options

__all__ = ["OptionScores", "lm_eval_context", "score_options"]
