"""Cheap test artifacts: random KV tensors and a hand-made fingerprint, no model."""

from __future__ import annotations

import os
import shutil
from typing import Sequence

import pytest
import torch

from c2c.artifact import Artifact
from c2c.artifact.fingerprint import Fingerprint
from c2c.artifact.prefix import PrefixRef
from c2c.runtime.kvcache import KVCache

LAYERS, KV_HEADS, HEAD_DIM = 2, 2, 8


def fingerprint(num_layers: int = LAYERS, kv_heads: int = KV_HEADS, head_dim: int = HEAD_DIM) -> Fingerprint:
    return Fingerprint(architecture="llama", num_layers=num_layers, layer_types=("full_attention",) * num_layers,
                       kv_heads=kv_heads, head_dim=head_dim, sliding_window=None, rope='{"theta":10000}',
                       dtype="float32", tokenizer_digest="a" * 64, weights_digest="b" * 64, model_name="tiny-test")


def make_artifact(seed: int, *, seq: int = 8, parents: Sequence[str] = (), agent: str = "tester",
                  num_layers: int = LAYERS, kv_heads: int = KV_HEADS, head_dim: int = HEAD_DIM,
                  domain: str | None = None) -> Artifact:
    """A valid artifact whose bytes (and so id) differ for every ``seed``."""
    g = torch.Generator().manual_seed(seed)
    tokens = [int(t) for t in torch.randint(0, 32000, (seq,), generator=g)]
    # each layer: keys and values (1, kv_heads, seq, head_dim)
    keys = tuple(torch.randn(1, kv_heads, seq, head_dim, generator=g) for _ in range(num_layers))
    values = tuple(torch.randn(1, kv_heads, seq, head_dim, generator=g) for _ in range(num_layers))
    cache = KVCache(keys=keys, values=values, token_ids=tuple(tokens))
    return Artifact.build(cache, fingerprint=fingerprint(num_layers, kv_heads, head_dim),
                          prefix=PrefixRef.of(tokens[: min(4, seq)]),
                          producer={"agent": agent, **({"domain": domain} if domain else {})},
                          parents=tuple(parents), labels={"seed": str(seed)})


def artifact_bytes(seed: int, **kw) -> bytes:
    return make_artifact(seed, **kw).encode()


