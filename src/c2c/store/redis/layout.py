"""A Redis store domain's layout, and the migration of older ones on open.

Layout 1 kept each commit's artifact as ``P blob:<sha>:<i>`` pieces; layout 2 keeps
chunks with reference counts (:mod:`c2c.store.redis.lua`). The first handle that opens
a domain still in layout 1 migrates it, one commit per ``MIGRATE`` script run (each
commit's pieces become format-1 chunks, hashed here), while it holds ``P migrating``;
other handles wait for ``P layout``.
"""

from __future__ import annotations

import hashlib
import json
import time
import uuid

import redis

from c2c.errors import ConfigError, StoreWriteError

LAYOUT = "2"        # chunks (format 1 and 2 commits); layout 1 kept one blob per commit
_MANIFEST_TAG = b"c2c-manifest-v1\0"  # c2c.store.manifest's: a commit of pieces gets its manifest digest


def ensure_layout(store) -> None:
    """Migrate this domain from layout 1 (one blob per commit) to chunks, once (see redis_lua.MIGRATE).

    One handle migrates while it holds ``P migrating``; others wait for ``P layout``.
    """
    if store.domain in store._laid_out:
        return
    p = store.prefix
    try:
        if _s(store._r.get(f"{p}layout") or b"") == LAYOUT:
            store._laid_out.add(store.domain)
            return
    except redis.exceptions.NoPermissionError:
        return  # a user of another domain: each call it makes is refused ("may not") as it comes
    except redis.exceptions.RedisError:
        pass  # reported below
    with store._errors(writing=True):
        token = uuid.uuid4().hex
        deadline = time.monotonic() + 600
        while _s(store._r.get(f"{p}layout") or b"") != LAYOUT:
            if not store._r.exists(f"{p}all"):
                store._r.set(f"{p}layout", LAYOUT)  # nothing to migrate
                break
            if store._r.set(f"{p}migrating", token, nx=True, ex=120):
                try:
                    _migrate_commits(store)
                    store._r.set(f"{p}layout", LAYOUT)
                finally:
                    store._r.delete(f"{p}migrating")
                break
            if time.monotonic() > deadline:
                raise StoreWriteError(f"domain {store.domain!r} of {store.url} is being migrated to chunks by "
                                      "another client that has not finished in 600 s; try again")
            time.sleep(0.2)
    store._laid_out.add(store.domain)

def _migrate_commits(store) -> None:
    p = store.prefix
    for cid in (_s(c) for c in store._r.zrange(f"{p}all", 0, -1)):
        store._r.expire(f"{p}migrating", 120)  # still at it
        fmt, blob, n, size = store._r.hmget(store._ckey(cid), "format", "blob", "chunks", "size")
        if fmt is not None or blob is None:
            continue
        blob, n, size = _s(blob), int(n), int(size)
        keys = [f"{p}blob:{blob}:{i}" for i in range(n)]
        pieces = []
        for k in keys:  # one at a time: pieces are chunk_mb each
            part = store._r.get(k)
            pieces.append(None if part is None else [hashlib.sha256(part).hexdigest(), len(part), None])
        if any(x is None for x in pieces):  # damaged before: keep it damaged, visibly (ChunkMissingError)
            pieces = [["0" * 64, size, None]]
            keys = keys[:1]
        manifest = hashlib.sha256(_MANIFEST_TAG + b"".join(bytes.fromhex(x[0]) for x in pieces)).hexdigest()
        store._migrate(keys=[store._ckey(cid), f"{p}refs", f"{p}usage", *keys,
                            *(f"{p}chunk:{x[0]}" for x in pieces)],
                      args=store._args(blob, len(pieces), json.dumps(pieces), manifest))


def _s(v) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)


def _stream_id(value: str) -> tuple[int, int]:
    """A Redis stream id (``MS-SEQ``, or ``MS`` alone, as XREAD reads it: ``MS-0``) as a comparable pair."""
    ms, _, seq = value.partition("-")
    return int(ms), int(seq or 0)


def check_issued(r, events_key: str, after: str) -> None:
    """Refuse an events cursor past the last id the domain's event stream ever issued (``last-generated-id``
    survives trimming): a cursor no reader was given would otherwise wait for events that never come.

    Raises:
        ConfigError: ``after`` was never issued.
    """
    if _stream_id(after) == (0, 0):
        return
    try:
        last = r.xinfo_stream(events_key)["last-generated-id"]
        last = last.decode() if isinstance(last, bytes) else str(last)
    except redis.exceptions.ResponseError:  # no such stream: nothing issued yet
        last = "0-0"
    if _stream_id(after) > _stream_id(last):
        raise ConfigError(f"event cursor {after!r} is not one this store issued (the domain's last is {last}); "
                          "give the seq of the last event received, or 0 for the start")
