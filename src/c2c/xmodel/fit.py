"""Fit a :class:`~c2c.xmodel.crossmap.CrossModelMap` from two models' K/V on the same token streams.

1. Both models prefill the same streams (:func:`c2c.xmodel.streams.token_streams`; the two must
   share a vocabulary). Keys lose their RoPE (each model's own, :mod:`c2c.xmodel.collect`).
2. The streams are split three ways: *train* (the fit), *calibration* (chooses, per target
   layer and for keys and values apart, the source layer among those within ``layer_window``
   of the proportional depth, and the ridge ``alpha`` from a grid), and *test* (the R² that
   goes into the map's report: held-out tokens that chose nothing). A target layer is
   predicted from its source layer and the ``span`` layers on each side of it, side by side
   (keys from keys, values from values): neighbouring layers carry what one layer misses.
3. The chosen fits are refitted on train + calibration, each output's spread matched to the
   target's (``match_variance``; see :meth:`~c2c.xmodel.ridge.Moments.match_variance`), and
   scored on test, before and after that matching.

Everything is closed form on the CPU (:mod:`c2c.xmodel.ridge`): the cost is the two prefills.
The first ``skip_first`` tokens of each stream (the attention sink, whose K/V depends on its
token alone) are left out of the fit: applying a map takes the target's own K/V there.
"""

from __future__ import annotations

import random
import time
from dataclasses import asdict, dataclass

import torch
from tqdm import tqdm

from c2c.artifact.fingerprint import Fingerprint
from c2c.canon import utc_now
from c2c.errors import ConfigError
from c2c.xmodel.collect import flat_plain, require_mappable
from c2c.xmodel.streams import CORPORA, token_streams
from c2c.xmodel.crossmap import KINDS, CrossModelMap, LayerFit
from c2c.xmodel.ridge import Moments, Residuals


@dataclass(frozen=True, kw_only=True)
class FitConfig:
    """How a map is fitted.

    Attributes:
        tokens: tokens of the train + calibration streams (rounded up to whole streams).
        test_tokens: held-out tokens for the reported R² (default ``tokens // 8``).
        seq_len: tokens per stream (deep positions matter: use the longest context you will map).
        calib_fraction: share of the non-test streams that chooses layers and ``alpha``.
        alphas: ridge strengths to choose from, relative to the mean eigenvalue of ``XᵀX``.
        layer_window: source layers within this many of the proportional depth are candidates.
        span: the map reads the chosen source layer and this many on each side (0: that layer alone).
        match_variance: scale each output's spread to the target's (sharper attention over mapped
            keys; on 8 development questions of seed 5 the answer's log-probability under the mapped
            cache went from -9.6 to -4.9 nats, the target's own cache giving -0.5).
        skip_first: tokens at the start of each stream left out of the fit.
        seed: stream order and split.
    """

    tokens: int = 32768
    test_tokens: int | None = None
    seq_len: int = 1024
    calib_fraction: float = 0.25
    alphas: tuple[float, ...] = (1e-5, 1e-4, 1e-3, 1e-2, 1e-1, 1.0)
    layer_window: int = 3
    span: int = 1
    match_variance: bool = True
    skip_first: int = 1
    seed: int = 0

    def __post_init__(self) -> None:
        if self.tokens < 1 or self.seq_len <= self.skip_first or self.layer_window < 0 or self.span < 0:
            raise ConfigError(f"tokens={self.tokens}, seq_len={self.seq_len}, layer_window={self.layer_window}: "
                              "give tokens >= 1, seq_len > skip_first and layer_window >= 0")
        if not 0 < self.calib_fraction < 1 or not self.alphas or any(a <= 0 for a in self.alphas):
            raise ConfigError("calib_fraction must lie in (0, 1) and alphas be positive numbers")


def candidates(n_source: int, n_target: int, window: int) -> list[list[int]]:
    """For each target layer, the source layers within ``window`` of its proportional depth."""
    out = []
    for t in range(n_target):
        centre = round(t * (n_source - 1) / max(n_target - 1, 1))
        out.append(list(range(max(0, centre - window), min(n_source, centre + window + 1))))
    return out


def group(s: int, span: int, n_source: int) -> tuple[int, ...]:
    """The source layers a map reads for source layer ``s``: ``s - span ... s + span``, clipped."""
    return tuple(range(max(0, s - span), min(n_source, s + span + 1)))


def split(n_streams: int, n_test: int, calib_fraction: float, seed: int) -> dict[str, list[int]]:
    """Stream indices of the train, calibration and test splits (disjoint, each non-empty)."""
    if n_streams < 3:
        raise ConfigError(f"{n_streams} streams: a fit needs at least 3 (train, calibration, test); "
                          "ask for more tokens or shorter streams")
    order = list(range(n_streams))
    random.Random(seed).shuffle(order)
    n_test = min(max(1, n_test), n_streams - 2)
    rest = order[n_test:]
    n_cal = min(max(1, round(len(rest) * calib_fraction)), len(rest) - 1)
    return {"train": sorted(rest[n_cal:]), "calib": sorted(rest[:n_cal]), "test": sorted(order[:n_test])}


