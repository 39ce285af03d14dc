"""Reading big Redis values straight into their places in one buffer.

redis-py's pure-Python reply parser copies a bulk reply several times on its
way in (socket -> read buffer -> BytesIO -> slices -> joined bytes); for a
64 MB blob that costs more than the transfer itself. :func:`get_into` instead
sends the GETs of a commit's chunks on a redis-py connection (which did the TLS,
AUTH, SELECT and HELLO handshake) and reads each bulk reply's payload with
``recv_into`` directly into its places in a preallocated buffer: a chunk of a
cache lies in many runs of the artifact (one per layer and head), which the
reply fills in turn. Bulk replies look the same in RESP2 and RESP3:
``$<n>\\r\\n<n bytes>\\r\\n``.

NOTE: this reads the connection's socket (``Connection._sock``, private in
redis-py; pyproject.toml bounds redis-py to the major version it was checked
against). :func:`require` checks at store open that every internal it touches
is there and raises :class:`~c2c.errors.StoreError` naming what is missing,
and :func:`get_into` checks the socket again on use. After any failure the
connection is disconnected, because unread replies may remain on it.

Kept because it is faster than redis-py's own GETs, with or without the hiredis
parser (``redis[hiredis]``): on the 64 MB put+get of ``benchmarks/store_bench.py``
the get took 0.136 s here, 0.190 s with hiredis and 0.247 s with the pure-Python
parser (medians of 7, benchmarks/results/store.md).
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Callable, Iterator

import redis

from c2c import _io
from c2c.errors import StoreError

# (what, how to find it) for each redis-py internal get_into relies on
_INTERNALS = (
    ("ConnectionPool.get_connection", lambda pool, conn: callable(getattr(pool, "get_connection", None))),
    ("ConnectionPool.release", lambda pool, conn: callable(getattr(pool, "release", None))),
    ("Connection.send_packed_command", lambda pool, conn: callable(getattr(conn, "send_packed_command", None))),
    ("Connection.pack_commands", lambda pool, conn: callable(getattr(conn, "pack_commands", None))),
    ("Connection.disconnect", lambda pool, conn: callable(getattr(conn, "disconnect", None))),
    ("Connection._sock", lambda pool, conn: hasattr(conn, "_sock")),
)


class MissingValue(Exception):
    """A GET answered nil: the key does not exist."""

    def __init__(self, key: str):
        super().__init__(key)
        self.key = key


class Redirected(Exception):
    """The server answered MOVED or ASK: the keys' slot is on another cluster node right now."""


def _unsupported(missing: str) -> StoreError:
    return StoreError(f"c2c.store.redis.resp reads blobs through redis-py's {missing}, which redis-py "
                      f"{redis.__version__} does not have; install the redis version pyproject.toml names "
                      "(pip install 'redis>=8.1,<9')")


def require(client: redis.Redis) -> None:
    """Raise StoreError unless ``client``'s redis-py has every internal :func:`get_into` touches."""
    pool = getattr(client, "connection_pool", None)
    if pool is None:
        raise _unsupported("Redis.connection_pool")
    try:  # an unconnected Connection, as the pool would make one: no I/O
        conn = pool.connection_class(**pool.connection_kwargs)
    except Exception as e:  # noqa: BLE001 - any failure here means the internals moved
        raise _unsupported(f"ConnectionPool.connection_class(**connection_kwargs) ({type(e).__name__}: {e})")
    for what, present in _INTERNALS:
        if not present(pool, conn):
            raise _unsupported(what)


class _Lease:
    """A connection borrowed from a redis-py pool; ``in_step`` once every reply sent for was read."""

    def __init__(self, conn) -> None:
        self.conn = conn
        self.in_step = False


@contextmanager
def _leased(client: redis.Redis, doing: str) -> Iterator[_Lease]:
    """Borrow a connection of ``client``'s pool; give it back, disconnected unless the body left it in step
    (unread replies may remain on it); an ``OSError`` becomes redis-py's ConnectionError ("``doing`` redis")."""
    pool = client.connection_pool
    lease = _Lease(pool.get_connection())
    try:
        yield lease
    except OSError as e:
        raise redis.exceptions.ConnectionError(f"{doing} redis failed: {e}") from e
    finally:
        if not lease.in_step:
            lease.conn.disconnect()
        pool.release(lease.conn)


