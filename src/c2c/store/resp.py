"""Reading big Redis values straight into one buffer.

redis-py's pure-Python reply parser copies a bulk reply several times on its
way in (socket -> read buffer -> BytesIO -> slices -> joined bytes); for a
64 MB blob that costs more than the transfer itself. :func:`get_into` instead
sends the GETs of a blob's chunks on a redis-py connection (which did the TLS,
AUTH, SELECT and HELLO handshake) and reads each bulk reply's payload with
``recv_into`` directly into its place in a preallocated buffer. Bulk replies
look the same in RESP2 and RESP3: ``$<n>\\r\\n<n bytes>\\r\\n``.

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

from typing import Callable

import redis

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
    return StoreError(f"c2c.store.resp reads blobs through redis-py's {missing}, which redis-py "
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


def get_into(client: redis.Redis, keys: list[str], out: memoryview,
             on_value: Callable[[int, int], None]) -> int:
    """GET ``keys`` (pipelined) and write their values back to back into ``out``.

    Calls ``on_value(start, end)`` as each value lands. Returns the bytes written.

    Raises:
        MissingValue: a key does not exist.
        ValueError: the values do not fit in ``out``.
        redis.RedisError: connection or server errors (NOPERM as NoPermissionError).
    """
    pool = client.connection_pool
    conn = pool.get_connection()
    ok = False
    try:
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

        pos = 0
        for key in keys:
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
            if pos + n > len(out):
                raise ValueError(f"values exceed the {len(out)}-byte buffer")
            take = min(n, len(pending))
            out[pos: pos + take] = pending[:take]
            del pending[:take]
            got = take
            while got < n:
                r = sock.recv_into(out[pos + got: pos + n])
                if r == 0:
                    raise redis.exceptions.ConnectionError("the server closed the connection mid-reply")
                got += r
            on_value(pos, pos + n)
            pos += n
            while len(pending) < 2:
                fill()
            del pending[:2]  # the CRLF after the payload
        ok = not pending
        return pos
    except OSError as e:
        raise redis.exceptions.ConnectionError(f"reading from redis failed: {e}") from e
    finally:
        if not ok:
            conn.disconnect()
        pool.release(conn)
