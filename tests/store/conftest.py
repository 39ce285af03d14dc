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

import pytest

from c2c.store import open_store

REDIS_BIN = shutil.which("redis-server")


def require_redis() -> str:
    if REDIS_BIN is None:
        msg = "redis-server is not on PATH (install it: apt-get install -y redis-server)"
        if os.environ.get("CI"):
            pytest.fail(msg + "; CI must run the Redis backend tests")
        pytest.skip(msg)
    return REDIS_BIN


from c2c.testing import RedisServer as _RedisServer, free_port  # noqa: E402,F401


class RedisServer(_RedisServer):
    """c2c.testing.RedisServer that skips (or fails in CI) when redis-server is missing."""

    def __init__(self, directory, **kw):
        super().__init__(directory, binary=require_redis(), **kw)


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
