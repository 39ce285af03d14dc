"""Chunked commits (#33), on every backend: sharing, fetching only what is missing, integrity of every
chunk, quotas, retention, and garbage collection that frees exactly what no live commit uses."""

from __future__ import annotations

import json
import random
import time
from functools import lru_cache

import pytest
import torch
from store_helpers import audit, chunk_location, corrupt_blob, drop_blob, fingerprint, leftovers

from c2c.artifact import Artifact
from c2c.artifact.chunks import CHUNK_TOKENS as C
from c2c.artifact.prefix import PrefixRef
from c2c.errors import (ChunkCorruptError, ChunkMissingError, CorruptArtifactError, QuotaExceededError,
                        StaleCommitError)
from c2c.runtime.kvcache import KVCache
from c2c.store import GCPolicy, collect
from c2c.store.fetch import fetch
from c2c.store.manifest import HeldPrefix
from c2c.store.redis.backend import RedisStore

FP = fingerprint()  # 2 layers, 2 kv heads, head_dim 8, float32: 256 bytes a token, 16 KiB a chunk


def _cache(seed: int, n: int, start: int = 0) -> KVCache:
    g = torch.Generator().manual_seed(seed)
    keys = tuple(torch.randn(1, 2, n, 8, generator=g) for _ in range(2))
    values = tuple(torch.randn(1, 2, n, 8, generator=g) for _ in range(2))
    ids = tuple(int(t) for t in torch.randint(0, 32000, (n,), generator=g))
    return KVCache(keys=keys, values=values, token_ids=ids, start=start)


@lru_cache(maxsize=None)
def trunk() -> KVCache:
    """The team's shared context: 6 chunks' worth of tokens, computed once."""
    return _cache(0, 6 * C)


def family(seed: int, shared: int, extra: int, *, parents=(), agent: str = "tester") -> Artifact:
    """A cache that starts with ``shared`` tokens of :func:`trunk`, then ``extra`` of its own."""
    if not shared:
        cache = _cache(seed, extra)
    else:
        cache = trunk().slice(0, shared).append(_cache(seed, extra, start=shared)) if extra else trunk().slice(0, shared)
    return Artifact.build(cache, fingerprint=FP, prefix=PrefixRef.of(cache.token_ids[:4]), producer={"agent": agent},
                          parents=tuple(parents), labels={"seed": str(seed)})


def _head(art: Artifact) -> int:
    return len(art.encode_head())


def _chunk_bytes(tokens: int) -> int:
    return tokens * 2 * 2 * 2 * 8 * 4  # layers x (k, v) x heads x head_dim x float32


# ------------------------------------------------------------------ sharing
def test_commits_that_share_a_prefix_store_it_once(store):
    a, b = family(1, 2 * C + 5, 40), family(2, 2 * C + 5, 40)
    ca, cb = store.put(a.encode(), stream="a"), store.put(b.encode(), stream="b")
    assert ca.chunks == cb.chunks == 3 and ca.format == 2
    assert a.header.chunks.digests[:2] == b.header.chunks.digests[:2] != a.header.chunks.digests[2:]
    u = store.usage()
    assert u.logical_bytes == len(a.encode()) + len(b.encode())
    assert u.stored_bytes == _head(a) + _head(b) + 2 * _chunk_bytes(C) + 2 * _chunk_bytes(45) and u.chunks == 4
    assert u.dedup_ratio > 1.3
    audit(store)
    assert store.delete_leaf(cb.id)                    # b's own chunk goes, the shared ones stay for a
    audit(store)
    assert store.usage().chunks == 3 and store.get(ca.id).data == a.encode()


def test_the_same_artifact_in_two_domains_is_kept_by_each(store):
    blue = store.in_domain(f"{store.domain}-blue")
    data = family(3, C, 10).encode()
    store.put(data, stream="a"), blue.put(data, stream="b")
    assert store.usage().stored_bytes == blue.usage().stored_bytes > 0  # each domain counts (and keeps) its own
    audit(store), audit(blue)


