"""Agent.drop: a span leaves the context and its cache without a prefill; what is exported says so."""

import pytest

from c2c.artifact.header import EDIT_KEY
from c2c.artifact.prefix import SharedPrefix
from c2c.errors import ConfigError
from c2c.team.agent import Agent, Team


def test_drop_takes_a_span_out_of_the_context_cache_and_messages(tiny):
    rt = tiny("qwen2")
    agent = Agent("analyst", rt, Team(shared=SharedPrefix.build("You are a careful agent.")))
    agent.read("Tool output one: the vault code is 4471.", label="tool-1")
    agent.read("Tool output two: the ferry leaves at noon.", label="tool-2")
    agent.read("Tool output three: pier 9.", label="tool-3")
    before = agent.context
    step = agent.drop("tool-2", repair="ratio:1")
    two = before.spans_labelled("tool-2")[0]
    assert step.dropped_tokens == two.length and [s.label for s in agent.context.spans] == ["tool-1", "tool-3"]
    assert agent.cache.token_ids == agent.context.token_ids and not agent.cache.exact
    assert [m["content"][:16] for m in agent.messages[1:]] == ["Tool output one:", "Tool output thre"]
    # everything after the gap was recomputed: the cache equals a prefill of what is kept
    _, truth = rt.prefill(list(agent.context.token_ids))
    assert agent.cache.max_abs_diff(truth) < 1e-4
    agent.respond("What is the code?", max_new_tokens=3)
    assert agent.cache.token_ids == agent.context.token_ids and not agent.cache.exact
    record = agent.export().header.extra[EDIT_KEY]
    assert record["dropped_tokens"] == two.length and record["steps"][0]["repair"] == "ratio:1"
    with pytest.raises(ConfigError, match="no span labelled"):
        agent.drop("nothing")


def test_an_edited_agent_is_handed_off_as_approximate_or_refused_in_full(tiny):
    from c2c.errors import EditedCacheError
    from c2c.handoff import hand_off

    rt = tiny("qwen2")
    team = Team(shared=SharedPrefix.build("You are a careful agent."))
    analyst, writer = Agent("analyst", rt, team), Agent("writer", rt, team)
    analyst.read("Tool output one: the vault code is 4471.", label="tool-1")
    analyst.read("Tool output two: the ferry leaves at noon.", label="tool-2")
    analyst.drop("tool-1", reposition=False)
    with pytest.raises(EditedCacheError, match="approximate"):
        hand_off(analyst, writer, mode="full")
    h = hand_off(analyst, writer, mode="auto")
    assert h.path == "cache" and "approximate" in h.reason
    assert not writer.cache.exact and not writer.cache.gaps   # the export closed the gap; the record came along
