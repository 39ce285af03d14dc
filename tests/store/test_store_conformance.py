"""One conformance suite, run against every backend (sqlite://, redis://).

Each test gets a fresh empty store from the ``store`` fixture, parametrized over
the backends in conftest.BACKENDS.
"""

from __future__ import annotations

import inspect
import threading

import pytest
from store_helpers import corrupt_blob, drop_blob, leftovers
from store_helpers import artifact_bytes, make_artifact

from c2c.artifact import Artifact
from c2c.errors import (ArtifactError, ArtifactTooLargeError, CommitNotFoundError, ConfigError, StaleCommitError,
                        StoreCorruptError, TruncatedArtifactError)
from c2c.store import GCPolicy, Graph, Store, collect, hop_report
from c2c.store.interface import MAX_REASON_CHARS, MAX_SUMMARY_CHARS, MAX_SUMMARY_STRING_CHARS
from c2c.store.redis.backend import RedisStore
from c2c.store.sqlite.backend import SQLiteStore


# ------------------------------------------------------------------ the interface
@pytest.mark.parametrize("backend", [SQLiteStore, RedisStore])
def test_backend_implements_the_whole_interface(backend):
    abstract = {n for n, m in inspect.getmembers(Store) if getattr(m, "__isabstractmethod__", False)}
    assert abstract and not backend.__abstractmethods__
    for name in abstract:
        ours, theirs = inspect.signature(getattr(Store, name)), inspect.signature(getattr(backend, name))
        assert list(ours.parameters) == list(theirs.parameters), name


# ------------------------------------------------------------------------ commits
def test_put_then_get_roundtrips_the_exact_bytes(store):
    art = make_artifact(1)
    data = art.encode()
    c = store.put(data, stream="analyst")
    assert (c.id, c.stream, c.version, c.parents, c.size) == (art.id, "analyst", 1, (), len(data))
    rec = store.get(c.id)
    assert rec.data == data and not rec.stale and rec.stale_reason is None and rec.stale_chain == ()
    assert rec.commit == c
    assert rec.artifact().id == art.id
    assert store.show(c.id).data is None and store.show(c.id).commit == c


def test_has_says_whether_this_domain_holds_a_commit(store):
    c = store.put(artifact_bytes(1), stream="a")
    assert store.has(c.id) and not store.has("0" * 64)
    assert not store.in_domain("elsewhere").has(c.id)  # another domain's part of the store


def test_stream_defaults_to_the_producer_agent(store):
    c = store.put(artifact_bytes(1, agent="writer"))
    assert c.stream == "writer" and store.latest("writer").id == c.id


def test_putting_the_same_commit_again_is_a_no_op(store):
    data = artifact_bytes(1)
    first = store.put(data, stream="a")
    again = store.put(data, stream="b")
    assert again == first
    assert [r.id for r in store.log()] == [first.id] and store.streams() == ["a"]
    assert leftovers(store) == 0


def test_versions_increase_per_stream(store):
    a = [store.put(artifact_bytes(i), stream="a") for i in range(3)]
    b = [store.put(artifact_bytes(10 + i), stream="b") for i in range(2)]
    assert [c.version for c in a] == [1, 2, 3] and [c.version for c in b] == [1, 2]
    assert store.latest("a").id == a[-1].id and store.latest("b").id == b[-1].id
    assert [r.id for r in store.log("a")] == [c.id for c in reversed(a)]
    assert [r.id for r in store.log()] == [c.id for c in reversed(a + b)]
    assert len(store.log(limit=2)) == 2 and store.log(limit=0) == []
    assert store.streams() == ["a", "b"]


def test_concurrent_puts_get_distinct_contiguous_versions(store):
    blobs = [artifact_bytes(i) for i in range(12)]
    out, errors = [], []

    def worker(chunk):
        try:
            out.extend(store.put(d, stream="s").version for d in chunk)
        except Exception as e:  # pragma: no cover - reported below
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(blobs[i::3],)) for i in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not errors and sorted(out) == list(range(1, 13))


