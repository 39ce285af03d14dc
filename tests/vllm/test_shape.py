"""One request shape with ``c2c serve`` (``extra_body={"c2c": ...}``), and streamed replies that carry the commit.

The first tests read request bodies without vLLM; the rest drive the session's real
``vllm serve`` with the real ``openai`` client.
"""

from __future__ import annotations

import time

import pytest
from openai import APIStatusError, OpenAI

from c2c.errors import ConfigError
from c2c.vllm import shape as shapes
from c2c.vllm import tickets

from vllm_helpers import FOLLOW_UP, OTHER, QUESTION, SYSTEM

ID = "ab" * 32


def test_c2c_serves_shape_becomes_the_native_one():
    doc = {"model": "m", "c2c": {"attach": [ID], "mode": "full", "session": "s1",
                                 "publish": {"stream": "notes", "share": ["ops"]}}}
    s = shapes.read(doc)
    assert s.name == shapes.SERVE and s.ticket is None and "c2c" not in doc
    assert doc["kv_transfer_params"]["c2c"] == {"attach": ID, "mode": "full",
                                                "publish": {"stream": "notes", "share": ["ops"]}}
    assert (s.ask.attach, s.ask.mode, s.ask.publish, s.ask.share) == (ID, "full", True, ("ops",))
    native = {"kv_transfer_params": {"c2c": {"attach": ID, "ticket": "0" * 32}}}
    s = shapes.read(native)
    assert s.name == shapes.NATIVE and s.ticket is None  # a whole reply: the client's ticket is dropped
    assert "ticket" not in native["kv_transfer_params"]["c2c"]
    assert shapes.read({"model": "m"}) is None and shapes.read({"c2c": None}) is None


def test_a_streamed_request_gets_a_fresh_ticket_the_client_cannot_choose():
    mine = "1" * 32
    for doc in ({"stream": True, "c2c": {"publish": {}}},
                {"stream": True, "kv_transfer_params": {"c2c": {"publish": True, "ticket": mine}}}):
        s = shapes.read(doc)
        assert s.ticket and s.ticket != mine and tickets.check_ticket(s.ticket) == s.ticket
        assert doc["kv_transfer_params"]["c2c"]["ticket"] == s.ticket


@pytest.mark.parametrize("c2c, says", [
    ({"attach": [ID, ID]}, "one commit per request"),
    ({"mode": "slice"}, "c2c serve's only"),
    ({"publish": {"labels": ["facts"]}}, "labelled slice"),
    ({"timeout_s": 5}, "per-request deadline"),
    ({"attach": ["xyz"]}, "^c2c.attach 'xyz' is not a full sha256"),
    ({"sesion": "typo"}, "unknown: sesion"),
    ("attach", "takes"),
])
def test_what_vllm_cannot_honour_is_refused_by_name(c2c, says):
    with pytest.raises(ConfigError, match=says):
        shapes.read({"c2c": c2c})
    with pytest.raises(ConfigError, match="not both"):
        shapes.read({"c2c": {}, "kv_transfer_params": {"c2c": {}}})


def test_the_reply_is_in_c2c_serves_fields():
    # the record counts the commit's tokens (as c2c serve's does); the reply's top level the whole prompt's
    rec = {"commit": ID, "path": "cache", "used": "full", "tokens": 42, "imported_tokens": 40, "reused_tokens": 2,
           "prefilled_tokens": 0}
    out = {"attach": rec, "publish": None, "imported_tokens": 40, "reused_tokens": 2, "prefilled_tokens": 5}
    field, value = shapes.reply(out, shapes.Shape(name=shapes.SERVE, ask=None))
    assert field == "c2c" and value["attach"] == [rec] and value["attached"] == [ID]
    assert (value["cached_tokens"], value["imported_tokens"], value["prefilled_tokens"]) == (42, 40, 5)
    field, value = shapes.reply({}, shapes.Shape(name=shapes.SERVE, ask=None),
                                {"prompt_tokens": 30, "prompt_tokens_details": {"cached_tokens": 16}})
    assert value["attach"] == [] and (value["cached_tokens"], value["prefilled_tokens"]) == (16, 14)
    assert shapes.reply({"x": 1}, shapes.Shape(name=shapes.NATIVE, ask=None)) == ("kv_transfer_params",
                                                                                  {"c2c": {"x": 1}})


# ---------------------------------------------------------------- a real vllm serve
@pytest.fixture(scope="module")
def client(vllm_server):
    return OpenAI(base_url=vllm_server.base_url, api_key="unused", max_retries=0, timeout=300)


def ask(client, messages, max_tokens=16, **extra):
    return client.chat.completions.create(model="smol", messages=messages, max_tokens=max_tokens, temperature=0,
                                          extra_body=extra)


def streamed(client, messages, max_tokens=16, **extra):
    """(text, the chunks) of a streamed greedy reply."""
    chunks = list(client.chat.completions.create(model="smol", messages=messages, max_tokens=max_tokens,
                                                 temperature=0, stream=True, extra_body=extra))
    return "".join(c.choices[0].delta.content or "" for c in chunks if c.choices), chunks


