"""Fixtures of the server tests: a shared tiny-qwen2 server with tokens for two trust domains."""

from __future__ import annotations

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("openai")

from serve_helpers import ServeProcess, make_home, write_tokens  # after the skips: needs openai


@pytest.fixture(scope="session")
def tiny_server(tmp_path_factory):
    """tiny-qwen2 behind tokens for two domains; small limits (0.5 MB of sessions, 1 MB bodies, 2 cache
    hops) so that tests can reach them."""
    root = tmp_path_factory.mktemp("serve-tiny")
    home = make_home(root)
    tokens = write_tokens(root / "tokens.json")
    server = ServeProcess(home, "--model", "tiny-qwen2", "--tokens", str(tokens), "--max-body-mb", "1",
                          "--session-budget-mb", "0.5", "--default-max-tokens", "16",
                          env={"C2C_MAX_HOPS": "2"}).start()
    yield server
    server.stop()



@pytest.fixture(scope="session")
def roomy_server(tmp_path_factory):
    """tiny-qwen2 with room for sessions of a few thousand tokens (the shared server keeps 0.5 MB), its default
    64-token prefill chunk."""
    root = tmp_path_factory.mktemp("serve-roomy")
    server = ServeProcess(make_home(root), "--model", "tiny-qwen2", "--tokens", str(write_tokens(root / "tokens.json")),
                          "--session-budget-mb", "64", "--default-max-tokens", "4").start()
    yield server
    server.stop()


@pytest.fixture(scope="session")
def qwen_server(tmp_path_factory):
    """The server's default model, Qwen2.5-Coder-0.5B-Instruct (a zoo model: tests that use it are marked zoo), with
    the two domains' tokens: tool calling, and the examples that call tools."""
    root = tmp_path_factory.mktemp("serve-qwen")
    server = ServeProcess(make_home(root), "--model", "Qwen2.5-Coder-0.5B-Instruct",
                          "--tokens", str(write_tokens(root / "tokens.json")), "--session-budget-mb", "64").start()
    yield server
    server.stop()
