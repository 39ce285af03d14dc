"""Helpers of the server tests: tokens for two trust domains, and a `c2c serve` subprocess (c2c.testing.server_process)."""

from __future__ import annotations

from pathlib import Path

import openai

from c2c.testing import server_process as _serve
from c2c.testing.server_process import c2c_field, make_home  # noqa: F401  (re-exported for the tests)

TOKENS = {
    "analyst": ("tok-analyst-0123456789abcdef", "research"),
    "writer": ("tok-writer-0123456789abcdef", "research"),
    "outsider": ("tok-outsider-0123456789abcdef", "other"),
}
SYSTEM = {"role": "system", "content": "You are one agent of a two-agent team. Be brief."}


def write_tokens(path: Path) -> Path:
    return _serve.write_tokens(path, TOKENS)


class ServeProcess(_serve.ServeProcess):
    """A server the test owns, with openai clients for the test's agents."""

    def start(self, timeout_s: float = 120) -> "ServeProcess":
        return super().start(timeout_s)

    def client(self, agent: str | None = None, **kw) -> "openai.OpenAI":
        key = TOKENS[agent][0] if agent else "no-token-needed"
        return openai.OpenAI(base_url=self.base_url, api_key=key, max_retries=0, timeout=60, **kw)

    def headers(self, agent: str) -> dict[str, str]:
        return {"Authorization": f"Bearer {TOKENS[agent][0]}"}

    def store_url(self) -> str:
        return f"sqlite:///{self.home / 'store'}"


def chat(client, messages, *, c2c: dict | None = None, max_tokens: int = 8, **kw):
    """A greedy completion (temperature 0) through the openai client."""
    return client.chat.completions.create(model="tiny-qwen2", messages=messages, max_tokens=max_tokens,
                                          temperature=0, extra_body={"c2c": c2c} if c2c else None, **kw)