def test_parents_come_from_the_header_and_the_caller(store):
    a = store.put(artifact_bytes(1), stream="a")
    b = store.put(artifact_bytes(2), stream="b")
    c = store.put(artifact_bytes(3, parents=[a.id]), stream="c", parents=[b.id, a.id])
    assert c.parents == (a.id, b.id)
    assert store.children(a.id) == (c.id,) and store.children(b.id) == (c.id,) and store.children(c.id) == ()


def test_a_missing_parent_is_refused_and_nothing_is_visible(store):
    missing = make_artifact(99).id
    with pytest.raises(CommitNotFoundError, match="put it first"):
        store.put(artifact_bytes(1), stream="a", parents=[missing])
    with pytest.raises(CommitNotFoundError):
        store.put(artifact_bytes(2, parents=[missing]), stream="a")
    assert store.log() == [] and leftovers(store) == 0


def test_bad_input_gets_specific_errors_and_writes_nothing(store):
    with pytest.raises(TruncatedArtifactError):
        store.put(artifact_bytes(1)[:-5], stream="a")
    with pytest.raises(ArtifactError):
        store.put(b"\x10\x00\x00\x00\x00\x00\x00\x00{not json}      ", stream="a")
    with pytest.raises(ConfigError, match="stream name"):
        store.put(artifact_bytes(1), stream="has space")
    with pytest.raises(ConfigError, match="parent"):
        store.put(artifact_bytes(1), stream="a", parents=["abc"])
    art = make_artifact(3)
    with pytest.raises(ConfigError, match="own parent"):
        store.put(art.encode(), stream="a", parents=[art.id])
    for bad in ("nothex", "0" * 63):
        with pytest.raises(ConfigError):
            store.show(bad)
    with pytest.raises(CommitNotFoundError):
        store.get("0" * 64)
    with pytest.raises(CommitNotFoundError):
        store.latest("nobody")
    assert store.log() == [] and leftovers(store) == 0


def test_resolve_finds_a_commit_by_prefix(store):
    c = store.put(artifact_bytes(1), stream="a")
    assert store.resolve(c.id[:6]) == c.id == store.resolve(c.id)
    with pytest.raises(ConfigError):
        store.resolve("ab")
    other = next(p for p in ("0000", "ffff") if not c.id.startswith(p))
    with pytest.raises(CommitNotFoundError):
        store.resolve(other)


# ------------------------------------------------------------------- invalidation
def chain(store, n: int, stream: str = "s", seed: int = 0):
    """n commits, each on its own stream, each built on the previous: a -> b -> c ..."""
    out = []
    for i in range(n):
        out.append(store.put(artifact_bytes(seed + i), stream=f"{stream}{i}",
                             parents=[out[-1].id] if out else []))
    return out


def test_a_new_version_supersedes_the_old_and_its_dependents(store):
    a1 = store.put(artifact_bytes(1), stream="a")
    b1 = store.put(artifact_bytes(2), stream="b", parents=[a1.id])
    c1 = store.put(artifact_bytes(3), stream="c", parents=[b1.id])
    a2 = store.put(artifact_bytes(4), stream="a", parents=[a1.id])
    assert a2.version == 2 and not store.show(a2.id).stale  # built on a1, yet the new truth
    old = store.show(a1.id)
    assert old.stale and old.superseded_by == a2.id and "superseded by" in old.stale_reason
    rec_c = store.show(c1.id)
    assert rec_c.stale and rec_c.stale_chain == (a1.id, b1.id, c1.id) and rec_c.stale_root == a1.id
    assert "2 hops up" in rec_c.stale_reason and f"stream a v2" in rec_c.stale_reason
    events = store.events()
    assert [e.commit for e in events] == [a1.id, b1.id, c1.id]
    assert events[2].chain == (a1.id, b1.id, c1.id) and events[2].root == a1.id
    assert events[2].reason == rec_c.stale_reason


def test_a_new_version_built_on_a_dependent_of_the_old_stays_fresh(store):
    a1 = store.put(artifact_bytes(1), stream="a")
    b1 = store.put(artifact_bytes(2), stream="b", parents=[a1.id])
    a2 = store.put(artifact_bytes(3), stream="a", parents=[b1.id])
    assert store.show(b1.id).stale and not store.show(a2.id).stale
    assert [e.commit for e in store.events()] == [a1.id, b1.id]


