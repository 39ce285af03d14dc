"""Tiny random-weight models of different depth, head size and RoPE base, sharing the byte vocabulary."""

from __future__ import annotations

import pytest
import torch

from c2c.runtime.transformers import tiny
from c2c.runtime.transformers import TransformersRuntime
from c2c.xmodel import FitConfig, fit

SHAPES = {  # name -> (seed, layers, head_dim, rope_theta)
    "small": (1, 3, 8, 10000.0),
    "big": (2, 5, 16, 1000000.0),
    "big_other": (3, 5, 16, 1000000.0),  # the shapes of "big", other weights
}


@pytest.fixture(scope="session")
def tiny_models(tmp_path_factory):
    root = tmp_path_factory.mktemp("xmodel-tiny")
    models = {}
    for name, (seed, layers, head_dim, theta) in SHAPES.items():
        tiny.build_tiny("qwen2", root / name, seed=seed, layers=layers, head_dim=head_dim, rope_theta=theta)
        models[name] = TransformersRuntime.load(root / name, name=f"tiny-{name}", dtype="float32")
    return models


@pytest.fixture(scope="session")
def streams():
    g = torch.Generator().manual_seed(0)
    return [torch.randint(0, 256, (48,), generator=g).tolist() for _ in range(12)]


@pytest.fixture(scope="session")
def small_to_big(tiny_models, streams):
    """A map between two models of different depth (3 -> 5 layers) and head size (8 -> 16)."""
    return fit(tiny_models["small"], tiny_models["big"], FitConfig(tokens=400, seq_len=48, layer_window=2),
               streams=streams, progress=False)
