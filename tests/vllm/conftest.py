"""A real ``vllm serve`` with c2c's connector, on a real redis-server store, for the session.

Skipped (with the reason) when ``.venv-vllm`` is absent (``bash scripts/setup_vllm.sh``
makes it), when redis-server is not on PATH, or when the zoo model is not pulled. vLLM runs
SmolLM2-135M-Instruct (c2c's converted safetensors) in float32, the suite's dtype.
"""

from __future__ import annotations

import shutil

import pytest

from c2c.testing import RedisServer
from c2c.testing.vllm import VllmProcess, vllm_python

from vllm_helpers import DOMAIN, MODEL, model_dir


def _skip_reason() -> str | None:
    if vllm_python() is None:
        return "no vLLM environment (.venv-vllm): run `bash scripts/setup_vllm.sh`"
    if shutil.which("redis-server") is None:
        return "redis-server is not on PATH"
    if model_dir() is None:
        return f"zoo model {MODEL} is not pulled (`c2c models pull {MODEL}`)"
    return None


def pytest_collection_modifyitems(config, items):
    reason = _skip_reason()
    if reason:
        for item in items:
            if item.path.parent.name == "vllm" and "vllm" in item.keywords:
                item.add_marker(pytest.mark.skip(reason=reason))


@pytest.fixture(scope="session")
def vllm_redis(tmp_path_factory):
    server = RedisServer(tmp_path_factory.mktemp("vllm-redis")).start()
    yield server
    server.stop()


@pytest.fixture(scope="session")
def vllm_server(tmp_path_factory, vllm_redis):
    """``vllm serve`` (domain ``research``) with the connector and its middleware, on the session's Redis."""
    root = tmp_path_factory.mktemp("vllm-a")
    store = f"redis://127.0.0.1:{vllm_redis.port}/0"
    server = VllmProcess(model_dir(), root / "home", store=store, domain=DOMAIN, name="smol").start()
    server.store_url = store
    yield server
    server.stop()
