"""Reading big Redis values straight into one buffer.

redis-py's pure-Python reply parser copies a bulk reply several times on its
way in (socket -> read buffer -> BytesIO -> slices -> joined bytes); for a
64 MB blob that costs more than the transfer itself. :func:`get_into` instead
sends the GETs of a blob's chunks on a redis-py connection (which did the TLS,
AUTH, SELECT and HELLO handshake) and reads each bulk reply's payload with
``recv_into`` directly into its place in a preallocated buffer. Bulk replies
look the same in RESP2 and RESP3: ``$<n>\\r\\n<n bytes>\\r\\n``.

NOTE: this reads the connection's socket (``Connection._sock``, private in
redis-py). :func:`supported` checks it is there; the store falls back to
ordinary pipelined GETs otherwise. After any failure the connection is
disconnected, because unread replies may remain on it.
"""

from __future__ import annotations

from typing import Callable

import redis


class MissingValue(Exception):
    """A GET answered nil: the key does not exist."""

    def __init__(self, key: str):
        super().__init__(key)
        self.key = key


def supported(client: redis.Redis) -> bool:
    pool = client.connection_pool
    return hasattr(pool, "get_connection") and hasattr(pool, "release") and \
        hasattr(pool.connection_class, "send_packed_command")


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
        sock = conn._sock
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