def test_consumer_chooses_fresh_or_explicitly_stale(store):
    a1 = store.put(artifact_bytes(1), stream="a")
    b1 = store.put(artifact_bytes(2), stream="b", parents=[a1.id])
    store.put(artifact_bytes(3), stream="a")
    with pytest.raises(StaleCommitError, match=r"latest\('b'\)|allow_stale"):
        store.get(b1.id)
    rec = store.get(b1.id, allow_stale=True)
    assert rec.stale and rec.data is not None and Artifact.decode(rec.data).id == b1.id
    assert store.latest("a").commit.version == 2 and not store.latest("a").stale


def test_operator_invalidation_reaches_every_transitive_dependent(store):
    a, b, c, d = chain(store, 4)
    side = store.put(artifact_bytes(50), stream="side", parents=[b.id])
    unrelated = store.put(artifact_bytes(60), stream="x")
    events = store.invalidate(b.id, reason="source retracted")
    assert {e.commit for e in events} == {b.id, c.id, d.id, side.id}
    assert all(e.root == b.id for e in events) and events[0].commit == b.id
    for cid in (b.id, c.id, d.id, side.id):
        rec = store.show(cid)
        assert rec.stale and rec.stale_chain[0] == b.id and rec.stale_chain[-1] == cid
        assert "source retracted" in rec.stale_reason
    assert store.show(d.id).stale_chain == (b.id, c.id, d.id)
    assert not store.show(a.id).stale and not store.show(unrelated.id).stale
    assert store.invalidate(c.id, reason="again") == []  # already stale: first cause kept
    assert "source retracted" in store.show(c.id).stale_reason
    with pytest.raises(ConfigError):
        store.invalidate(a.id, reason="  ")
    with pytest.raises(CommitNotFoundError):
        store.invalidate("f" * 64, reason="x")


def test_a_diamond_is_marked_once(store):
    top = store.put(artifact_bytes(1), stream="top")
    left = store.put(artifact_bytes(2), stream="l", parents=[top.id])
    right = store.put(artifact_bytes(3), stream="r", parents=[top.id])
    bottom = store.put(artifact_bytes(4), stream="b", parents=[left.id, right.id])
    events = store.invalidate(top.id, reason="x")
    assert sorted(e.commit for e in events) == sorted([top.id, left.id, right.id, bottom.id])
    assert len(store.show(bottom.id).stale_chain) == 3


def test_a_commit_on_a_stale_parent_is_born_stale(store):
    a, b = chain(store, 2)
    store.invalidate(a.id, reason="bad data")
    c = store.put(artifact_bytes(9), stream="c", parents=[b.id])
    rec = store.show(c.id)
    assert rec.stale and rec.stale_chain == (a.id, b.id, c.id) and "bad data" in rec.stale_reason
    assert store.events()[-1].commit == c.id


def test_events_resume_from_a_cursor(store):
    a, b = chain(store, 2)
    store.invalidate(a.id, reason="one")
    first = store.events()
    assert [e.commit for e in first] == [a.id, b.id]
    assert store.events(first[-1].seq) == []
    assert store.events(first[-1].seq, wait_s=0.05) == []
    x = store.put(artifact_bytes(7), stream="x")
    store.invalidate(x.id, reason="two")
    later = store.events(first[-1].seq)
    assert [e.commit for e in later] == [x.id]
    assert [e.commit for e in store.events(first[0].seq, limit=1)] == [b.id]
    with pytest.raises(ConfigError):
        store.events("not-a-cursor")


@pytest.mark.parametrize("after", ["9" * 30, "-1", "1e3", "\u0661", "\ud800", " 1", "", "1-2-3"])
def test_an_event_cursor_no_store_issues_is_a_config_error(store, after):
    with pytest.raises(ConfigError, match="cursor"):
        store.events(after)