def fit(source, target, config: FitConfig = FitConfig(), *, streams: list[list[int]] | None = None,
        progress: bool = True) -> CrossModelMap:
    """Fit the map ``source`` -> ``target`` (two transformers runtimes sharing a vocabulary).

    Args:
        streams: token id streams to use instead of the training corpora (tests).
        progress: show progress bars (stderr).

    Raises:
        ConfigError: the models do not share a vocabulary, or too few streams.
        RuntimeUnsupportedError: a backend without RoPE access, or sliding-window layers.
    """
    require_mappable(source)
    require_mappable(target)
    if source.vocab_digest != target.vocab_digest:
        raise ConfigError(f"{source.name} and {target.name} do not share a vocabulary; a cross-model map needs the "
                          "same token ids on both sides (use a trained fuser for this pair)")
    t0 = time.perf_counter()
    test_tokens = config.test_tokens if config.test_tokens is not None else max(config.tokens // 8, 1)
    given = streams is not None
    if streams is None:
        streams = token_streams(source, config.tokens + test_tokens, seq_len=config.seq_len, seed=config.seed)
    n_test = round(len(streams) * test_tokens / (config.tokens + test_tokens))
    parts = split(len(streams), n_test, config.calib_fraction, config.seed)
    Ls, Lt = source.facts.num_layers, target.facts.num_layers
    d_in = source.facts.kv_heads * source.facts.head_dim
    d_out = target.facts.kv_heads * target.facts.head_dim
    cands = candidates(Ls, Lt, config.layer_window)
    groups = [[group(s, config.span, Ls) for s in c] for c in cands]
    moments = {p: {kind: Moments(n_source=Ls, d_in=d_in, d_out=d_out, candidates=groups) for kind in KINDS}
               for p in ("train", "calib")}
    skip = config.skip_first

    def rows(ids):  # both models' un-rotated K and V of one stream, first tokens dropped: (T', d) each
        xk, xv = flat_plain(source, source.prefill(ids)[1])
        yk, yv = flat_plain(target, target.prefill(ids)[1])
        cut = lambda ts: [x[skip:] for x in ts]  # noqa: E731
        return {"k": (cut(xk), cut(yk)), "v": (cut(xv), cut(yv))}

    seen = [(p, i) for p in ("train", "calib") for i in parts[p]]
    for p, i in tqdm(seen, desc=f"K/V of {source.name} and {target.name}", unit="stream", disable=not progress):
        for kind, (xs, ys) in rows(streams[i]).items():
            moments[p][kind].add(xs, ys)

    # choose (source layer, alpha) per target layer on calibration, refit on train + calibration
    chosen: dict[str, list[tuple[int, float, float]]] = {}
    fits: dict[str, list] = {}
    ridge: dict[str, list] = {}
    for kind in KINDS:
        train, calib = moments["train"][kind], moments["calib"][kind]
        chosen[kind], fits[kind] = [], []
        for t in range(Lt):
            best = None
            for j in range(len(cands[t])):
                for a, f in zip(config.alphas, train.solve(t, j, list(config.alphas))):
                    r2 = calib.r2(t, j, f)
                    if best is None or r2 > best[2]:
                        best = (j, a, r2)
            chosen[kind].append(best)
        train += calib
        ridge[kind] = [train.solve(t, j, [a])[0] for t, (j, a, _) in enumerate(chosen[kind])]
        fits[kind] = [train.match_variance(t, j, f) if config.match_variance else f
                      for t, ((j, _, _), f) in enumerate(zip(chosen[kind], ridge[kind]))]
    del moments

    # held-out R² on the test streams
    res = {kind: Residuals(Lt) for kind in KINDS}
    res_ridge = {kind: Residuals(Lt) for kind in KINDS}
    for i in tqdm(parts["test"], desc="held-out R²", unit="stream", disable=not progress):
        for kind, (xs, ys) in rows(streams[i]).items():
            for t, (j, _, _) in enumerate(chosen[kind]):
                f, r = fits[kind][t], ridge[kind][t]
                x = torch.cat([xs[s] for s in groups[t][j]], 1).double()       # (T', G * d_in)
                res[kind].add(t, ys[t], x @ f.weight + f.bias)                  # (T', d_out)
                res_ridge[kind].add(t, ys[t], x @ r.weight + r.bias)

    weights, layers = {}, []
    for t in range(Lt):
        lf = {}
        for kind in KINDS:
            j, a, r2c = chosen[kind][t]
            f = fits[kind][t]
            weights[f"{kind}.{t:03d}.weight"] = f.weight.float().contiguous()
            weights[f"{kind}.{t:03d}.bias"] = f.bias.float().contiguous()
            lf[kind] = LayerFit(source=cands[t][j], sources=groups[t][j], alpha=a, r2=res[kind].r2(t),
                                r2_ridge=res_ridge[kind].r2(t), r2_calib=r2c)
        layers.append(lf)
    report = {"config": {k: (list(v) if isinstance(v, tuple) else v) for k, v in asdict(config).items()}
              | {"test_tokens": test_tokens},
              "corpora": [] if given else list(CORPORA),
              "streams": {p: len(parts[p]) for p in parts}, "seq_len": max(len(s) for s in streams),
              "tokens": {p: sum(max(len(streams[i]) - skip, 0) for i in parts[p]) for p in parts},
              "candidates": cands,
              "seconds": round(time.perf_counter() - t0, 1), "torch": torch.__version__}
    return CrossModelMap(source=Fingerprint.of(source), target=Fingerprint.of(target),
                         vocab_digest=source.vocab_digest, layers=tuple(layers), weights=weights, fit=report,
                         created=utc_now())
