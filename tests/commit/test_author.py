"""c2c.commit.author: one function makes every commit header (#54); its text comes back with text_of."""

from __future__ import annotations

import pytest

from c2c.artifact.header import SHARE_KEY
from c2c.artifact.prefix import PrefixRef, SharedPrefix
from c2c.commit.author import (LEGACY_TEXT_KEYS, MAX_TEXT_BYTES, SHARED_PARENTS, TEXT_KEY, Parents, bounded_text,
                               commit_of, text_of)
from c2c.canon import canonical_json
from c2c.conversation import Conversation, Part
from c2c.errors import ConfigError, HandoffError
from c2c.store.hops import TEXT_PARENTS


@pytest.fixture
def served(tiny):
    """A tiny model's conversation of four parts after the prefix (one private), and its cache from position 0."""
    rt = tiny("qwen2")

    def turn(label, text, private=None):
        return Part(label=label, token_ids=tuple(rt.encode(rt.render_turn("user", text))), text=f"{label}: {text}",
                    private=private)

    conv = Conversation(parts=(Part(label="prefix", token_ids=SharedPrefix.build("A team.").token_ids(rt)),
                               turn("role", "Secret instructions.", private=True), turn("evidence", "At 09:14."),
                               turn("note", "Deploy 7."), turn("ask", "When?")))
    _, cache = rt.prefill(list(conv.token_ids))
    return rt, conv, cache


def test_a_whole_commit_says_part_0_is_its_prefix_and_keeps_the_text_of_its_shared_parts(served):
    rt, conv, cache = served
    from c2c.artifact.fingerprint import Fingerprint

    art = commit_of(conv, cache=cache, fingerprint=Fingerprint.of(rt), producer={"agent": "a", "domain": "lab"},
                    parents=Parents(own=("1" * 64, "2" * 64), shared=("3" * 64,), as_text=("2" * 64,)),
                    share=["ops", "audit", "ops"])
    h = art.header
    assert h.prefix == PrefixRef.of(conv.prefix_ids) and h.kind == "full" and h.tokens == conv.token_ids
    kept = h.extra[TEXT_KEY]
    assert kept == {"v": 1, "agent": "a", "text": "evidence: At 09:14.\n\nnote: Deploy 7.\n\nask: When?",
                    "truncated": False}                       # never the prefix's, never the private part's
    assert h.parents == ("1" * 64, "2" * 64) and h.labels[SHARED_PARENTS] == "3" * 64
    assert h.labels[TEXT_PARENTS] == "1" and h.extra[SHARE_KEY] == ["audit", "ops"] == list(h.shared_with)
    assert text_of(art) == kept["text"]


def test_a_slice_names_its_parts_and_keeps_their_text_only(served):
    rt, conv, cache = served
    from c2c.artifact.fingerprint import Fingerprint

    start, end = conv.context().export_range(("evidence", "note"))
    art = commit_of(conv, cache=cache.slice(start, end), fingerprint=Fingerprint.of(rt), producer={"agent": "a"},
                    labels=("evidence", "note"), isolation="positions")
    assert art.header.labels == {"span": "evidence,note", "isolation": "positions"} and art.header.kind == "slice"
    assert text_of(art) == "evidence: At 09:14.\n\nnote: Deploy 7."
    with pytest.raises(ConfigError, match="publish labels"):
        commit_of(conv, cache=cache, fingerprint=Fingerprint.of(rt), producer={}, labels=("nowhere",))
    with pytest.raises(ConfigError, match="private"):
        commit_of(conv, cache=cache, fingerprint=Fingerprint.of(rt), producer={}, labels=("role",))
    with pytest.raises(HandoffError, match="internal"):   # a front-end that hands the wrong K/V finds out
        commit_of(conv, cache=cache, fingerprint=Fingerprint.of(rt), producer={}, labels=("evidence",))
    with pytest.raises(HandoffError, match="internal"):
        commit_of(conv, cache=cache.slice(0, len(conv) - 1), fingerprint=Fingerprint.of(rt), producer={})


@pytest.mark.parametrize("share", [["no such/domain"], "ops", ["d%d" % i for i in range(17)]])
def test_a_bad_share_list_is_refused_before_anything_is_built(served, share):
    rt, conv, cache = served
    from c2c.artifact.fingerprint import Fingerprint

    with pytest.raises(ConfigError, match="share"):
        commit_of(conv, cache=cache, fingerprint=Fingerprint.of(rt), producer={}, share=share)


def test_text_is_bounded_oldest_first_and_read_back_from_every_key_or_the_tokens(served):
    rt, conv, cache = served
    long = "".join(f"line {i}\n" for i in range(20000))
    cut, truncated = bounded_text(long)
    assert truncated and cut.endswith("line 19999\n") and cut.startswith("[... ")
    assert len(canonical_json({TEXT_KEY: {"v": 1, "agent": "x" * 64, "text": cut, "truncated": True}})) <= MAX_TEXT_BYTES
    assert bounded_text("short") == ("short", False)

    from dataclasses import replace

    from c2c.artifact.fingerprint import Fingerprint

    art = commit_of(conv, cache=cache, fingerprint=Fingerprint.of(rt), producer={"agent": "a"})
    older = replace(art, header=replace(art.header, extra={LEGACY_TEXT_KEYS[0]: art.header.extra[TEXT_KEY]}))
    assert text_of(older) == text_of(art)                     # what c2c serve kept before this author
    bare = replace(art, header=replace(art.header, extra={}))
    with pytest.raises(HandoffError, match="keeps no text"):
        text_of(bare)                                         # no runtime: nothing to decode with
    decoded = text_of(bare, runtime=rt)                       # its own tokens after its prefix, never the prefix
    assert "At 09:14." in decoded and "A team." not in decoded


def test_the_library_agent_commits_through_the_same_author(tiny):
    """Agent.commit is commit_of over Agent.conversation: its prefix is the team's, its text its messages', never
    its private role turn's."""
    from c2c.team.agent import Agent, Team

    rt = tiny("qwen2")
    team = Team(shared=SharedPrefix.build("A team."), domain="lab")
    a = Agent("analyst", rt, team, role="Secret role instructions.")
    a.read("At 09:14.")
    art = a.commit(share=("ops",))
    assert art.header.prefix == a.prefix and art.header.producer == {"agent": "analyst", "domain": "lab"}
    assert text_of(art) == "evidence: At 09:14." and art.header.shared_with == ("ops",)
    assert a.export().header.extra[TEXT_KEY] == art.header.extra[TEXT_KEY]   # the file export: the same header