def test_event_and_log_limits_past_64_bits_mean_all(store):
    a, b = chain(store, 2)
    store.invalidate(a.id, reason="one")
    assert [e.commit for e in store.events(limit=10**30)] == [a.id, b.id]  # was an OverflowError in SQLite
    assert [r.id for r in store.log(limit=2**64)] == [b.id, a.id]
    with pytest.raises(ConfigError, match="limit"):
        store.events(limit=0)


def test_an_invalidation_reason_must_be_valid_utf8(store):
    a = store.put(artifact_bytes(1), stream="a")
    with pytest.raises(ConfigError, match="UTF-8"):
        store.invalidate(a.id, reason="retracted \ud800")  # a lone surrogate: no database can store it
    assert not store.show(a.id).stale and store.events() == []


# ------------------------------------------------------------------ integrity, gc
def test_a_corrupt_blob_is_refused_on_read_and_reported_by_verify(store):
    good = store.put(artifact_bytes(1), stream="a")
    bad = store.put(artifact_bytes(2), stream="b")
    corrupt_blob(store, bad)
    with pytest.raises(StoreCorruptError):
        store.get(bad.id)
    assert store.get(good.id).data is not None
    problems = store.verify()
    assert [p.commit for p in problems] == [bad.id]
    drop_blob(store, good)
    with pytest.raises(StoreCorruptError, match="missing|lost"):
        store.get(good.id)
    assert {p.commit for p in store.verify()} == {good.id, bad.id}


def test_delete_leaf_refuses_a_commit_with_dependents(store):
    a, b = chain(store, 2)
    assert store.delete_leaf(a.id) is False
    assert store.delete_leaf(b.id) is True
    with pytest.raises(CommitNotFoundError):
        store.get(b.id)
    assert store.children(a.id) == () and store.delete_leaf(a.id) is True
    assert store.log() == [] and store.delete_leaf(a.id) is False


def test_gc_keep_last_never_removes_a_commit_with_live_dependents(store):
    v = [store.put(artifact_bytes(i), stream="a") for i in range(4)]      # a v1..v4
    user = store.put(artifact_bytes(20), stream="u", parents=[v[1].id])   # something built on a v2
    dry = collect(store, GCPolicy(keep_last=1, dry_run=True))
    assert set(dry.removed) == {v[0].id, v[2].id} and dry.kept_for_dependents == (v[1].id,)
    assert len(store.log()) == 5
    report = collect(store, GCPolicy(keep_last=1))
    assert set(report.removed) == {v[0].id, v[2].id} and report.kept_for_dependents == (v[1].id,)
    assert {r.id for r in store.log()} == {v[1].id, v[3].id, user.id}
    assert store.get(v[1].id, allow_stale=True).data is not None
    nxt = store.put(artifact_bytes(30), stream="a")
    assert nxt.version == 5  # versions keep counting after gc
    assert store.verify() == []


def test_gc_ttl_removes_leaf_first_and_keeps_stream_heads(store):
    a, b, c = chain(store, 3, stream="same")  # three streams same0..2, each a head
    a2 = store.put(artifact_bytes(40), stream="same0")
    later = max(r.commit.created for r in store.log()) + 10
    report = collect(store, GCPolicy(ttl_s=5), now=later)
    # a (same0 v1) is expired but b depends on it; b, c and a2 are heads
    assert report.removed == () and report.kept_for_dependents == (a.id,)
    store.delete_leaf(c.id)
    store.delete_leaf(b.id)
    assert collect(store, GCPolicy(ttl_s=5), now=later).removed == (a.id,)
    assert [r.id for r in store.log()] == [a2.id]


def test_hop_depth_and_text_fallback(store):
    links = chain(store, 5)
    rep = hop_report(store, links[-1].id, max_hops=3)
    assert rep.depth == 4 and rep.exceeded
    assert rep.chain == tuple(c.id for c in links)
    assert rep.refs == tuple(c.id for c in reversed(links))
    assert all(f"c2c:{c.id[:12]}" in rep.fallback_text() for c in links)
    ok = hop_report(store, links[2].id, max_hops=3)
    assert ok.depth == 2 and not ok.exceeded
    assert Graph.load(store).deps(links[-1].id, max_hops=3).hops == rep


