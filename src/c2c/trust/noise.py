"""Calibrated Gaussian noise on exported K/V: a privacy knob with a measured cost.

For each layer, each KV head and each of K and V separately, the noise is
``N(0, (sigma * std)^2)``, where ``std`` is the standard deviation of that head's
entries over positions and head_dim. ``sigma`` is thus a fraction of the signal's
own spread and means the same thing in every layer and every model; K and V
scales differ by orders of magnitude (e.g. layer 0 of Qwen2.5: rms 35 vs 0.03).

What it costs in accuracy is measured by ``benchmarks/trust_noise.py``
(``benchmarks/results/trust_noise.md``). It is not a formal privacy guarantee
(no differential-privacy accounting): it blurs, it does not bound, what an
inversion can recover.

NOTE: a noisy cache no longer matches its tokens, so ``sample``/``strict``
verification (:mod:`c2c.trust.verify`) refuses it at the default tolerance. The
receiver relies on the signature for noisy artifacts, or raises the policy's
tolerance knowingly. :func:`noise_label` records the setting in the header's
``extra`` so the receiver can tell.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, replace

import torch

from c2c.errors import ConfigError
from c2c.runtime.kvcache import KVCache


@dataclass(frozen=True, kw_only=True)
class NoiseConfig:
    """Noise for exported K/V.

    Attributes:
        sigma: noise std as a fraction of each head's own std (0 = off).
        keys: noise the keys.
        values: noise the values.
        seed: fixed seed (tests, benchmarks); ``None`` draws one from ``os.urandom``.
    """

    sigma: float
    keys: bool = True
    values: bool = True
    seed: int | None = None

    def __post_init__(self) -> None:
        if not (isinstance(self.sigma, (int, float)) and 0 <= self.sigma <= 10):
            raise ConfigError(f"noise sigma={self.sigma!r}: give a fraction between 0 and 10")


def add_noise(cache: KVCache, config: NoiseConfig) -> KVCache:
    """A copy of ``cache`` with calibrated Gaussian noise (see module docstring)."""
    if config.sigma == 0 or cache.seq_len == 0:
        return cache
    seed = config.seed if config.seed is not None else int.from_bytes(os.urandom(8), "little")
    gen = torch.Generator(device="cpu").manual_seed(seed)

    def noisy(t: torch.Tensor) -> torch.Tensor:
        # t: (1, H, T, D); std per head over (T, D) -> (1, H, 1, 1)
        tf = t.float()
        std = tf.std(dim=(2, 3), keepdim=True, unbiased=False) if tf.shape[2] * tf.shape[3] > 1 \
            else tf.abs().amax(dim=(2, 3), keepdim=True)
        eps = torch.randn(tf.shape, generator=gen, dtype=torch.float32).to(t.device)
        return (tf + config.sigma * std * eps).to(t.dtype)

    keys = tuple(noisy(k) if config.keys else k for k in cache.keys)
    values = tuple(noisy(v) if config.values else v for v in cache.values)
    return replace(cache, keys=keys, values=values)


def noise_label(config: NoiseConfig) -> dict:
    """What to put in ``Artifact.build(extra={"noise": ...})`` (never the seed)."""
    return {"sigma": float(config.sigma), "keys": config.keys, "values": config.values, "kind": "gaussian-per-head"}