# ------------------------------------------------------------------ fetching
def test_fetch_reads_only_the_chunks_after_the_held_prefix(store):
    art = family(4, 3 * C, 50)
    data = art.encode()
    c = store.put(data, stream="s")
    held = trunk().slice(0, 3 * C + 7)                                  # holds 3 whole chunks, and 7 tokens
    got = store.fetch(c.id, held=HeldPrefix.of_cache(held, FP))
    assert got.held == (0, 1, 2) and got.bytes_referenced == len(data)
    assert got.bytes_read == _head(art) + _chunk_bytes(50)              # the head and the last chunk only
    rec, report = fetch(store, c.id, held=held, fingerprint=FP)
    assert rec.data == data and Artifact.decode(rec.data).id == c.id
    assert (report.bytes_fetched, report.chunks_held, report.chunks_refetched) == (got.bytes_read, 3, 0)
    # a holder of other tokens, another model or another dtype holds nothing of it
    for other in (trunk().slice(0, C).append(_cache(9, 2 * C, start=C)), held.to(dtype=torch.float16)):
        assert store.fetch(c.id, held=HeldPrefix.of_cache(other, FP)).held in ((), (0,))
    assert store.fetch(c.id, held=HeldPrefix.of(held.token_ids, fingerprint=fingerprint(head_dim=16),
                                                dtype="F32")).held == ()


def test_held_chunks_whose_bytes_differ_are_read_after_all(store):
    art = family(5, 2 * C, 3)
    c = store.put(art.encode(), stream="s")
    same_tokens = KVCache(keys=tuple(k + 1e-3 for k in trunk().keys), values=trunk().values,
                          token_ids=trunk().token_ids)  # the same tokens, computed with other rounding
    rec, report = fetch(store, c.id, held=same_tokens.slice(0, 2 * C), fingerprint=FP)
    assert rec.data == art.encode() and report.chunks_held == 0 and report.chunks_refetched == 2
    assert report.bytes_fetched == report.bytes_referenced
    # a holder that knows its chunks' digests (computed once) is told at once which chunks it really holds
    for cache, held in ((same_tokens, 0), (trunk(), 2)):
        holding = HeldPrefix.of_cache(cache.slice(0, 2 * C), FP, digests=True)
        assert store.fetch(c.id, held=holding).held == tuple(range(held))
        rec, report = fetch(store, c.id, held=cache.slice(0, 2 * C), holding=holding)
        assert rec.data == art.encode() and (report.chunks_held, report.chunks_refetched) == (held, 0)


def test_a_reader_may_stand_in_its_own_kv_for_the_chunks_it_holds(store):
    # what a server session does: it continues from its own prefix K/V anyway, so the commit's chunks of it
    # need not match bit for bit; every other chunk is checked against the signed digests
    art = family(15, 2 * C, 30)
    c = store.put(art.encode(), stream="s")
    own_kv = KVCache(keys=tuple(k + 1e-3 for k in trunk().keys), values=trunk().values, token_ids=trunk().token_ids)
    rec, report = fetch(store, c.id, held=own_kv.slice(0, 2 * C), fingerprint=FP, exact=False)
    assert report.own == (0, 1) and report.chunks_refetched == 0 and report.bytes_fetched < report.bytes_referenced
    with pytest.raises(CorruptArtifactError, match="chunk 0"):
        Artifact.decode(bytes(rec.data))
    got = Artifact.decode(rec.data, own=report.own)
    assert torch.equal(got.cache.keys[0][:, :, : 2 * C], own_kv.keys[0][:, :, : 2 * C])
    assert torch.equal(got.cache.keys[0][:, :, 2 * C:], art.cache.keys[0][:, :, 2 * C:])
    with pytest.raises(CorruptArtifactError, match="cannot be encoded"):
        got.encode()
    tampered = bytearray(rec.data)
    ref = store.fetch(c.id).manifest.chunks[2]
    tampered[ref.runs[0][0]] ^= 1  # a chunk it fetched: still checked
    with pytest.raises(CorruptArtifactError, match="chunk 2"):
        Artifact.decode(bytes(tampered), own=report.own)


def test_fetch_of_a_stale_commit_needs_allow_stale(store):
    c = store.put(family(6, C, 1).encode(), stream="s")
    store.invalidate(c.id, reason="checked")
    with pytest.raises(StaleCommitError):
        store.fetch(c.id)
    assert store.fetch(c.id, allow_stale=True).record.stale


# ------------------------------------------------------------------ integrity
def _set_chunk_list(store, cid: str, stored: list) -> None:
    if isinstance(store, RedisStore):
        store._r.hset(f"{store.prefix}c:{cid}", "chunks", json.dumps(stored))
    else:
        with store._tx() as db:
            db.execute("UPDATE manifests SET chunks = ? WHERE domain = ? AND id = ?", (json.dumps(stored), store.domain, cid))