# ------------------------------------------------------------------ bounded strings
def test_an_overlong_reason_is_refused_and_nothing_is_marked(store):
    a, b, c = chain(store, 3)
    with pytest.raises(ConfigError, match=rf"limit of {MAX_REASON_CHARS} \(MAX_REASON_CHARS\)"):
        store.invalidate(a.id, reason="x" * (5 << 20))
    with pytest.raises(ConfigError, match="MAX_REASON_CHARS"):
        store.invalidate(a.id, reason="y" * (MAX_REASON_CHARS + 1))
    assert not any(store.show(x.id).stale for x in (a, b, c)) and store.events() == []


def test_a_reason_of_exactly_the_limit_is_accepted(store):
    a, b = chain(store, 2)
    reason = "r" * MAX_REASON_CHARS
    events = store.invalidate(a.id, reason=f"  {reason}\n")  # surrounding whitespace does not count
    assert [e.commit for e in events] == [a.id, b.id]
    assert store.show(a.id).stale_reason == f"invalidated: {reason}"
    assert store.show(b.id).stale_reason.endswith(f": invalidated: {reason}")


@pytest.mark.parametrize("bad", ["a" * 201, "ok\n", "", "has space", "a" * 200 + "\n"])
def test_stream_names_are_bounded_at_every_entry_point(store, bad):
    with pytest.raises(ConfigError, match="stream name"):
        store.put(artifact_bytes(1), stream=bad)
    with pytest.raises(ConfigError, match="stream name"):
        store.latest(bad)
    with pytest.raises(ConfigError, match="stream name"):
        store.log(bad)
    assert store.log() == [] and store.streams() == [] and leftovers(store) == 0


def test_stream_names_of_exactly_the_limit_work_and_a_long_agent_falls_back(store):
    name = "s" * 200
    c = store.put(artifact_bytes(1), stream=name)
    assert store.latest(name).id == c.id and [r.id for r in store.log(name)] == [c.id]
    assert store.put(artifact_bytes(2, agent="a" * 201)).stream == "default"
    with pytest.raises(ConfigError, match="sha256 hex id"):
        store.show(c.id + "\n")


def _summary_with(monkeypatch, **labels):
    import c2c.store.ingest as ingest

    real = ingest.summarize
    monkeypatch.setattr(ingest, "summarize", lambda header: {**real(header), "labels": labels})


def test_summary_strings_past_the_bound_are_refused_whatever_the_parser_let_through(store, monkeypatch):
    _summary_with(monkeypatch, note="n" * (MAX_SUMMARY_STRING_CHARS + 1))
    with pytest.raises(ArtifactTooLargeError, match="MAX_SUMMARY_STRING_CHARS"):
        store.put(artifact_bytes(1), stream="a")
    _summary_with(monkeypatch, **{"k" * (MAX_SUMMARY_STRING_CHARS + 1): "v"})
    with pytest.raises(ArtifactTooLargeError, match="MAX_SUMMARY_STRING_CHARS"):
        store.put(artifact_bytes(1), stream="a")
    many = MAX_SUMMARY_CHARS // MAX_SUMMARY_STRING_CHARS + 1
    _summary_with(monkeypatch, **{f"l{i}": "v" * MAX_SUMMARY_STRING_CHARS for i in range(many)})
    with pytest.raises(ArtifactTooLargeError, match="MAX_SUMMARY_CHARS"):
        store.put(artifact_bytes(1), stream="a")
    assert store.log() == [] and store.streams() == [] and leftovers(store) == 0


def test_summary_strings_of_exactly_the_bound_are_stored(store, monkeypatch):
    _summary_with(monkeypatch, note="n" * MAX_SUMMARY_STRING_CHARS)
    c = store.put(artifact_bytes(1), stream="a")
    assert store.show(c.id).commit.summary["labels"] == {"note": "n" * MAX_SUMMARY_STRING_CHARS}


