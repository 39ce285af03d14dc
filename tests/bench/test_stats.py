import pytest

from c2c.bench.stats import wilson


def test_wilson_interval_matches_known_values_and_bounds():
    lo, hi = wilson(50, 100)
    assert lo == pytest.approx(0.4038, abs=1e-3) and hi == pytest.approx(0.5962, abs=1e-3)
    assert wilson(0, 50)[0] == 0.0 and 0.05 < wilson(0, 50)[1] < 0.08
    assert wilson(10, 10)[1] == 1.0 and wilson(0, 0) == (0.0, 1.0)


def test_bootstrap_interval_covers_the_mean_and_narrows_with_n():
    from c2c.bench.stats import bootstrap_mean

    lo, hi = bootstrap_mean([1, 0] * 50)
    assert lo < 0.5 < hi and 0.05 < hi - lo < 0.25
    lo2, hi2 = bootstrap_mean([1, 0] * 500)
    assert hi2 - lo2 < (hi - lo) / 2
    assert bootstrap_mean([]) == (0.0, 1.0)