def leftover_tickets(server, within_s: float = 10.0) -> list:
    """The ticket files still there after ``within_s`` seconds (a report is collected as soon as it is written,
    which may be just after the reply has gone)."""
    deadline = time.monotonic() + within_s
    while True:
        left = sorted(p.name for p in (server.home / "vllm" / "tickets").glob("*"))
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.1)


@pytest.mark.vllm
@pytest.mark.slow
@pytest.mark.redis
def test_the_same_request_shape_as_c2c_serve_publishes_and_attaches(client, vllm_server):
    r = ask(client, [SYSTEM, QUESTION], 24, c2c={"session": "analyst-1", "publish": {"stream": "shape-analyst"}})
    c2c = r.model_extra["c2c"]
    assert "kv_transfer_params" not in (r.model_extra or {}) or not r.model_extra["kv_transfer_params"]
    pub = c2c["publish"]
    assert "error" not in pub and len(pub["commit"]) == 64 and pub["stream"] == "shape-analyst"
    assert c2c["attach"] == [] and c2c["session"] is None and c2c["prefilled_tokens"] == r.usage.prompt_tokens
    messages = [SYSTEM, QUESTION, {"role": "assistant", "content": r.choices[0].message.content}, FOLLOW_UP]
    w = ask(client, messages, 16, c2c={"attach": [pub["commit"]], "mode": "auto"})
    [rec] = w.model_extra["c2c"]["attach"]
    assert rec["path"] == "cache" and rec["imported_tokens"] > 0, rec
    assert w.model_extra["c2c"]["attached"] == [pub["commit"]]
    assert w.model_extra["c2c"]["cached_tokens"] == w.usage.prompt_tokens_details.cached_tokens
    fresh = ask(client, messages, 16)  # the same prompt prefilled: the same greedy answer
    assert w.choices[0].message.content == fresh.choices[0].message.content
    with pytest.raises(APIStatusError) as info:
        ask(client, messages, 4, c2c={"attach": [pub["commit"]], "publish": {"labels": ["facts"]}})
    assert info.value.status_code == 400 and info.value.body["c2c_error"] == "ConfigError"
    assert "labelled slice" in info.value.body["message"]


@pytest.mark.vllm
@pytest.mark.slow
@pytest.mark.redis
@pytest.mark.parametrize("how", ["c2c", "kv_transfer_params"])
def test_a_streamed_reply_carries_its_commit_in_the_finishing_chunk(client, vllm_server, how):
    fields = {"publish": {"stream": f"streamed-{how[:2]}"}}
    text, chunks = streamed(client, [SYSTEM, QUESTION], 24, **({"c2c": fields} if how == "c2c" else
                                                               {"kv_transfer_params": {"c2c": fields}}),
                            stream_options={"include_usage": True})
    whole = ask(client, [SYSTEM, QUESTION], 24)
    assert text == whole.choices[0].message.content  # the stream is vLLM's own, untouched
    [last] = [c for c in chunks if c.choices and c.choices[0].finish_reason]
    extra = last.model_extra[how]
    pub = (extra if how == "c2c" else extra["c2c"])["publish"]
    assert "error" not in pub and len(pub["commit"]) == 64 and pub["version"] >= 1, pub
    assert chunks[-1].usage is not None  # include_usage's chunk still comes last
    # the commit is the conversation: attaching it to its continuation loads it
    messages = [SYSTEM, QUESTION, {"role": "assistant", "content": text}, FOLLOW_UP]
    w = ask(client, messages, 8, c2c={"attach": [pub["commit"]], "mode": "full"})
    assert w.model_extra["c2c"]["attach"][0]["path"] == "cache"
    assert leftover_tickets(vllm_server) == []  # every report was collected


@pytest.mark.vllm
@pytest.mark.slow
@pytest.mark.redis
def test_a_streamed_request_that_must_fail_is_an_http_error_before_any_token(client, vllm_server):
    for c2c, status, name in (({"attach": ["0" * 64]}, 403, "CommitNotVisibleError"),
                              ({"attach": ["bad"]}, 400, "ConfigError")):
        with pytest.raises(APIStatusError) as info:
            streamed(client, OTHER, 8, c2c=c2c)
        assert info.value.status_code == status and info.value.body["c2c_error"] == name
    text, _ = streamed(client, OTHER, 8)  # the engine goes on
    assert text
    assert leftover_tickets(vllm_server) == []


@pytest.mark.vllm
@pytest.mark.slow
@pytest.mark.redis
def test_a_c2c_key_written_with_escapes_is_read_as_c2c(vllm_server):
    import httpx

    body = ('{"model": "smol", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2, '
            '"\\u0063\\u0032\\u0063": {"attach": ["bad"]}}')
    r = httpx.post(f"{vllm_server.base_url}/chat/completions", content=body.encode(),
                   headers={"content-type": "application/json"}, timeout=120)
    assert r.status_code == 400 and r.json()["error"]["c2c_error"] == "ConfigError"
    assert r.json()["error"]["message"].startswith("c2c.attach 'bad'")