# ------------------------------------------------------------------ trust domains
def _other(store, tag: str = "b"):
    """A second trust domain of the same store (named after the test's own, so Redis tests stay apart)."""
    return store.in_domain(f"{store.domain}-{tag}")


def test_a_stream_is_domain_and_name(store):
    red, blue = store, _other(store)
    r1 = red.put(artifact_bytes(1), stream="findings")
    b1 = blue.put(artifact_bytes(2), stream="findings")  # the same name in another domain: another stream
    b2 = blue.put(artifact_bytes(3), stream="findings")
    assert (r1.version, b1.version, b2.version) == (1, 1, 2)
    assert not red.show(r1.id).stale and red.show(r1.id).superseded_by is None  # blue never supersedes red
    assert red.latest("findings").id == r1.id and blue.latest("findings").id == b2.id
    assert [r.id for r in red.log()] == [r1.id] and [r.id for r in blue.log("findings")] == [b2.id, b1.id]
    assert red.streams() == ["findings"] and blue.streams() == ["findings"]


def test_a_domain_sees_nothing_of_another(store):
    red, blue = store, _other(store)
    r = red.put(artifact_bytes(1), stream="a")
    for call in (lambda: blue.show(r.id), lambda: blue.get(r.id), lambda: blue.children(r.id),
                 lambda: blue.invalidate(r.id, reason="x"), lambda: blue.resolve(r.id[:8])):
        with pytest.raises(CommitNotFoundError):
            call()
    with pytest.raises(CommitNotFoundError):  # parents never cross domains
        blue.put(artifact_bytes(2), stream="b", parents=[r.id])
    assert blue.log() == [] and blue.streams() == [] and leftovers(blue) == 0
    assert blue.delete_leaf(r.id) is False and red.show(r.id).id == r.id


def test_invalidation_and_events_stay_in_their_domain(store):
    red, blue = store, _other(store)
    a, b = chain(red, 2)
    x = blue.put(artifact_bytes(9), stream="x")
    red.invalidate(a.id, reason="red's own reason")
    assert blue.events() == [] and not blue.show(x.id).stale
    assert [e.commit for e in red.events()] == [a.id, b.id]
    blue.invalidate(x.id, reason="blue's")
    assert [e.commit for e in blue.events()] == [x.id]  # blue's cursor starts from blue's first event
    assert [e.commit for e in red.events(red.events()[-1].seq)] == []


def test_the_same_bytes_in_two_domains_are_two_commits(store):
    red, blue = store, _other(store)
    data = artifact_bytes(5)
    r, b = red.put(data, stream="a"), blue.put(data, stream="z")
    assert r.id == b.id and (r.stream, b.stream) == ("a", "z")
    assert red.delete_leaf(r.id) is True
    with pytest.raises(CommitNotFoundError):
        red.show(r.id)
    assert blue.get(b.id).data == data  # the blob another domain still uses is kept


def test_a_grant_is_a_pointer_in_the_readers_domain_only(store):
    red, blue, green = store, _other(store, "b"), _other(store, "g")
    r = red.put(artifact_bytes(1), stream="a")
    assert blue.granted(r.id) is None
    red.grant(r.id, [blue.domain])
    assert blue.granted(r.id) == red.domain and green.granted(r.id) is None and red.granted(r.id) is None
    with pytest.raises(CommitNotFoundError):  # a grant lets blue find it; it does not put it in blue's domain
        blue.show(r.id)
    assert blue.in_domain(blue.granted(r.id)).get(r.id).data == red.get(r.id).data
    with pytest.raises(CommitNotFoundError):  # only a domain's own commits can be granted
        blue.grant(r.id, [green.domain])
    with pytest.raises(ConfigError):
        red.grant(r.id, ["not a domain"])


def test_a_domain_handle_shares_the_connection_and_leaves_it_open(store):
    blue = _other(store)
    assert blue.domain != store.domain and store.in_domain(store.domain) is store
    blue.close()  # a view: the store stays usable
    assert store.put(artifact_bytes(1), stream="a").version == 1
    with pytest.raises(ConfigError):
        store.in_domain("bad domain!")
