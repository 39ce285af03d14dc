"""Shared fixtures: tiny random models for fast tests, real zoo models for marked ones.

Models live in C2C_HOME (default ~/.cache/c2c); `.ci/run` pulls the zoo models
the suite needs before pytest starts, so that progress is visible there.

The suite runs models in float32, the reference numerics (``C2C_DTYPE=float32``
unless the caller set it; server subprocesses inherit it). bf16, the default on
CPUs that have it, is tested explicitly (``tests/runtime/test_dtype.py``).
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
