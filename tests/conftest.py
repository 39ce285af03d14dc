"""Shared fixtures: tiny random models for fast tests, real zoo models for marked ones.

Models live in C2C_HOME (default ~/.cache/c2c); `.ci/run` pulls the zoo models
the suite needs before pytest starts, so that progress is visible there.

The suite runs models in float32, the reference numerics (``C2C_DTYPE=float32``
unless the caller set it; server subprocesses inherit it). bf16, the default on
CPUs that have it, is tested explicitly (``tests/runtime/test_dtype.py``).

Tests marked ``needs_data`` read the shared benchmark data (``C2C_DATA``, else
``../shared/data`` beside the checkout). Where that folder is absent they skip,
saying so; under CI (``CI`` set, as CI runs ``.ci/run``) they fail instead, so
that CI never passes without them.
"""

from __future__ import annotations

import os

import pytest

os.environ.setdefault("C2C_DTYPE", "float32")

from c2c.runtime import zoo

_cache: dict = {}


def _load(name: str, dtype: str | None = None, backend: str | None = None):
    if (name, dtype, backend) not in _cache:
        _cache[name, dtype, backend] = zoo.load(name, dtype=dtype, backend=backend)
    return _cache[name, dtype, backend]


NEEDS_DATA = "needs the shared benchmark data: set C2C_DATA to its folder (the workplace's ../shared/data)"


def _data_absent() -> str | None:
    """Why a ``needs_data`` test cannot run here, or None where the data folder is there."""
    from c2c.config import data_dir

    root = data_dir()
    return None if root.is_dir() else f"{NEEDS_DATA}; {root} is absent"


def _ci() -> bool:
    return bool(os.environ.get("CI"))  # as the store and serve tests read it


def pytest_collection_modifyitems(items):
    """Without the data, each ``needs_data`` test skips, the reason at its own line (not under CI: see below)."""
    why = None if _ci() else _data_absent()
    if why is None:
        return
    for item in items:
        if item.get_closest_marker("needs_data"):
            item.add_marker(pytest.mark.skip(reason=why))


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
    """Under CI, a ``needs_data`` test without the data fails, before its fixtures load anything."""
    if _ci() and item.get_closest_marker("needs_data") and (why := _data_absent()):
        pytest.fail(f"{why} (CI={os.environ['CI']} requires it: CI never skips these tests)", pytrace=False)


@pytest.fixture(scope="session", autouse=True)
def _close_runtimes():
    """Close llama.cpp runtimes before the interpreter shuts down (their finalizers fail after it)."""
    yield
    for rt in _cache.values():
        close = getattr(rt, "close", None)
        if close is not None:
            close()


@pytest.fixture(scope="session")
def tiny():
    """``tiny("qwen2")`` -> a Runtime of a tiny random-weight model (llama, qwen2, gemma3)."""
    return lambda arch: _load(f"tiny-{arch}")


@pytest.fixture(scope="session")
def zoo_model():
    """``zoo_model(NAME, dtype=None, backend=None)`` -> a runtime of a real zoo model (pulled on first use)."""
    return _load


# ------------------------------------------------- cross-model maps (c2c.xmodel) between tiny models
# Tiny random-weight models of different depth, head size and RoPE base, sharing the byte vocabulary.
XMODEL_SHAPES = {  # name -> (seed, layers, head_dim, rope_theta)
    "small": (1, 3, 8, 10000.0),
    "big": (2, 5, 16, 1000000.0),
    "big_other": (3, 5, 16, 1000000.0),  # the shapes of "big", other weights
}


@pytest.fixture(scope="session")
def tiny_models(tmp_path_factory):
    """``{"small", "big", "big_other"}`` -> a float32 runtime of that tiny model."""
    from c2c.runtime.transformers import TransformersRuntime, tiny as tiny_build

    root = tmp_path_factory.mktemp("xmodel-tiny")
    models = {}
    for name, (seed, layers, head_dim, theta) in XMODEL_SHAPES.items():
        tiny_build.build_tiny("qwen2", root / name, seed=seed, layers=layers, head_dim=head_dim, rope_theta=theta)
        models[name] = TransformersRuntime.load(root / name, name=f"tiny-{name}", dtype="float32")
    return models


@pytest.fixture(scope="session")
def streams():
    import torch

    g = torch.Generator().manual_seed(0)
    return [torch.randint(0, 256, (48,), generator=g).tolist() for _ in range(12)]


@pytest.fixture(scope="session")
def small_to_big(tiny_models, streams):
    """A map between two models of different depth (3 -> 5 layers) and head size (8 -> 16)."""
    from c2c.xmodel import FitConfig, fit

    return fit(tiny_models["small"], tiny_models["big"], FitConfig(tokens=400, seq_len=48, layer_window=2),
               streams=streams, progress=False)


@pytest.fixture(scope="session")
def map_offer():
    """``map_offer(xmap, earned=True)`` -> a :class:`c2c.xmodel.MapOffer` with a calibration record for that
    very map that says it beats the source alone (``earned=False``: a record that does not; ``None``: none)."""
    from c2c.xmodel import MapCalibration, MapOffer

    def make(xmap, earned: bool | None = True):
        rec = None if earned is None else MapCalibration(
            map_id=xmap.id, task="context_qa doc_tokens=256 seed=1", n=100, mapped_correct=70 if earned else 52,
            source_correct=50, diff_ci95=(0.08, 0.32) if earned else (-0.06, 0.10), target_correct=80)
        return MapOffer.of(xmap, rec)

    return make
