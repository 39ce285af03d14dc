"""Moving a Redis store's chunks: uploads under a put's token, and reads straight into the artifact's buffer.

A chunk is one string ``P chunk:<digest>`` (:mod:`c2c.store.redis.lua`); its bytes lie in
many runs of the artifact, which a read fills in place (:func:`c2c.store.redis.resp.get_into`)
while the chunk before is hashed on a helper thread. Cluster redirects (a slot moving)
fall back to redis-py's pipelines, which follow them.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import redis

from c2c.errors import ChunkCorruptError, ChunkMissingError, StoreWriteError
from c2c.store.redis import resp

READ_GROUP = 8      # chunks per pipelined round trip when reading through redis-py (cluster redirects)
UPLOAD_GROUP = 16   # chunks per pipelined round trip when uploading


def upload(store, token: str, view: memoryview, manifest, which) -> list[int]:
    """Send chunks ``which`` under ``token`` as expiring keys (runs on an ingest thread); returns ``which``.

    A chunk's runs go out as they lie in the artifact (:func:`c2c.store.redis.resp.set_from`); while a
    cluster slot moves, redis-py's pipelines (which follow the redirect) send them joined instead.
    """
    ttl = store.config.upload_ttl_s
    which = list(which)
    try:
        with store._errors(writing=True):
            for g in range(0, len(which), UPLOAD_GROUP):
                group = which[g: g + UPLOAD_GROUP]
                items = [(f"{store.prefix}up:{token}:{i}", manifest.chunks[i].views(view)) for i in group]
                try:
                    if store._direct_reads:
                        resp.set_from(store._plain_client(items[0][0]), items, ttl)
                        continue
                except resp.Redirected:
                    pass
                pipe = store._r.pipeline(transaction=False)
                for key, parts in items:
                    pipe.set(key, parts[0] if len(parts) == 1 else b"".join(parts), ex=ttl)
                pipe.execute()
    except StoreWriteError:
        drop_upload(store, token, which)
        raise
    return which


def drop_upload(store, token: str, which) -> None:
    keys = [f"{store.prefix}up:{token}:{i}" for i in which]
    try:
        for g in range(0, len(keys), 1000):
            store._r.delete(*keys[g: g + 1000])
    except redis.exceptions.RedisError:
        pass  # NOTE: the chunks expire on their own after upload_ttl_s


def read_chunks(store, manifest, indices: list[int], out: memoryview, commit_id: str) -> int:
    """Read chunks ``indices`` of ``manifest`` into their runs of ``out``, each checked (on a helper thread
    while the next one is read); the bytes read."""
    if not indices:
        return 0
    keys = [f"{store.prefix}chunk:{manifest.chunks[i].digest}" for i in indices]
    targets = [manifest.chunks[i].views(out) for i in indices]
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="c2c-hash") as pool:
        checks = []

        def landed(k: int) -> None:  # hash chunk k while the next one is read
            i = indices[k]
            checks.append(pool.submit(manifest.chunks[i].verify, targets[k], commit=commit_id, index=i))

        with store._errors(writing=False):
            try:
                n = None
                if store._direct_reads:
                    try:
                        n = resp.get_into(store._plain_client(keys[0]), keys, targets, landed)
                    except resp.Redirected:
                        checks.clear()  # the slot is moving (cluster resharding): redis-py follows MOVED/ASK
                if n is None:
                    n = _read_pipelined(store, keys, targets, landed)
            except resp.MissingValue as e:
                k = keys.index(e.key)
                raise ChunkMissingError(f"chunk {indices[k]} of commit {commit_id[:12]} is missing ({e.key}); "
                                        "run `c2c store verify`") from None
            except ValueError as e:
                raise ChunkCorruptError(f"a chunk of commit {commit_id[:12]} has the wrong size ({e}): "
                                        "tampered; run `c2c store verify`") from None
        for c in checks:
            c.result()  # raises ChunkCorruptError
    return n

def _read_pipelined(store, keys: list[str], targets: list[list[memoryview]], landed) -> int:
    total = 0
    for g in range(0, len(keys), READ_GROUP):
        pipe = store._r.pipeline(transaction=False)
        for k in keys[g: g + READ_GROUP]:
            pipe.get(k)
        for k, part in enumerate(pipe.execute(), start=g):
            if part is None:
                raise resp.MissingValue(keys[k])
            if len(part) != sum(len(v) for v in targets[k]):
                raise ValueError(f"value {keys[k]} is {len(part)} bytes")
            pos = 0
            for v in targets[k]:
                v[:] = part[pos: pos + len(v)]
                pos += len(v)
            landed(k)
            total += len(part)
    return total