def sized_artifact_bytes(seed: int, nbytes: int) -> bytes:
    """An artifact of about ``nbytes`` (float32, 2 layers x 4 heads x 64 dims)."""
    seq = max(1, nbytes // (2 * 2 * 4 * 64 * 4))
    return artifact_bytes(seed, seq=seq, kv_heads=4, head_dim=64)


# ---------------------------------------------------------------- redis-server
REDIS_BIN = shutil.which("redis-server")
REDIS_CLI = shutil.which("redis-cli")


def require_redis(binary: str = "redis-server") -> str:
    found = REDIS_BIN if binary == "redis-server" else REDIS_CLI
    if found is None:
        msg = f"{binary} is not on PATH (install it: apt-get install -y redis-server)"
        if os.environ.get("CI"):
            pytest.fail(msg + "; CI must run the Redis backend tests")
        pytest.skip(msg)
    return found


from c2c.testing import RedisServer as _RedisServer  # noqa: E402


class RedisServer(_RedisServer):
    """c2c.testing.RedisServer that skips (or fails in CI) when redis-server is missing."""

    def __init__(self, directory, **kw):
        super().__init__(directory, binary=require_redis(), **kw)


# ---------------------------------------------------------------- backend probes
def leftovers(store) -> int:
    """What a killed or refused put left behind: temp files and chunks no row names / upload keys."""
    from c2c.store.redis.backend import RedisStore
    from c2c.store.sqlite.backend import SQLiteStore

    if isinstance(store, SQLiteStore):
        rows = {(d, k) for d, k in store._read("SELECT domain, digest FROM chunks")}  # every domain's
        orphans = [p for p in (store.root / "chunks").glob("*/??/*") if (p.parent.parent.name, p.name) not in rows]
        return len(list((store.root / "tmp").iterdir())) + len(orphans)
    assert isinstance(store, RedisStore)
    refs = {k.decode() for k in store._r.hkeys(f"{store.prefix}refs")}
    chunks = [k.decode() for k in store._r.scan_iter(match=f"{store.prefix}chunk:*", count=1000)]
    ups = sum(1 for _ in store._r.scan_iter(match=f"{store.prefix}up:*", count=1000))
    return ups + sum(1 for k in chunks if k.rsplit(":", 1)[1] not in refs)


def chunk_location(store, commit, index: int = 0):
    """Where chunk ``index`` of ``commit`` is kept: a file path (SQLite) or a key (Redis)."""
    from c2c.store.redis.backend import RedisStore

    digest = store._load(commit.id)[2][index][0]
    if isinstance(store, RedisStore):
        return f"{store.prefix}chunk:{digest}"
    return store._chunk_path(store.domain, digest)


def corrupt_blob(store, commit, index: int = 0) -> None:
    """Flip one stored byte of ``commit``'s chunk ``index``, behind the store's back."""
    from c2c.store.redis.backend import RedisStore

    where = chunk_location(store, commit, index)
    if isinstance(store, RedisStore):
        raw = bytearray(store._r.get(where))
        raw[len(raw) // 2] ^= 0x01
        store._r.set(where, bytes(raw))
    else:
        raw = bytearray(where.read_bytes())
        raw[len(raw) // 2] ^= 0x01
        where.write_bytes(bytes(raw))


def drop_blob(store, commit, index: int = 0) -> None:
    """Delete ``commit``'s chunk ``index`` behind the store's back."""
    from c2c.store.redis.backend import RedisStore

    where = chunk_location(store, commit, index)
    if isinstance(store, RedisStore):
        store._r.delete(where)
    else:
        where.unlink()


def audit(store) -> None:
    """The store's chunk references and usage are exactly what its live commits list.

    Every chunk a live commit lists is stored and counted once per listing (nothing freed under a
    live commit), no chunk is counted that no live commit lists (no leak), and the domain's usage
    (commits, logical and stored bytes, chunks) adds up.
    """
    from collections import Counter

    from c2c.store.redis.backend import RedisStore

    want, sizes, logical, heads = Counter(), {}, 0, 0
    records = store.log()
    for rec in records:
        _, head, stored = store._load(rec.id)
        for digest, size, _ in stored:
            want[digest] += 1
            sizes[digest] = size
        logical += rec.commit.size
        heads += len(head)
    if isinstance(store, RedisStore):
        refs = {k.decode(): int(v) for k, v in store._r.hgetall(f"{store.prefix}refs").items()}
        kept = {k.decode().rsplit(":", 1)[1] for k in store._r.scan_iter(match=f"{store.prefix}chunk:*", count=1000)}
        lengths = {d: store._r.strlen(f"{store.prefix}chunk:{d}") for d in want}
    else:
        refs = dict(store._read("SELECT digest, refs FROM chunks WHERE domain = ?", (store.domain,)))
        kept = {d for d in want if store._chunk_path(store.domain, d).exists()}
        lengths = {d: store._chunk_path(store.domain, d).stat().st_size for d in kept}
    assert refs == dict(want), "chunk reference counts differ from what the live commits list"
    assert set(want) <= kept, f"chunks of live commits are missing: {sorted(set(want) - kept)[:3]}"
    if isinstance(store, RedisStore):
        assert kept == set(want), "chunks are kept that no live commit lists"
    assert all(lengths[d] == sizes[d] for d in want)
    u = store.usage()
    assert (u.commits, u.logical_bytes, u.stored_bytes, u.chunks) == (
        len(records), logical, heads + sum(sizes.values()), len(want)), u