def test_a_tampered_missing_or_swapped_chunk_gets_its_own_error(store):
    good = store.put(family(7, 2 * C, C).encode(), stream="good")
    c = store.put(family(8, 0, 3 * C).encode(), stream="s")
    corrupt_blob(store, c, 1)
    with pytest.raises(ChunkCorruptError, match=r"chunk 1 \(tokens 64\.\.127\) of commit .* does not hash"):
        store.get(c.id)
    corrupt_blob(store, c, 1)                                             # flipped back
    assert store.get(c.id).data is not None
    # two chunks' bytes swapped behind the store's back
    one, two = chunk_location(store, c, 0), chunk_location(store, c, 2)
    if isinstance(store, RedisStore):
        x, y = store._r.get(one), store._r.get(two)
        store._r.set(one, y), store._r.set(two, x)
    else:
        x, y = one.read_bytes(), two.read_bytes()
        one.write_bytes(y), two.write_bytes(x)
    with pytest.raises(ChunkCorruptError, match="chunk 0 .* does not hash"):
        store.get(c.id)
    assert [p.commit for p in store.verify()] == [c.id]
    if isinstance(store, RedisStore):
        store._r.set(one, x), store._r.set(two, y)
    else:
        one.write_bytes(x), two.write_bytes(y)
    assert store.verify() == []
    # the commit's list of chunks reordered: it no longer matches the signed header
    _, _, stored = store._load(c.id)
    _set_chunk_list(store, c.id, [stored[2], stored[1], stored[0]])
    with pytest.raises(ChunkCorruptError, match="differs from the one its signed header names"):
        store.get(c.id)
    _set_chunk_list(store, c.id, stored)
    drop_blob(store, c, 1)
    with pytest.raises(ChunkMissingError, match="chunk 1 of commit"):
        store.get(c.id)
    assert store.get(good.id).data is not None                            # nothing else is affected


# ------------------------------------------------------------------ quota
def test_a_put_over_quota_fails_cleanly_and_writes_nothing(store):
    a = family(10, 3 * C, 20)
    ca = store.put(a.encode(), stream="a")
    store.set_quota(store.usage().stored_bytes + _head(a) + _chunk_bytes(30))
    before, log = store.usage(), [r.id for r in store.log()]
    other = family(11, 0, 3 * C)                                          # shares nothing
    with pytest.raises(QuotaExceededError, match="quota") as e:
        store.put(other.encode(), stream="a")
    assert e.value.quota_bytes == before.quota_bytes and e.value.adding_bytes > 0
    assert store.usage() == before and [r.id for r in store.log()] == log and leftovers(store) == 0
    audit(store)
    # one that shares the prefix needs only its own chunk: it fits
    cb = store.put(family(12, 3 * C, 20).encode(), stream="b")
    assert store.usage().stored_bytes <= before.quota_bytes
    assert store.put(a.encode(), stream="a") == ca                      # putting it again needs nothing
    store.set_quota(None)
    store.put(other.encode(), stream="a")
    audit(store)
    assert {r.id for r in store.log()} >= {ca.id, cb.id}


def test_the_quota_is_checked_again_when_the_commit_is_made(store, monkeypatch):
    store.put(family(13, C, 1).encode(), stream="a")
    store.set_quota(store.usage().stored_bytes)                           # full
    real = store._plan
    monkeypatch.setattr(store, "_plan", lambda cid, m: real.__func__(store, cid, m) if False else
                        [i for i, _ in enumerate(m.chunks)])              # a plan that saw room (a racing put)
    before = store.usage()
    with pytest.raises(QuotaExceededError):
        store.put(family(14, 0, C).encode(), stream="a")
    assert store.usage() == before and leftovers(store) == 0
    audit(store)


# ------------------------------------------------------------------ retention
def test_retention_keeps_the_last_versions_on_every_put(store):
    store.set_retention("s", keep_last=2)
    ids = []
    for i in range(5):
        ids.append(store.put(family(20 + i, 2 * C, 10 + i).encode(), stream="s").id)
        assert [r.id for r in store.log("s")] == ids[::-1][:2]
        audit(store)
    assert store.usage().chunks == 2 + 2                                   # the shared prefix once, two tails
    assert store.retention("s").keep_last == 2 and not store.retention("other").active


