"""RedisStore invalidation in bounded steps: every step small, the result the same as one atomic walk.

Each test runs on one redis-server and on the 3-node cluster (the ``redis_url``
fixture). WALK_BATCH is shrunk so that small DAGs take many steps.
"""

from __future__ import annotations

import time
from collections import Counter

import pytest
from store_helpers import artifact_bytes

import c2c.store.redis.backend as redis_store
from c2c.store import open_store

pytestmark = pytest.mark.redis


def _count_steps(store, after=None) -> list[int]:
    """Wrap the store's STEP script: returns the list of children named per run; ``after(n)`` runs after run n."""
    real, sizes = store._step, []

    def step(keys, args):
        res = real(keys=keys, args=args)
        sizes.append(len(keys) - 4)  # KEYS: walk, walks, events, c:<root>, then one per child
        if after:
            after(len(sizes))
        return res

    store._step = step
    return sizes


def _events_once(store, ids) -> None:
    counts = Counter(e.commit for e in store.events(limit=100_000))
    assert all(counts[c] == 1 for c in ids), {c[:8]: counts[c] for c in ids if counts[c] != 1}
    assert all(store.show(c).stale for c in ids)


def test_a_wide_fan_out_is_marked_in_steps_of_at_most_a_batch(redis_url, monkeypatch):
    monkeypatch.setattr(redis_store, "WALK_BATCH", 40)
    store = open_store(redis_url())
    root = store.put(artifact_bytes(1), stream="root")
    # 150 children: past Redis's 128-member compact set, so SSCAN returns them over several pages
    kids = [store.put(artifact_bytes(100 + i), stream=f"k{i}", parents=[root.id]) for i in range(150)]
    grand = [store.put(artifact_bytes(500 + i), stream=f"g{i}", parents=[kids[i].id, kids[i + 1].id])
             for i in range(3)]
    other = store.put(artifact_bytes(900), stream="other")
    sizes = _count_steps(store)
    events = store.invalidate(root.id, reason="retracted")
    every = [root.id, *(k.id for k in kids), *(g.id for g in grand)]
    assert sorted(e.commit for e in events) == sorted(every) and events[0].commit == root.id
    assert len(sizes) >= 4 and max(sizes) <= 40
    _events_once(store, every)
    assert store.show(grand[0].id).stale_chain[0] == root.id and len(store.show(grand[0].id).stale_chain) == 3
    assert not store.show(other.id).stale
    assert not store._r.exists(f"{store.prefix}walk:{root.id}") and not store._r.zcard(f"{store.prefix}walks")


def test_children_put_between_steps_end_stale_and_are_announced_once(redis_url, monkeypatch):
    monkeypatch.setattr(redis_store, "WALK_BATCH", 2)
    url = redis_url()
    store, writer = open_store(url), open_store(url)
    a = store.put(artifact_bytes(1), stream="a")
    bs = [store.put(artifact_bytes(10 + i), stream=f"b{i}", parents=[a.id]) for i in range(4)]
    born: dict[str, str] = {}

    def put_children(n: int) -> None:
        if n != 1:
            return
        # after the first step: two b's are marked, two are not yet; another client puts under one of each
        marked = next(b for b in bs if store.show(b.id).stale)
        waiting = next(b for b in bs if not store.show(b.id).stale)
        born["under_marked"] = writer.put(artifact_bytes(50), stream="c1", parents=[marked.id]).id
        born["under_waiting"] = writer.put(artifact_bytes(51), stream="c2", parents=[waiting.id]).id
        assert store.show(born["under_marked"]).stale          # its parent was stale: born stale
        assert not store.show(born["under_waiting"]).stale     # its parent not yet: the walk must reach it

    sizes = _count_steps(store, after=put_children)
    events = store.invalidate(a.id, reason="bad source")
    assert max(sizes) <= 2
    got = {e.commit for e in events}
    assert born["under_waiting"] in got and born["under_marked"] not in got  # that one's event came from its put
    _events_once(store, [a.id, *(b.id for b in bs), *born.values()])
    for cid in born.values():
        rec = store.show(cid)
        assert rec.stale_root == a.id and len(rec.stale_chain) == 3 and "bad source" in rec.stale_reason


def test_a_new_version_stays_fresh_while_the_walk_below_the_old_one_runs(redis_url, monkeypatch):
    monkeypatch.setattr(redis_store, "WALK_BATCH", 2)
    store = open_store(redis_url())
    v1 = store.put(artifact_bytes(1), stream="a")
    deps = [store.put(artifact_bytes(10 + i), stream=f"d{i}", parents=[v1.id]) for i in range(5)]
    v2 = store.put(artifact_bytes(2), stream="a", parents=[v1.id, deps[0].id])
    assert not store.show(v2.id).stale and store.show(v1.id).superseded_by == v2.id
    _events_once(store, [v1.id, *(d.id for d in deps)])


class WalkerDied(Exception):
    pass


def test_a_walk_whose_walker_died_is_finished_later(redis_url, monkeypatch):
    monkeypatch.setattr(redis_store, "WALK_BATCH", 2)
    monkeypatch.setattr(redis_store, "WALK_LEASE_S", 1)
    url = redis_url()
    store = open_store(url)
    roots = [store.put(artifact_bytes(i), stream=f"r{i}") for i in range(2)]
    below = {r.id: [store.put(artifact_bytes(100 * (j + 1) + i), stream=f"x{j}-{i}", parents=[r.id])
                    for i in range(5)] for j, r in enumerate(roots)}

    def die(n: int) -> None:
        raise WalkerDied

    for r in roots:
        dying = open_store(url)
        _count_steps(dying, after=die)
        with pytest.raises(WalkerDied):
            dying.invalidate(r.id, reason="walker killed mid-walk")
        assert not all(store.show(c.id).stale for c in below[r.id])  # left half done
    # invalidating the root again finishes its walk at once, with the first cause
    store.invalidate(roots[0].id, reason="second try")
    _events_once(store, [roots[0].id, *(c.id for c in below[roots[0].id])])
    assert all("walker killed" in store.show(c.id).stale_reason for c in below[roots[0].id])
    # the other one: any write after its lease ran out finishes it
    assert not all(store.show(c.id).stale for c in below[roots[1].id])
    time.sleep(2.2)
    store.put(artifact_bytes(999), stream="unrelated")
    _events_once(store, [roots[1].id, *(c.id for c in below[roots[1].id])])
    assert not store._r.zcard(f"{store.prefix}walks")
