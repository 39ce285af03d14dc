"""The Redis store's connection: ``redis://HOST:PORT/DB`` and c2c's options in its query string.

``rediss://`` connects over TLS. c2c's own options ride in the query string and
are stripped before the URL reaches redis-py::

    redis://user:secret@10.0.0.5:6379/0?domain=research&chunk_mb=8
    redis://10.0.0.5:7000/0?domain=research&cluster=1          # Redis Cluster, any node to start from

- ``domain`` (default ``default``) is the trust domain: every key lives under
  ``c2c:{<domain>}:``, so an ACL user made by :func:`c2c.store.acl.create_domain_user`
  sees its own domain only, and on Redis Cluster the whole domain is one hash slot
  (the ``{...}`` hash tag), so every script runs on one node.
- ``cluster=1`` talks to a Redis Cluster (``redis.cluster.RedisCluster``); the
  database must be 0. ``cluster=0`` (the default) talks to one server.
- ``connect_timeout_s`` (default 5) bounds opening a connection and
  ``socket_timeout_s`` (default 10) waiting for any reply, so a server that is
  down or unreachable fails within seconds with :class:`StoreError` (a write:
  :class:`StoreWriteError`) naming the host and port, instead of hanging. A
  refused or reset connection (a restarting server) is retried twice within a
  second; a timeout is not retried. ``events(wait_s=...)`` may wait longer than
  ``socket_timeout_s``: it blocks in slices.
- ``chunk_mb`` (default 8), ``upload_ttl_s`` (default 3600) and ``max_events``
  (default 100000, the event stream's approximate length) tune the store's layout
  (:mod:`c2c.store.redis`).
"""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import parse_qsl, urlencode, urlparse, urlunparse

from c2c.errors import ConfigError
from c2c.trust.keys import check_domain

_OPTIONS = {"domain", "chunk_mb", "upload_ttl_s", "max_events", "connect_timeout_s", "socket_timeout_s", "cluster"}
_FLAGS = {"1": True, "true": True, "yes": True, "0": False, "false": False, "no": False}


def key_prefix(domain: str) -> str:
    """Every key of ``domain`` starts with this; ``{domain}`` is the Redis Cluster hash tag."""
    return f"c2c:{{{check_domain(domain)}}}:"


@dataclass(frozen=True, kw_only=True)
class RedisConfig:
    """Connection URL (without c2c options) plus c2c's options."""

    connection_url: str
    domain: str = "default"
    chunk_bytes: int = 8 << 20
    upload_ttl_s: int = 3600
    max_events: int = 100_000
    connect_timeout_s: float = 5.0
    socket_timeout_s: float = 10.0
    cluster: bool = False

    @classmethod
    def from_url(cls, url: str) -> "RedisConfig":
        u = urlparse(url)
        if u.scheme not in ("redis", "rediss") or not u.hostname:
            raise ConfigError(f"{url!r} is not a redis://HOST:PORT/DB or rediss:// URL")
        ours, theirs = {}, []
        for k, v in parse_qsl(u.query, keep_blank_values=True):
            (ours.__setitem__(k, v) if k in _OPTIONS else theirs.append((k, v)))
        try:
            chunk = int(float(ours.get("chunk_mb", 8)) * (1 << 20))
            ttl = int(ours.get("upload_ttl_s", 3600))
            maxev = int(ours.get("max_events", 100_000))
            connect_s = float(ours.get("connect_timeout_s", 5))
            socket_s = float(ours.get("socket_timeout_s", 10))
        except ValueError:
            raise ConfigError("chunk_mb, upload_ttl_s, max_events, connect_timeout_s and socket_timeout_s "
                              "must be numbers") from None
        if not (64 << 10) <= chunk <= (256 << 20):
            raise ConfigError("chunk_mb must be between 0.0625 and 256")
        if not (0 < connect_s <= 600 and 0 < socket_s <= 600):
            raise ConfigError("connect_timeout_s and socket_timeout_s must be seconds in (0, 600]")
        cluster = _FLAGS.get(ours.get("cluster", "0").lower())
        if cluster is None:
            raise ConfigError(f"cluster={ours['cluster']!r}: write cluster=1 for Redis Cluster or cluster=0")
        if cluster and u.path.strip("/") not in ("", "0"):
            raise ConfigError(f"Redis Cluster has database 0 only; drop {u.path!r} from the URL or write /0")
        domain = ours.get("domain", "default")
        key_prefix(domain)
        return cls(connection_url=urlunparse(u._replace(query=urlencode(theirs))), domain=domain,
                   chunk_bytes=chunk, upload_ttl_s=ttl, max_events=maxev, connect_timeout_s=connect_s,
                   socket_timeout_s=socket_s, cluster=cluster)

    @property
    def url(self) -> str:
        """The URL without its password, for messages."""
        u = urlparse(self.connection_url)
        host = f"{u.hostname}:{u.port or 6379}"
        user = f"{u.username}@" if u.username else ""
        tail = "&cluster=1" if self.cluster else ""
        return f"{u.scheme}://{user}{host}{u.path or '/0'}?domain={self.domain}{tail}"

    @property
    def address(self) -> str:
        """``HOST:PORT`` of the server (on a cluster, the node the client starts from)."""
        u = urlparse(self.connection_url)
        return f"{u.hostname}:{u.port or 6379}"
