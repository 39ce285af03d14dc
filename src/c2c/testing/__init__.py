"""Helpers for tests and benchmarks of c2c and of code built on it.

- :class:`RedisServer`: a real ``redis-server`` subprocess on a free loopback
  port with its own directory, started and stopped by the caller.
- :func:`free_port`: a free TCP port on 127.0.0.1.
- :func:`wait_for_http`: wait for a server subprocess to answer on a URL (or say why it did not).

- :mod:`c2c.testing.server_process`: a real ``c2c serve`` subprocess on a loopback port.
- :mod:`c2c.testing.synthetic`: artifacts of random K/V for a made-up model (no model needed).
- :mod:`c2c.testing.templates`: chat templates for rendering tests (one that is not prefix-stable).
- :mod:`c2c.testing.hostile`: bad artifacts with the error each must get, and
  hypothesis strategies for byte- and field-level fuzzing (needs ``hypothesis``).

Tiny random-weight models are zoo entries (``c2c.runtime.zoo.load("tiny-qwen2")``).
Nothing here runs at import.
"""

from __future__ import annotations

import shutil
import signal
import socket
import subprocess
import time
import uuid
from pathlib import Path
from typing import Callable


def _binary() -> str:
    found = shutil.which("redis-server")
    if found is None:
        raise RuntimeError("redis-server is not on PATH (install it: apt-get install -y redis-server)")
    return found


def wait_for_http(proc: subprocess.Popen, url: str, *, name: str, log: Callable[[], str], timeout_s: float,
                  every_s: float = 0.1, request_timeout_s: float = 1.0) -> None:
    """Wait until ``url`` answers 200 while ``proc``, a server starting up, runs.

    Raises:
        RuntimeError: ``proc`` exited, or ``url`` did not answer within ``timeout_s``; with the tail of ``log()``.
    """
    import httpx  # lazy: the serve extra; c2c.testing imports without it

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{name} exited with {proc.returncode}:\n{log()[-4000:]}")
        try:
            if httpx.get(url, timeout=request_timeout_s).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(every_s)
    raise RuntimeError(f"{name} did not answer {url} within {timeout_s:.0f} s:\n{log()[-4000:]}")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class RedisServer:
    """A redis-server subprocess on 127.0.0.1 that the caller owns (``start()`` / ``stop()``)."""

    def __init__(self, directory: Path, *, appendonly: bool = False, appendfsync: str = "everysec",
                 extra: tuple[str, ...] = (), tls: tuple[Path, Path] | None = None, binary: str | None = None):
        self.dir = Path(directory)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        self.tls = tls  # (cert, key); the self-signed cert is its own CA
        ports = ["--port", str(self.port)] if tls is None else [
            "--port", "0", "--tls-port", str(self.port), "--tls-cert-file", str(tls[0]), "--tls-key-file",
            str(tls[1]), "--tls-ca-cert-file", str(tls[0]), "--tls-auth-clients", "no"]
        self.args = [binary or _binary(), *ports, "--bind", "127.0.0.1", "--dir", str(self.dir),
                     "--save", "", "--appendonly", "yes" if appendonly else "no", "--appendfsync", appendfsync,
                     "--daemonize", "no", "--logfile", str(self.dir / "redis.log"), *extra]
        self.proc: subprocess.Popen | None = None

    def start(self, *, timeout: float = 15.0) -> "RedisServer":
        """Start the server and wait (up to ``timeout`` s) until it takes a write.

        Raises:
            RuntimeError: it exited, or did not come up in time; either way no process is left running.
        """
        self.proc = subprocess.Popen(self.args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            self._wait_ready(timeout)
        except BaseException:
            self.stop(signal.SIGKILL)  # a server that never came up is not left behind
            raise
        return self

    def _wait_ready(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                log = self.dir / "redis.log"
                tail = log.read_text(errors="replace")[-2000:] if log.is_file() else "(no log)"
                raise RuntimeError(f"redis-server exited with {self.proc.returncode}:\n{tail}")
            try:
                with self.client(socket_connect_timeout=0.2) as r:
                    if r.ping():
                        # loading an AOF answers PING with -LOADING; wait for a real write
                        r.set("__c2c_probe", "1")
                        r.delete("__c2c_probe")
                        return
            except Exception:  # noqa: BLE001 - redis-py's errors; the server is still starting
                time.sleep(0.05)
        raise RuntimeError(f"redis-server did not come up on port {self.port} within {timeout} s")

    def stop(self, sig: int = signal.SIGTERM) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=5)
        self.proc = None

    def restart(self, sig: int = signal.SIGTERM) -> None:
        self.stop(sig)
        self.start()

    def url(self, domain: str | None = None, db: int = 0, **options) -> str:
        domain = domain or f"t{uuid.uuid4().hex[:10]}"
        if self.tls:
            options = {"ssl_ca_certs": self.tls[0], **options}
        query = "&".join([f"domain={domain}", *(f"{k}={v}" for k, v in options.items())])
        return f"{'rediss' if self.tls else 'redis'}://127.0.0.1:{self.port}/{db}?{query}"

    def client(self, **kw):
        """A redis-py client of this server (needs the ``redis`` extra)."""
        import redis as redis_py  # lazy: c2c.testing imports without redis-py

        if self.tls:
            kw.update(ssl=True, ssl_ca_certs=str(self.tls[0]))
        return redis_py.Redis(host="127.0.0.1", port=self.port, **kw)
