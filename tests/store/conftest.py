"""Store fixtures: one store per backend URL, and redis-server processes the tests own.

Every Redis test starts its own ``redis-server`` (from PATH) on a free loopback
port with a temporary directory, and stops it afterwards; nothing talks to a
Redis the tests did not start. Without the binary, Redis tests skip, or fail
when ``CI`` is set (CI must install it: ``apt-get install -y redis-server``).
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
import uuid
from pathlib import Path

import pytest
import redis as redis_py

from c2c.store import open_store

REDIS_BIN = shutil.which("redis-server")


def require_redis() -> str:
    if REDIS_BIN is None:
        msg = "redis-server is not on PATH (install it: apt-get install -y redis-server)"
        if os.environ.get("CI"):
            pytest.fail(msg + "; CI must run the Redis backend tests")
        pytest.skip(msg)
    return REDIS_BIN


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class RedisServer:
    """A redis-server subprocess on 127.0.0.1 that this test session owns."""

    def __init__(self, directory: Path, *, appendonly: bool = False, appendfsync: str = "everysec",
                 extra: tuple[str, ...] = (), tls: tuple[Path, Path] | None = None):
        self.dir = Path(directory)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        self.tls = tls  # (cert, key); the self-signed cert is its own CA
        ports = ["--port", str(self.port)] if tls is None else [
            "--port", "0", "--tls-port", str(self.port), "--tls-cert-file", str(tls[0]), "--tls-key-file",
            str(tls[1]), "--tls-ca-cert-file", str(tls[0]), "--tls-auth-clients", "no"]
        self.args = [require_redis(), *ports, "--bind", "127.0.0.1", "--dir", str(self.dir),
                     "--save", "", "--appendonly", "yes" if appendonly else "no", "--appendfsync", appendfsync,
                     "--daemonize", "no", "--logfile", str(self.dir / "redis.log"), *extra]
        self.proc: subprocess.Popen | None = None

    def start(self) -> "RedisServer":
        self.proc = subprocess.Popen(self.args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                log = (self.dir / "redis.log").read_text(errors="replace")[-2000:]
                raise RuntimeError(f"redis-server exited with {self.proc.returncode}:\n{log}")
            try:
                with self.client(socket_connect_timeout=0.2) as r:
                    if r.ping():
                        # loading an AOF answers PING with -LOADING; wait for a real write
                        r.set("__c2c_probe", "1")
                        r.delete("__c2c_probe")
                        return self
            except redis_py.RedisError:
                time.sleep(0.05)
        raise RuntimeError(f"redis-server did not come up on port {self.port}")

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

    def client(self, **kw) -> redis_py.Redis:
        if self.tls:
            kw.update(ssl=True, ssl_ca_certs=str(self.tls[0]))
        return redis_py.Redis(host="127.0.0.1", port=self.port, **kw)


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory):
    """One plain redis-server for the session; tests isolate themselves by trust domain."""
    server = RedisServer(tmp_path_factory.mktemp("redis")).start()
    yield server
    server.stop()


@pytest.fixture
def own_redis(tmp_path):
    """``own_redis(appendonly=..., ...)`` -> a fresh redis-server for this test only."""
    servers: list[RedisServer] = []

    def make(**kw) -> RedisServer:
        server = RedisServer(tmp_path / f"redis{len(servers)}", **kw).start()
        servers.append(server)
        return server

    yield make
    for s in servers:
        s.stop(signal.SIGKILL)


BACKENDS = ["sqlite", pytest.param("redis", marks=pytest.mark.redis)]


@pytest.fixture(params=BACKENDS)
def store_url(request, tmp_path) -> str:
    """A fresh, empty store URL for each backend."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'store'}"
    return request.getfixturevalue("redis_server").url()


@pytest.fixture
def store(store_url):
    s = open_store(store_url)
    yield s
    s.close()


# ---------------------------------------------------------------- backend probes
def leftovers(store) -> int:
    """What a killed or refused put left behind: temp files and unreferenced blobs / upload chunks."""
    from c2c.store.redis import RedisStore
    from c2c.store.sqlite import SQLiteStore

    if isinstance(store, SQLiteStore):
        referenced = {r.commit.blob for r in store.log()}
        orphans = [p for p in (store.root / "blobs").glob("??/*") if p.name not in referenced]
        return len(list((store.root / "tmp").iterdir())) + len(orphans)
    assert isinstance(store, RedisStore)
    return sum(1 for _ in store._r.scan_iter(match=f"{store.prefix}up:*", count=1000))


def corrupt_blob(store, commit) -> None:
    """Flip one stored byte of ``commit``'s blob, behind the store's back."""
    from c2c.store.redis import RedisStore
    from c2c.store.sqlite import SQLiteStore

    if isinstance(store, SQLiteStore):
        path = store.root / "blobs" / commit.blob[:2] / commit.blob
        raw = bytearray(path.read_bytes())
        raw[len(raw) // 2] ^= 0x01
        path.write_bytes(bytes(raw))
    else:
        assert isinstance(store, RedisStore)
        key = f"{store.prefix}blob:{commit.blob}:0"
        raw = bytearray(store._r.get(key))
        raw[len(raw) // 2] ^= 0x01
        store._r.set(key, bytes(raw))


def drop_blob(store, commit) -> None:
    from c2c.store.redis import RedisStore

    if isinstance(store, RedisStore):
        store._r.delete(f"{store.prefix}blob:{commit.blob}:0")
    else:
        (store.root / "blobs" / commit.blob[:2] / commit.blob).unlink()
