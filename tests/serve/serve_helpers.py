"""A real `c2c serve` subprocess on a free loopback port, and the tokens and homes it runs with.

``ServeProcess`` starts ``python -m c2c.cli.main serve ...`` with its own
``C2C_HOME`` (keys, store; the models directory is linked to the one the suite
already pulled), waits for ``/healthz`` and stops it with SIGTERM. Tests drive it
over HTTP with the real ``openai`` client or httpx: nothing below HTTP is mocked.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import openai

from c2c.config import c2c_home
from c2c.testing import free_port

TOKENS = {
    "analyst": ("tok-analyst-0123456789abcdef", "research"),
    "writer": ("tok-writer-0123456789abcdef", "research"),
    "outsider": ("tok-outsider-0123456789abcdef", "other"),
}
SYSTEM = {"role": "system", "content": "You are one agent of a two-agent team. Be brief."}


def make_home(root: Path) -> Path:
    """A private C2C_HOME whose models are the suite's (linked, not copied)."""
    home = root / "home"
    home.mkdir(mode=0o700)
    models = c2c_home() / "models"
    models.mkdir(parents=True, exist_ok=True)
    (home / "models").symlink_to(models, target_is_directory=True)
    return home


def write_tokens(path: Path) -> Path:
    path.write_text(json.dumps({tok: {"agent": agent, "domain": domain} for agent, (tok, domain) in TOKENS.items()}))
    path.chmod(0o600)
    return path


class ServeProcess:
    """One `c2c serve` process that the test owns (``start()`` / ``stop()``)."""

    def __init__(self, home: Path, *args: str, env: dict[str, str] | None = None):
        self.home = home
        self.port = free_port()
        self.log_path = home.parent / f"serve-{self.port}.log"
        self.cmd = [sys.executable, "-m", "c2c.cli.main", "serve", "--port", str(self.port), *args]
        self.env = {k: v for k, v in os.environ.items() if k not in ("C2C_STORE", "C2C_MAX_HOPS")}
        self.env.update({"C2C_HOME": str(home), "C2C_THREADS": "1", **(env or {})})
        self.proc: subprocess.Popen | None = None

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    def start(self, timeout_s: float = 120) -> "ServeProcess":
        self._log = open(self.log_path, "wb")
        self.proc = subprocess.Popen(self.cmd, env=self.env, stdout=self._log, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"c2c serve exited with {self.proc.returncode}:\n{self.log()[-3000:]}")
            try:
                if httpx.get(self.url("/healthz"), timeout=1).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        self.stop()
        raise RuntimeError(f"c2c serve did not come up on port {self.port}:\n{self.log()[-3000:]}")

    def stop(self, sig: int = signal.SIGTERM, timeout_s: float = 30) -> int | None:
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
        rc, self.proc = self.proc.returncode, None
        self._log.close()
        return rc

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

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


def c2c_field(response) -> dict:
    return (response.model_extra or {}).get("c2c") or {}
