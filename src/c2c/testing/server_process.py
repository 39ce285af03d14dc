"""A real `c2c serve` subprocess on a loopback port, for tests and benchmarks (needs the ``serve`` extra).

``ServeProcess`` starts ``python -m c2c.cli.main serve ...`` with its own
``C2C_HOME`` (keys, store; the models directory linked to one already pulled),
waits for ``/healthz`` and stops it with SIGTERM. Callers drive it over HTTP with
the real ``openai`` client or httpx: nothing below HTTP is mocked.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

from c2c.config import c2c_home
from c2c.testing import free_port, wait_for_http


def make_home(root: Path, models: Path | None = None) -> Path:
    """A private ``root/home`` whose ``models`` links to ``models`` (default: this C2C_HOME's, not copied)."""
    home = root / "home"
    home.mkdir(mode=0o700, parents=True)
    source = models or c2c_home() / "models"
    source.mkdir(parents=True, exist_ok=True)
    (home / "models").symlink_to(source, target_is_directory=True)
    return home


def write_tokens(path: Path, tokens: dict[str, tuple[str, str]]) -> Path:
    """A 0600 tokens file from ``{agent: (token, domain)}``."""
    path.write_text(json.dumps({tok: {"agent": agent, "domain": domain} for agent, (tok, domain) in tokens.items()}))
    path.chmod(0o600)
    return path


def c2c_field(response) -> dict:
    """The ``c2c`` field of an openai-client response."""
    return (response.model_extra or {}).get("c2c") or {}


class ServeProcess:
    """One `c2c serve` process that the caller owns (``start()`` / ``stop()``); its port survives restarts."""

    def __init__(self, home: Path, *args: str, port: int | None = None, log_dir: Path | None = None,
                 env: dict[str, str] | None = None):
        self.home = home
        self.port = port or free_port()
        self.log_path = (log_dir or home.parent) / f"serve-{self.port}.log"
        self.cmd = [sys.executable, "-m", "c2c.cli.main", "serve", "--port", str(self.port), *args]
        self.env = {k: v for k, v in os.environ.items() if k not in ("C2C_STORE", "C2C_MAX_HOPS")}
        self.env.update({"C2C_HOME": str(home), "C2C_THREADS": "1", **(env or {})})
        self.proc: subprocess.Popen | None = None
        self._log = None

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    def start(self, timeout_s: float = 300) -> "ServeProcess":
        self._log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(self.cmd, env=self.env, stdout=self._log, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL)
        try:
            wait_for_http(self.proc, self.url("/healthz"), name="c2c serve", log=self.log, timeout_s=timeout_s)
        except RuntimeError:
            self.stop()  # nothing left running, and the log closed
            raise
        return self

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
