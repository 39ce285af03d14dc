"""Intervals for reported accuracies and rates: every number a benchmark prints carries one."""

from __future__ import annotations

import math


def wilson(k: int, n: int, z: float = 1.96) -> tuple[float, float]:
    """95% (``z = 1.96``) Wilson score interval of the proportion ``k / n``; ``(0, 1)`` when ``n == 0``."""
    if n == 0:
        return 0.0, 1.0
    p = k / n
    d = 1 + z * z / n
    c = (p + z * z / (2 * n)) / d
    h = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / d
    return max(0.0, c - h), min(1.0, c + h)


def bootstrap_mean(values, *, reps: int = 2000, seed: int = 0, level: float = 0.95) -> tuple[float, float]:
    """Percentile bootstrap interval of the mean of ``values`` (e.g. per-question 0/1 correctness)."""
    import random  # lazy: keeps the module import minimal

    vals = list(values)
    if not vals:
        return 0.0, 1.0
    rng = random.Random(seed)
    n = len(vals)
    means = sorted(sum(vals[rng.randrange(n)] for _ in range(n)) / n for _ in range(reps))
    lo = means[int((1 - level) / 2 * reps)]
    hi = means[min(int((1 + level) / 2 * reps), reps - 1)]
    return lo, hi
