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
    """Percentile bootstrap interval of the mean of ``values`` (per-question 0/1 correctness, or paired
    differences); ``(0, 1)`` when there are none."""
    import numpy as np  # lazy: keeps the module import minimal

    vals = np.asarray(list(values), dtype=np.float64)
    if not len(vals):
        return 0.0, 1.0
    idx = np.random.default_rng(seed).integers(0, len(vals), size=(reps, len(vals)))   # (reps, n)
    means = vals[idx].mean(axis=1)                                                      # (reps,)
    return float(np.quantile(means, (1 - level) / 2)), float(np.quantile(means, (1 + level) / 2))
