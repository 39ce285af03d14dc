"""Ridge from sufficient statistics: recovers a known map, and scores it as the rows would."""

from __future__ import annotations

import torch

from c2c.xmodel.ridge import Moments, Residuals


def _rows(n, seed, a, b, noise):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 6, generator=g) * torch.tensor([1.0, 3.0, 0.5, 2.0, 1.0, 1.0]) + 2.0  # (n, d_in)
    y = x @ a + b + noise * torch.randn(n, 4, generator=g)                                     # (n, d_out)
    return x, y


def test_recovers_a_known_linear_map_and_picks_the_right_source():
    g = torch.Generator().manual_seed(0)
    a, b = torch.randn(6, 4, generator=g), torch.randn(4, generator=g)
    train = Moments(n_source=2, d_in=6, d_out=4, candidates=[[(0,), (1,)]])
    held = Moments(n_source=2, d_in=6, d_out=4, candidates=[[(0,), (1,)]])
    for m, seed in ((train, 1), (train, 2), (held, 3)):
        x, y = _rows(500, seed, a, b, 0.05)
        decoy = torch.randn(500, 6, generator=torch.Generator().manual_seed(seed + 10))
        m.add([decoy, x], [y])  # source layer 1 explains y; layer 0 is noise
    f0, f1 = train.solve(0, 0, [1e-4])[0], train.solve(0, 1, [1e-4])[0]
    torch.testing.assert_close(f1.weight.float(), a, atol=0.02, rtol=0)
    torch.testing.assert_close(f1.bias.float(), b, atol=0.05, rtol=0)
    assert held.r2(0, 1, f1) > 0.99 and held.r2(0, 0, f0) < 0.05


def test_r2_from_moments_equals_r2_from_the_rows():
    g = torch.Generator().manual_seed(4)
    a, b = torch.randn(6, 4, generator=g), torch.randn(4, generator=g)
    train = Moments(n_source=1, d_in=6, d_out=4, candidates=[[(0,)]])
    x, y = _rows(300, 5, a, b, 1.0)
    train.add([x], [y])
    f = train.solve(0, 0, [0.5])[0]  # a strong ridge: an imperfect fit on purpose
    test = Moments(n_source=1, d_in=6, d_out=4, candidates=[[(0,)]])
    res = Residuals(1)
    xt, yt = _rows(200, 6, a, b, 1.0)
    test.add([xt], [yt])
    res.add(0, yt, xt.double() @ f.weight + f.bias)
    direct = 1 - ((yt.double() - xt.double() @ f.weight - f.bias) ** 2).sum() / ((yt.double() - yt.double().mean(0)) ** 2).sum()
    # moments are fp32 products within a batch: agreement to 1e-5, exact (fp64) from the rows
    assert abs(test.r2(0, 0, f) - float(direct)) < 1e-5 and abs(res.r2(0) - float(direct)) < 1e-9
    assert 0.3 < float(direct) < 0.99


def test_stronger_ridge_shrinks_the_weights():
    train = Moments(n_source=1, d_in=6, d_out=4, candidates=[[(0,)]])
    x, y = _rows(200, 7, torch.ones(6, 4), torch.zeros(4), 0.1)
    train.add([x], [y])
    weak, strong = train.solve(0, 0, [1e-6, 10.0])
    assert strong.weight.norm() < 0.5 * weak.weight.norm()


def test_a_group_of_layers_is_fitted_as_its_rows_side_by_side():
    g = torch.Generator().manual_seed(8)
    x0, x1 = torch.randn(400, 3, generator=g), torch.randn(400, 3, generator=g) + 1.0
    y = x0 @ torch.randn(3, 2, generator=g) + x1 @ torch.randn(3, 2, generator=g)  # needs both layers
    m = Moments(n_source=2, d_in=3, d_out=2, candidates=[[(0,), (1,), (0, 1)]])
    m.add([x0, x1], [y])
    fits = [m.solve(0, j, [1e-6])[0] for j in range(3)]
    assert fits[2].weight.shape == (6, 2)
    assert m.r2(0, 2, fits[2]) > 0.9999 > max(m.r2(0, 0, fits[0]), m.r2(0, 1, fits[1]))
    direct = torch.linalg.lstsq(torch.cat([torch.cat([x0, x1], 1), torch.ones(400, 1)], 1).double(), y.double()).solution
    torch.testing.assert_close(fits[2].weight, direct[:6], atol=1e-4, rtol=0)


def test_matching_the_variance_restores_each_outputs_spread_and_keeps_the_mean():
    g = torch.Generator().manual_seed(9)
    a, b = torch.randn(6, 4, generator=g), torch.randn(4, generator=g)
    m = Moments(n_source=1, d_in=6, d_out=4, candidates=[[(0,)]])
    x, y = _rows(2000, 10, a, b, 3.0)  # noisy: the ridge prediction is much narrower than y
    m.add([x], [y])
    f = m.solve(0, 0, [1e-3])[0]
    matched = m.match_variance(0, 0, f)
    pred, pm = x.double() @ f.weight + f.bias, x.double() @ matched.weight + matched.bias
    assert (pred.var(0) < 0.9 * y.double().var(0)).all()
    torch.testing.assert_close(pm.var(0), y.double().var(0), rtol=1e-3, atol=0)
    torch.testing.assert_close(pm.mean(0), y.double().mean(0), rtol=0, atol=1e-5)
    r_ridge, r_matched = m.r2(0, 0, f), m.r2(0, 0, matched)
    assert r_matched < r_ridge and abs(r_matched - (2 * r_ridge ** 0.5 - 1)) < 0.05
