"""Choosing the next token from logits: greedy, or temperature and nucleus (top-p) sampling.

Every engine's ``generate`` draws with :func:`sample_next`, so a seeded generator gives the
same draw on every engine that gives the same logits.
"""

from __future__ import annotations

import torch

from c2c.errors import ConfigError


GREEDY_BELOW = 1e-5  # a smaller temperature is greedy: it picks the argmax anyway, and logits / 1e-320 overflow


def check_sampling(temperature: float, top_p: float) -> None:
    """Raise :class:`ConfigError` unless ``temperature >= 0`` and ``0 < top_p <= 1``."""
    if not (isinstance(temperature, (int, float)) and 0 <= temperature < float("inf")):
        raise ConfigError(f"temperature={temperature!r}: give a number >= 0 (0 is greedy)")
    if not (isinstance(top_p, (int, float)) and 0 < top_p <= 1):
        raise ConfigError(f"top_p={top_p!r}: give a number in (0, 1]")


def sample_next(logits: torch.Tensor, *, temperature: float = 0.0, top_p: float = 1.0,
                generator: torch.Generator | None = None) -> int:
    """The next token from ``logits`` ``(vocab,)``.

    ``temperature`` below :data:`GREEDY_BELOW` (0 included): the argmax (greedy). Otherwise a draw from
    ``softmax(logits / temperature)`` restricted to the smallest set of most likely
    tokens whose probability reaches ``top_p`` (nucleus sampling), using ``generator``
    (on the logits' device) so that a seeded generator gives the same draw every time.
    """
    if temperature < GREEDY_BELOW:
        return int(torch.argmax(logits))
    probs = torch.softmax(logits.float() / temperature, dim=-1)  # (vocab,)
    if top_p < 1.0:
        sorted_p, order = torch.sort(probs, descending=True)  # (vocab,), (vocab,)
        # keep a token while the mass of the tokens before it is still below top_p (the first is always kept)
        keep = (torch.cumsum(sorted_p, dim=0) - sorted_p) < top_p
        keep[0] = True  # NOTE: a top_p below float32's range (1e-46) compares as 0, which would keep none
        return int(order[torch.multinomial(sorted_p * keep, 1, generator=generator)])
    return int(torch.multinomial(probs, 1, generator=generator))
