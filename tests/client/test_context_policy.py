"""The client-side context policy: a rolling window of tool responses, a token target, a reposition interval."""

import pytest

from c2c.client.context_policy import ContextPolicy, ContextWindow
from c2c.errors import ConfigError


def history(n_tools, size=40):
    out = [{"role": "system", "content": "sys"}]
    for k in range(n_tools):
        out += [{"role": "assistant", "content": f"call {k}"}, {"role": "tool", "content": "x" * size}]
    return out


def test_a_rolling_window_drops_the_oldest_tool_responses_cumulatively():
    w = ContextWindow(ContextPolicy(keep_tool_responses=2))
    assert w.edit(history(2)) is None                   # nothing to drop yet: no edit sent
    e = w.edit(history(3))
    assert e == {"drop": [2], "reposition": True, "repair": "none"}
    assert w.edit(history(5))["drop"] == [2, 4, 6]      # cumulative, tool responses only
    assert [m["content"] for m in w.kept(history(5))] == ["sys", "call 0", "call 1", "call 2", "call 3", "x" * 40,
                                                          "call 4", "x" * 40]


def test_a_token_target_drops_more_of_the_oldest():
    w = ContextWindow(ContextPolicy(keep_tool_responses=None, token_target=60, chars_per_token=4.0))
    drop = w.drops(history(4))          # 4 responses of ~14 tokens, 4 calls and the system of ~5: over 60
    kept = [m for i, m in enumerate(history(4)) if i not in drop]
    assert drop == [2, 4] and sum(len(m["content"]) / 4 + 4 for m in kept) <= 60
    counted = ContextWindow(ContextPolicy(keep_tool_responses=None, token_target=2000), count_tokens=lambda t: 300)
    assert counted.drops(history(4)) == [2, 4, 6]       # the caller's own token count decides


def test_reposition_every_n_requests_and_repair_only_with_it():
    w = ContextWindow(ContextPolicy(keep_tool_responses=1, reposition_every=2, repair="first:8"))
    first, second = w.edit(history(2)), w.edit(history(3))
    assert first == {"drop": [2], "reposition": False, "repair": "none"}
    assert second == {"drop": [2, 4], "reposition": True, "repair": "first:8"}


def test_extra_body_names_the_session_and_keeps_other_fields():
    w = ContextWindow(ContextPolicy(keep_tool_responses=1), session="a-1")
    body = w.extra_body(history(2), publish={"stream": "notes"})
    assert body == {"c2c": {"publish": {"stream": "notes"}, "session": "a-1",
                            "edit": {"drop": [2], "reposition": True, "repair": "none"}}}


def test_langchain_messages_work_too():
    from langchain_core.messages import AIMessage, SystemMessage, ToolMessage

    msgs = [SystemMessage(content="s")]
    for k in range(3):
        msgs += [AIMessage(content=f"c{k}"), ToolMessage(content="r", tool_call_id=str(k))]
    assert ContextWindow(ContextPolicy(keep_tool_responses=1)).drops(msgs) == [2, 4]


def test_a_shorter_history_than_the_drops_and_bad_settings_are_refused():
    w = ContextWindow(ContextPolicy(keep_tool_responses=1))
    w.edit(history(3))
    with pytest.raises(ConfigError, match="full history"):
        w.edit(history(1))
    for bad in ({"keep_tool_responses": -1}, {"token_target": 0}, {"reposition_every": 0}):
        with pytest.raises(ConfigError):
            ContextPolicy(**bad)
