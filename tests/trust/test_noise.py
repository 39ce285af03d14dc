"""Calibrated noise: scaled to each head's own std, reproducible with a seed."""

import pytest
import torch

from c2c.errors import ConfigError
from c2c.testing.synthetic import synthetic_cache
from c2c.trust.noise import NoiseConfig, add_noise, noise_label


def test_zero_sigma_is_identity():
    c = synthetic_cache(T=32)
    assert add_noise(c, NoiseConfig(sigma=0.0)) is c


def test_noise_scales_with_each_heads_std():
    c = synthetic_cache(T=512)
    scale = torch.tensor([1.0, 100.0]).view(1, 2, 1, 1)  # head 1 is 100x larger
    c = type(c)(keys=tuple(k * scale for k in c.keys), values=tuple(v * 0.01 for v in c.values),
                token_ids=c.token_ids, windows=c.windows)
    n = add_noise(c, NoiseConfig(sigma=0.1, seed=0))
    for a, b in zip(c.keys + c.values, n.keys + n.values):
        for h in range(2):
            want = 0.1 * a[0, h].std(unbiased=False)
            got = (b[0, h] - a[0, h]).std()
            assert abs(got / want - 1) < 0.1, (h, float(got), float(want))


def test_seed_reproducible_and_only_selected_tensors():
    c = synthetic_cache(T=16, dtype=torch.bfloat16)
    a, b = (add_noise(c, NoiseConfig(sigma=0.2, seed=7)) for _ in range(2))
    assert a.max_abs_diff(b) == 0 and a.dtype == torch.bfloat16
    assert add_noise(c, NoiseConfig(sigma=0.2, seed=8)).max_abs_diff(a) > 0
    assert add_noise(c, NoiseConfig(sigma=0.2)).max_abs_diff(a) > 0  # unseeded: fresh each time
    k_only = add_noise(c, NoiseConfig(sigma=0.2, values=False, seed=1))
    assert all(torch.equal(x, y) for x, y in zip(k_only.values, c.values))
    assert not torch.equal(k_only.keys[0], c.keys[0])


def test_config_is_checked_and_labelled():
    for bad in (-0.1, 11, float("nan")):
        with pytest.raises(ConfigError):
            NoiseConfig(sigma=bad)
    label = noise_label(NoiseConfig(sigma=0.1, seed=3))
    assert label["sigma"] == 0.1 and "seed" not in label
