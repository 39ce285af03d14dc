"""Shared fixtures: tiny random models for fast tests, real zoo models for marked ones.

Models live in C2C_HOME (default ~/.cache/c2c); `.ci/run` pulls the zoo models
the suite needs before pytest starts, so that progress is visible there.
"""

from __future__ import annotations

import pytest

from c2c.runtime import zoo

_cache: dict = {}


def _load(name: str):
    if name not in _cache:
        _cache[name] = zoo.load(name)
    return _cache[name]


@pytest.fixture(scope="session")
def tiny():
    """``tiny("qwen2")`` -> a Runtime of a tiny random-weight model (llama, qwen2, gemma3)."""
    return lambda arch: _load(f"tiny-{arch}")


@pytest.fixture(scope="session")
def zoo_model():
    """``zoo_model(NAME)`` -> a Runtime of a real zoo model (pulled on first use)."""
    return _load
