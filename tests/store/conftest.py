"""Store fixtures: one store per backend URL, and redis-server processes the tests own.

Every Redis test starts its own ``redis-server`` (from PATH) on a free loopback
port with a temporary directory, and stops it afterwards; nothing talks to a
Redis the tests did not start. The ``redis-cluster`` backend is a real 3-node
Redis Cluster (see redis_cluster.py), started once per session. Without the
binaries, Redis tests skip, or fail when ``CI`` is set (CI must install them:
``apt-get install -y redis-server``, which brings ``redis-cli`` along).
"""

from __future__ import annotations

import signal

import pytest

from c2c.store import open_store

from store_helpers import RedisServer, require_redis


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


@pytest.fixture(scope="session")
def redis_cluster(tmp_path_factory):
    """One 3-node Redis Cluster on loopback for the session; tests isolate themselves by trust domain."""
    from redis_cluster import RedisClusterNodes

    cluster = RedisClusterNodes(tmp_path_factory.mktemp("redis-cluster"), server_bin=require_redis(),
                                cli_bin=require_redis("redis-cli")).start()
    yield cluster
    cluster.stop()


BACKENDS = ["sqlite", pytest.param("redis", marks=pytest.mark.redis),
            pytest.param("redis-cluster", marks=pytest.mark.redis)]


@pytest.fixture(params=BACKENDS)
def store_url(request, tmp_path) -> str:
    """A fresh, empty store URL for each backend."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'store'}"
    if request.param == "redis-cluster":
        return request.getfixturevalue("redis_cluster").url()
    return request.getfixturevalue("redis_server").url()


@pytest.fixture(params=[pytest.param("redis", marks=pytest.mark.redis),
                        pytest.param("redis-cluster", marks=pytest.mark.redis)])
def redis_url(request):
    """``url(**options)`` -> a fresh domain's URL, on one server and on the cluster."""
    server = request.getfixturevalue("redis_cluster" if request.param == "redis-cluster" else "redis_server")
    return server.url


@pytest.fixture
def store(store_url):
    s = open_store(store_url)
    yield s
    s.close()