def test_retention_keeps_a_version_something_else_builds_on(store):
    store.set_retention(None, keep_last=1)                                # the domain's default
    v1 = store.put(family(30, C, 5).encode(), stream="s")
    user = store.put(family(31, C, 6, parents=[v1.id]).encode(), stream="u")
    v2 = store.put(family(32, C, 7).encode(), stream="s")
    assert {r.id for r in store.log("s")} == {v1.id, v2.id}              # v1 stays: user builds on it
    assert store.delete_leaf(user.id)
    v3 = store.put(family(33, C, 8).encode(), stream="s")
    assert [r.id for r in store.log("s")] == [v3.id]
    store.set_retention("s", keep_last=3)                                 # a stream's own beats the default
    assert store.retention("s").keep_last == 3 and store.retention("t").keep_last == 1
    store.set_retention(None)
    assert not store.retention("t").active
    audit(store)


def test_retention_by_age_on_put(store):
    store.set_retention("s", ttl_s=0.2)
    old = store.put(family(40, C, 1).encode(), stream="s")
    time.sleep(0.5)
    new = store.put(family(41, C, 2).encode(), stream="s")
    assert [r.id for r in store.log("s")] == [new.id] and old.id not in {r.id for r in store.log()}
    audit(store)


def test_stats_reports_each_domain_against_its_quota(store):
    blue = store.in_domain(f"{store.domain}-blue")
    store.put(family(50, 2 * C, 3).encode(), stream="a")
    store.put(family(51, 2 * C, 4).encode(), stream="b")
    blue.put(family(52, 0, 10).encode(), stream="a")
    blue.set_quota(1 << 30)
    stats = store.stats()
    mine = {d.domain: d for d in stats.domains}
    assert mine[store.domain] == store.usage() and mine[blue.domain] == blue.usage()
    assert mine[blue.domain].quota_bytes == 1 << 30 and mine[store.domain].dedup_ratio > 1.0
    d = stats.to_dict()
    assert d["total"]["commits"] >= 3 and {"logical_bytes", "stored_bytes", "dedup_ratio", "quota_used"} <= set(
        d["domains"][0])


# ------------------------------------------------------------------ garbage collection, randomized
@pytest.mark.parametrize("seed", [1, 2, 3])
def test_gc_frees_exactly_what_no_live_commit_uses(store, seed):
    """Random puts (sharing prefixes), invalidations, deletions, keep-last GCs and retentions: after every
    step the reference counts and usage equal what the live commits list (audit), and every live commit
    reads back byte for byte."""
    rng = random.Random(seed)
    put: dict[str, bytes] = {}
    steps = 70
    for step in range(steps):
        live = [r.id for r in store.log()]
        op = rng.choices(["put", "invalidate", "delete", "gc", "retention"], [6, 1, 2, 1, 1])[0]
        if op == "put" or not live:
            parents = rng.sample(live, k=min(len(live), rng.choice([0, 0, 1, 2])))
            shared = rng.choice([0, C // 2, C, 2 * C, 3 * C + 3, 6 * C])
            art = family(1000 * seed + step, shared, rng.choice([1, C, 40] + ([0] if shared else [])), parents=parents)
            c = store.put(art.encode(), stream=rng.choice("xyz"))
            put[c.id] = art.encode()
        elif op == "invalidate":
            store.invalidate(rng.choice(live), reason=f"step {step}")
        elif op == "delete":
            store.delete_leaf(rng.choice(live))
        elif op == "gc":
            collect(store, GCPolicy(keep_last=rng.choice([1, 2, 3])))
        else:
            store.set_retention(rng.choice("xyz"), keep_last=rng.choice([None, 1, 2, 4]))
        audit(store)
        for cid in rng.sample([r.id for r in store.log()], k=min(2, len(store.log()))):
            assert store.get(cid, allow_stale=True).data == put[cid]
    for r in store.log():
        assert store.get(r.id, allow_stale=True).data == put[r.id]
    while store.log():  # and once every commit is gone, nothing is left
        for r in store.log():
            store.delete_leaf(r.id)
    audit(store)
    assert store.usage().stored_bytes == 0 and store.usage().chunks == 0
    if not isinstance(store, RedisStore):
        store.sweep_orphans(0)
    assert leftovers(store) == 0