def set_from(client: redis.Redis, items: list[tuple[str, list]], ex: int) -> None:
    """``SET key value EX ex`` for each ``(key, buffers)``, pipelined, each value sent as its buffers are:
    a chunk's runs go to the socket one after another, never joined into one copy first.

    Raises:
        Redirected: the server answered MOVED or ASK (a cluster slot is moving).
        redis.RedisError: connection or server errors (OOM as a ResponseError, NOPERM as NoPermissionError).
    """
    with _leased(client, "writing to") as lease:
        conn = lease.conn
        ttl = str(int(ex)).encode()
        tail = b"\r\n$2\r\nEX\r\n$%d\r\n%s\r\n" % (len(ttl), ttl)
        out: list = []
        for key, parts in items:
            k = key.encode()
            out.append(b"*5\r\n$3\r\nSET\r\n$%d\r\n%s\r\n$%d\r\n" % (len(k), k, sum(len(x) for x in parts)))
            out.extend(parts)
            out.append(tail)
        conn.send_packed_command(out)
        failure = None
        for _ in items:  # every reply is read, so the connection stays in step
            try:
                conn.read_response()
            except redis.exceptions.ResponseError as e:
                failure = failure or e
        if failure is not None:
            if str(failure).startswith(("MOVED ", "ASK ")):
                raise Redirected(str(failure))
            raise failure
        lease.in_step = True


def _recv_views(sock, views: list[memoryview]) -> None:
    """Fill ``views`` from ``sock``: one ``recvmsg_into`` for many views where the socket has it (not TLS)."""
    scatter = getattr(sock, "recvmsg_into", None) if type(sock).__name__ == "socket" else None
    while views:
        if scatter is not None:
            r = scatter(views[:_IOV_MAX])[0]
        else:
            r = sock.recv_into(views[0])
        if r == 0:
            raise redis.exceptions.ConnectionError("the server closed the connection mid-reply")
        _io.advance(views, r)


_IOV_MAX = 1024


def get_into(client: redis.Redis, keys: list[str], targets: list[list[memoryview]],
             on_value: Callable[[int], None]) -> int:
    """GET ``keys`` (pipelined) and write value ``i`` into the views ``targets[i]``, filling them in order.

    Calls ``on_value(i)`` as value ``i`` lands. Returns the bytes written.

    Raises:
        MissingValue: a key does not exist.
        ValueError: a value is not exactly as long as its targets together.
        redis.RedisError: connection or server errors (NOPERM as NoPermissionError).
    """
    with _leased(client, "reading from") as lease:
        conn = lease.conn
        conn.send_packed_command(conn.pack_commands([("GET", k) for k in keys]))
        sock = getattr(conn, "_sock", None)
        if sock is None or not hasattr(sock, "recv_into"):
            raise _unsupported("Connection._sock (a socket once connected)")
        pending = bytearray()  # bytes received but not yet placed: a reply header, or a payload's start

        def fill() -> None:
            chunk = sock.recv(1 << 16)
            if not chunk:
                raise redis.exceptions.ConnectionError("the server closed the connection mid-reply")
            pending.extend(chunk)

        total = 0
        for i, key in enumerate(keys):
            while (nl := pending.find(b"\r\n")) < 0:
                fill()
            head = bytes(pending[:nl])
            del pending[: nl + 2]
            if head[:1] == b"-":
                message = head[1:].decode(errors="replace")
                if message.startswith(("MOVED ", "ASK ")):
                    raise Redirected(message)
                cls = redis.exceptions.NoPermissionError if message.startswith("NOPERM") else \
                    redis.exceptions.ResponseError
                raise cls(message)
            if head in (b"$-1", b"_"):
                raise MissingValue(key)
            if head[:1] != b"$":
                raise redis.exceptions.ResponseError(f"unexpected reply {head[:32]!r} to GET")
            n = int(head[1:])
            if n != sum(len(v) for v in targets[i]):
                raise ValueError(f"value {key} is {n} bytes, not the {sum(len(v) for v in targets[i])} expected")
            left = []
            for view in targets[i]:
                take = min(len(view), len(pending))
                view[:take] = pending[:take]
                del pending[:take]
                if take < len(view):
                    left.append(view[take:])
            _recv_views(sock, left)
            on_value(i)
            total += n
            while len(pending) < 2:
                fill()
            del pending[:2]  # the CRLF after the payload
        lease.in_step = not pending
        return total
