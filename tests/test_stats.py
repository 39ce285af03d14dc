import pytest

from c2c.bench.stats import wilson


def test_wilson_interval_matches_known_values_and_bounds():
    lo, hi = wilson(50, 100)
    assert lo == pytest.approx(0.4038, abs=1e-3) and hi == pytest.approx(0.5962, abs=1e-3)
    assert wilson(0, 50)[0] == 0.0 and 0.05 < wilson(0, 50)[1] < 0.08
    assert wilson(10, 10)[1] == 1.0 and wilson(0, 0) == (0.0, 1.0)
