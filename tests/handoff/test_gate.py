"""The gate (c2c.handoff.gate) on its own, without a front-end: publish signs once and grants what the signed header
shares; parents split by owner once; admit reads one Receiver; an Admission's text is the commit's, the chain cited
where the hop check failed; an explicit mode raises, auto does not."""

from __future__ import annotations

import pytest

from c2c.artifact.prefix import SharedPrefix
from c2c.commit.author import SHARED_PARENTS, Parents
from c2c.errors import CommitNotVisibleError, PrefixMismatchError
from c2c.handoff.decide import Party
from c2c.handoff.gate import ADVISOR_NOTE, PROMPT_NOTE, Gate, Receiver
from c2c.handoff.policy import HandoffPolicy
from c2c.trust.keys import Keyring


@pytest.fixture
def world(tiny, tmp_path):
    """(gate, runtime, teams by domain) over one SQLite store and keyring: domains lab and ops."""
    from c2c.store import open_store
    from c2c.team.agent import Team

    ring = Keyring(tmp_path / "keys")
    for d in ("lab", "ops"):
        ring.create_key(d)
        ring.set_policy(d, {"kv": "none"})
    rt = tiny("qwen2")
    teams = {d: Team(shared=SharedPrefix.build("A careful team."), domain=d, keyring=ring) for d in ("lab", "ops")}
    with open_store(f"sqlite:///{tmp_path}/store") as store:
        yield Gate(store, ring), rt, teams


def agent(rt, team, text="Evidence: the outage began at 09:14."):
    from c2c.team.agent import Agent

    a = Agent("analyst", rt, team)
    a.read(text)
    return a


def receiver(a, mode="auto", **kw) -> Receiver:
    return Receiver(party=Party.of(a), policy=HandoffPolicy(mode=mode), held=a.cache, **kw)


def test_publish_signs_once_and_grants_the_domains_the_signed_header_names(world):
    gate, rt, teams = world
    art = agent(rt, teams["lab"]).commit(share=("ops",))
    assert art.signature is None                                   # commit_of leaves it unsigned
    done = gate.publish("lab", art, stream="analyst")
    assert done.share == ("ops",) and done.key.domain == "lab" and done.record()["signed_by"]["domain"] == "lab"
    assert gate.scope("ops").granted(done.commit.id) == "lab"     # the grant the header names, no other
    assert gate.scope("lab").granted(done.commit.id) is None


def test_parents_split_by_owner_once_own_as_store_parents_shared_in_a_label(world):
    gate, rt, teams = world
    own = gate.publish("lab", agent(rt, teams["lab"]).commit(), stream="a").commit.id
    theirs = gate.publish("ops", agent(rt, teams["ops"]).commit(share=("lab",)), stream="b").commit.id
    parents = gate.parents("lab", [own, theirs, own], as_text=[own, theirs])
    assert parents == Parents(own=(own,), shared=(theirs,), as_text=(own,))
    child = gate.publish("lab", agent(rt, teams["lab"]).commit(parents=parents), stream="c")
    assert child.commit.parents == (own,) and child.shared_parents == (theirs,)
    header = gate.admit(child.commit.id, receiver(agent(rt, teams["lab"]))).artifact.header
    assert header.labels[SHARED_PARENTS] == theirs and header.parents == (own,)


def test_admit_reads_one_receiver_and_an_explicit_mode_raises_where_auto_reads_text(world):
    from c2c.team.agent import Team

    gate, rt, teams = world
    cid = gate.publish("lab", agent(rt, teams["lab"]).commit(), stream="a").commit.id
    same = gate.admit(cid, receiver(agent(rt, teams["lab"], "Other words.")))
    assert same.path == "cache" and same.record()["requested"] == "auto"
    other_team = Team(shared=SharedPrefix.build("Another team."), domain="lab", keyring=teams["lab"].keyring)
    elsewhere = agent(rt, other_team)
    auto = gate.admit(cid, receiver(elsewhere))
    assert auto.path == "text" and auto.decision.check("prefix").ok is False
    assert auto.text(rt) == "evidence: Evidence: the outage began at 09:14."
    with pytest.raises(PrefixMismatchError):
        gate.admit(cid, receiver(elsewhere, mode="full"))
    with pytest.raises(CommitNotVisibleError):   # another domain's, not shared with it
        gate.admit(cid, receiver(agent(rt, teams["ops"])))


def test_the_text_of_a_commit_past_the_hop_limit_cites_the_chain_it_would_have_extended(world):
    gate, rt, teams = world
    cid = gate.publish("lab", agent(rt, teams["lab"]).commit(), stream="a").commit.id
    for _ in range(2):   # each commit built on the last: a chain of cache hops
        cid = gate.publish("lab", agent(rt, teams["lab"]).commit(parents=gate.parents("lab", [cid])),
                           stream="a").commit.id
    a = agent(rt, teams["lab"])
    adm = gate.admit(cid, Receiver(party=Party.of(a), policy=HandoffPolicy(mode="auto", max_hops=1), held=a.cache))
    assert adm.path == "text" and adm.decision.check("hops").ok is False
    text = adm.text(rt)
    assert text.startswith("evidence: Evidence") and "cache hops (limit 1)" in text and f"c2c:{cid[:12]}" in text


def test_one_fall_back_rule_before_the_decision_text_only_where_the_prompt_holds_it(world):
    """A store that is down in auto: vLLM's receiver (its prompt holds the conversation) prefills as sent; the
    library's and c2c serve's (they would read the commit's text) get the error. Tampering, an invisible id or a bad
    signature is an error for every receiver in every mode."""
    from c2c.errors import CommitNotVisibleError, StoreCorruptError, StoreError, BadSignatureError

    gate, rt, teams = world
    a = agent(rt, teams["lab"])
    reads_text, holds_prompt = receiver(a), receiver(a, prompt_holds_text=True)
    down = StoreError("the store is unavailable; retry later")
    assert holds_prompt.falls_back(down, "auto") and not reads_text.falls_back(down, "auto")
    assert not holds_prompt.falls_back(down, "full") and not holds_prompt.falls_back(down, "text")
    for fatal in (StoreCorruptError("damaged"), CommitNotVisibleError("no"), BadSignatureError("bad")):
        assert not holds_prompt.falls_back(fatal, "auto") and not reads_text.falls_back(fatal, "auto")


def test_what_a_record_says_of_the_advisor_follows_from_what_text_means_for_the_receiver(world):
    """The gate never asks the advisor; the record says why in the receiver's own terms (no per-caller note):
    the commit's kept text is already written (the library, c2c serve), or the prompt already holds it (vLLM)."""
    gate, rt, teams = world
    a = agent(rt, teams["lab"])
    cid = gate.publish("lab", a.commit(), stream="notes").commit.id
    assert gate.admit(cid, receiver(a)).decision.check("advisor").detail == ADVISOR_NOTE
    assert receiver(a).advice_note == ADVISOR_NOTE
    assert receiver(a, prompt_holds_text=True).advice_note == PROMPT_NOTE != ADVISOR_NOTE
