"""gc.plan: expiry by TTL and keep-last-N, heads kept, never under a live dependent."""

from __future__ import annotations

import pytest

from c2c.errors import ConfigError
from c2c.store.interface import Commit, CommitRecord
from c2c.store.gc import GCPolicy, plan


def rec(name: str, stream: str, version: int, created: float, parents=()) -> CommitRecord:
    cid = name * 64 if len(name) == 1 else name
    return CommitRecord(commit=Commit(id=cid, stream=stream, version=version, parents=tuple(p * 64 for p in parents),
                                      blob="0" * 64, size=1, created=created))


def ids(xs):
    return [x[0] for x in xs]


def test_keep_last_counts_surviving_versions_and_keeps_heads():
    records = [rec("c", "s", 7, 30), rec("b", "s", 5, 20), rec("a", "s", 2, 10)]  # newest first, with gaps
    removed, kept = plan(records, GCPolicy(keep_last=2), now=100)
    assert ids(removed) == ["a"] and kept == []
    assert plan(records, GCPolicy(keep_last=5), now=100) == ([], [])


def test_ttl_expires_old_commits_but_never_a_head():
    records = [rec("b", "s", 2, 90), rec("a", "s", 1, 10), rec("z", "t", 1, 0)]
    removed, _ = plan(records, GCPolicy(ttl_s=50), now=100)
    assert ids(removed) == ["a"]  # z is old but is the head of stream t


def test_removal_waits_for_dependents_and_goes_leaf_first():
    # a1 <- x1 <- y1, all superseded; y's and x's heads are newer
    records = [rec("Y", "y", 2, 60), rec("X", "x", 2, 50), rec("A", "a", 2, 40),
               rec("y", "y", 1, 30, ["x"]), rec("x", "x", 1, 20, ["a"]), rec("a", "a", 1, 10)]
    removed, kept = plan(records, GCPolicy(keep_last=1), now=100)
    assert ids(removed) == ["y", "x", "a"] and kept == []
    # if the newest dependent is itself kept, its whole chain of parents is kept
    records[3] = rec("y", "y", 1, 30, ["x"])
    removed, kept = plan([r for r in records if r.commit.id[0] != "Y"], GCPolicy(keep_last=1), now=100)
    assert removed == [] and ids(kept) == ["x", "a"]


def test_order_of_the_snapshot_does_not_matter():
    records = [rec("a", "a", 1, 10), rec("x", "x", 1, 20, ["a"]), rec("A", "a", 2, 40), rec("X", "x", 2, 50)]
    removed, _ = plan(records, GCPolicy(keep_last=1), now=100)
    assert ids(removed) == ["x", "a"]


def test_policy_is_validated():
    for bad in ({"keep_last": 0}, {"ttl_s": -1}, {"orphan_grace_s": -5}):
        with pytest.raises(ConfigError):
            GCPolicy(**bad)
