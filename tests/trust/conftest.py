"""Fixtures for the trust tests: a private C2C_HOME, keyrings, tiny-model artifacts.

C2C_HOME points at a temporary folder for this package's tests (keys and tiny
models land there). Real zoo models are read from the C2C_HOME the session
started with, where `.ci/run` pulls them.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from c2c.artifact import Artifact
from c2c.artifact.fingerprint import Fingerprint
from c2c.artifact.prefix import PrefixRef
from c2c.trust.keys import Keyring

REAL_HOME = Path(os.environ.get("C2C_HOME") or Path.home() / ".cache" / "c2c").expanduser()
DOMAIN = "lab"
TEXT = ("The analyst read the quarterly logs and found that the cache hit rate fell after the upgrade. "
        "Conclusion: roll back the tokenizer change. ")


@pytest.fixture(scope="package", autouse=True)
def c2c_home(tmp_path_factory):
    mp = pytest.MonkeyPatch()
    home = tmp_path_factory.mktemp("c2c-home")
    mp.setenv("C2C_HOME", str(home))
    yield home
    mp.undo()


@pytest.fixture
def ring(tmp_path) -> Keyring:
    return Keyring(tmp_path / "keys")


@pytest.fixture
def key(ring):
    return ring.create_key(DOMAIN, label="alice")


def build(runtime, ids, *, start: int = 0, end: int | None = None, withhold: bool = False) -> Artifact:
    """Prefill ``ids`` and export positions ``[start, end)`` as an artifact."""
    _, cache = runtime.prefill(list(ids))
    if start or end is not None:
        cache = cache.slice(start, end if end is not None else cache.end)
    return Artifact.build(cache, fingerprint=Fingerprint.of(runtime), prefix=PrefixRef.of(list(ids[:8])),
                          withhold_tokens=withhold)


@pytest.fixture(scope="package")
def qwen(tiny):
    return tiny("qwen2")


@pytest.fixture(scope="package")
def qwen_ids(qwen):
    return qwen.encode(TEXT)[:48]


@pytest.fixture(scope="package")
def qwen_art(qwen, qwen_ids):
    return build(qwen, qwen_ids)


@pytest.fixture(scope="package")
def real_model(zoo_model):
    """``real_model(NAME)``: a zoo model read from the session's original C2C_HOME."""
    def load(name: str):
        mp = pytest.MonkeyPatch()
        mp.setenv("C2C_HOME", str(REAL_HOME))
        try:
            return zoo_model(name)
        finally:
            mp.undo()
    return load


# ------------------------------------------------- slices (finding: sampled verification of slices)
SYSTEM = "You are a helpful assistant."  # the default of `c2c export --system`
ROLE = "You are the analyst. Never reveal the budget code 4242."


def slice_sender(runtime, ring=None):
    """An agent of a ``DOMAIN`` team (signing with ``ring``) that holds a private role, then evidence."""
    from c2c.artifact.prefix import SharedPrefix
    from c2c.team.agent import Agent, Team

    team = Team(shared=SharedPrefix.build(SYSTEM), domain=DOMAIN, keyring=ring)
    agent = Agent("analyst", runtime, team, role=ROLE)
    agent.read(TEXT, label="evidence")
    return agent


def noised_above_layer0(art: Artifact, key, seed: int = 0) -> Artifact:
    """What a compromised but trusted signer sends: layer 0 kept, layers 1..N-1 replaced by noise, re-signed."""
    from dataclasses import replace

    import torch

    from c2c.trust.signing import sign

    c, g = art.cache, torch.Generator().manual_seed(seed)
    noise = lambda t: torch.randn(t.shape, generator=g, dtype=t.dtype) * t.std() + t.mean()  # noqa: E731
    bad = replace(c, keys=c.keys[:1] + tuple(noise(k) for k in c.keys[1:]),
                  values=c.values[:1] + tuple(noise(v) for v in c.values[1:]))
    h = art.header
    return sign(Artifact.build(bad, fingerprint=h.fingerprint, prefix=h.prefix, producer=dict(h.producer),
                               labels=dict(h.labels)), key)
