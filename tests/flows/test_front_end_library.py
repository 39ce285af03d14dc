"""The front-ends' conformance cases (c2c.testing.front_ends) against the library: c2c.flows.chain.pull.

The same table runs against a real `c2c serve` (tests/serve/test_front_end_serve.py) and a real
`vllm serve` with the connector (tests/vllm/test_front_end_vllm.py).
"""

from __future__ import annotations

import json

import pytest

from c2c.artifact.codec import Artifact
from c2c.artifact.prefix import SharedPrefix
from c2c.errors import C2CError
from c2c.flows.chain import publish, pull
from c2c.store import open_store
from c2c.team.agent import Agent, Team
from c2c.testing import front_ends as fe
from c2c.trust.keys import Keyring

SHARED = SharedPrefix.build("You are one agent of a team that answers incident questions. " * 3)
EVIDENCE = "Evidence: the outage began at 09:14 after deploy 7 reached the eu-west pool. " * 2


@pytest.fixture
def world(tiny, tmp_path):
    """Two domains over one store and one keyring; research's policy checks signatures only (as c2c serve's
    default), so that the kv_policy case is the one that asks for more."""
    ring = Keyring(tmp_path / "keys")
    ring.set_policy(fe.DOMAIN, {"kv": "none"})
    store = open_store(f"sqlite:///{tmp_path}/store")
    rt = tiny("qwen2")
    teams = {d: Team(shared=SHARED, domain=d, keyring=ring) for d in (fe.DOMAIN, fe.OTHER)}
    yield rt, teams, store, ring
    store.close()


def commit(rt, team, name="analyst", *, share=(), store) -> str:
    a = Agent(name, rt, team)
    a.read(EVIDENCE + name, label="evidence")
    return publish(store, a, share=share)


def attach(rt, team, store, cid, mode="full") -> fe.Outcome:
    try:
        got = pull(store, cid, Agent("writer", rt, team), mode=mode)
    except C2CError as e:
        return fe.of_error(e)
    return fe.of_record(got.record)


def run_case(case: str, world, mode: str = "full") -> tuple[fe.Outcome, dict]:
    rt, teams, store, ring = world
    research, other = teams[fe.DOMAIN], teams[fe.OTHER]
    extra: dict = {}
    if case == "own":
        return attach(rt, research, store, commit(rt, research, store=store), mode=mode), extra
    if case == "shared":
        return attach(rt, research, store, commit(rt, other, share=(fe.DOMAIN,), store=store), mode=mode), extra
    if case in ("foreign", "made_up"):
        cid = commit(rt, other, store=store) if case == "foreign" else "ab" * 32
        try:
            pull(store, cid, Agent("writer", rt, research), mode=mode)
        except C2CError as e:
            extra["message"], extra["id"] = str(e), cid
            return fe.of_error(e), extra
    if case == "stale":
        cid = commit(rt, research, store=store)
        store.in_domain(fe.DOMAIN).invalidate(cid, reason="retracted")
        return attach(rt, research, store, cid, mode=mode), extra
    if case == "tampered":
        cid = commit(rt, research, store=store)
        s = store.in_domain(fe.DOMAIN)
        digest = s._load(cid)[2][-1][0]
        path = s._chunk_path(fe.DOMAIN, digest)
        raw = bytearray(path.read_bytes())
        raw[len(raw) // 2] ^= 1
        path.write_bytes(bytes(raw))
        return attach(rt, research, store, cid, mode=mode), extra
    if case == "wrong_model":
        return attach(tiny_other(rt), research, store, commit(rt, research, store=store), mode=mode), extra
    if case == "wrong_prefix":
        cid = commit(rt, research, store=store)
        return attach(rt, Team(shared=SharedPrefix.build("Another team."), domain=fe.DOMAIN, keyring=ring), store,
                      cid, mode=mode), extra
    if case == "over_quota":
        store.in_domain(fe.DOMAIN).set_quota(1)
        try:
            commit(rt, research, store=store)
        except C2CError as e:
            return fe.of_error(e), extra
        raise AssertionError("a publish past the quota was taken")
    if case == "kv_policy":
        cid = commit(rt, research, store=store)
        ring.set_policy(fe.DOMAIN, {"kv": "sample", "samples": 4})
        return attach(rt, research, store, cid, mode=mode), extra
    raise AssertionError(case)


def tiny_other(rt):
    from c2c.runtime import zoo

    return zoo.load("tiny-llama")  # another model: its fingerprint differs


@pytest.mark.parametrize("case, mode", fe.CASE_MODES)
def test_the_library_answers_every_case_as_every_front_end(world, case, mode):
    got, extra = run_case(case, world, mode)
    want = fe.expected(case, checks_kv=True, mode=mode)
    assert got.comparable() == want.comparable(), (case, mode, got)
    if case == "kv_policy" and mode != "text":
        assert got.kv == "sample"  # the domain's stored policy ran, though the library's default was none


def test_an_id_another_domain_holds_reads_as_one_that_does_not_exist(world):
    _, a = run_case("foreign", world)
    _, b = run_case("made_up", world)
    assert fe.same_answer(a["message"], b["message"], a["id"], b["id"])


def test_a_shared_commits_record_names_its_signer_by_domain_alone_and_the_share(world):
    """The library's record of another domain's commit (its trust report included) carries no key id, key
    label or signing time of the owner's signer, and its reason names the share, not one trust domain."""
    rt, teams, store, _ = world
    cid = commit(rt, teams[fe.OTHER], share=(fe.DOMAIN,), store=store)
    signature = Artifact.decode(store.in_domain(fe.OTHER).get(cid).data).signature
    got = pull(store, cid, Agent("writer", rt, teams[fe.DOMAIN]))
    assert got.record["path"] == "cache" and got.record["trust"]["signer"] == {"domain": fe.OTHER}
    text = json.dumps({"record": got.record, "trust": got.trust})
    assert not [f for f in ('"key_id":', '"label":', '"signed_at":') if f in text], got.record
    assert signature["key_id"][:16] not in text and signature["signed_at"] not in text
    assert "same trust domain" not in got.record["reason"]
    assert f"shared with {fe.DOMAIN!r} by {fe.OTHER!r}" in got.record["reason"], got.record["reason"]
