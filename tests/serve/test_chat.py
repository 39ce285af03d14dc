"""Chat completions over HTTP with the real openai client: plain, streamed, sampled, and sessions."""

from __future__ import annotations

import json

import httpx
import pytest

from serve_helpers import SYSTEM, c2c_field, chat


def test_models_lists_the_served_model(tiny_server):
    models = tiny_server.client("analyst").models.list()
    assert [m.id for m in models] == ["tiny-qwen2"]


def test_plain_completion_has_openai_fields_and_usage(tiny_server):
    r = chat(tiny_server.client("analyst"), [SYSTEM, {"role": "user", "content": "Say hi."}], max_tokens=5)
    assert r.object == "chat.completion" and r.model == "tiny-qwen2"
    assert r.choices[0].message.role == "assistant" and isinstance(r.choices[0].message.content, str)
    assert r.choices[0].finish_reason in ("stop", "length")
    u = r.usage
    assert u.prompt_tokens > 0 and 1 <= u.completion_tokens <= 5
    assert u.total_tokens == u.prompt_tokens + u.completion_tokens
    assert u.prompt_tokens_details.cached_tokens == 0  # no session: nothing held
    assert c2c_field(r)["prefilled_tokens"] == u.prompt_tokens


def test_streaming_yields_the_same_text_and_ends_with_done(tiny_server):
    messages = [SYSTEM, {"role": "user", "content": "Count to three."}]
    client = tiny_server.client("analyst")
    whole = chat(client, messages, max_tokens=12).choices[0].message.content
    chunks = list(chat(client, messages, max_tokens=12, stream=True, stream_options={"include_usage": True}))
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] in ("stop", "length")
    assert chunks[-1].usage.completion_tokens >= 1 and not chunks[-1].choices
    # on the wire: `data: {chunk}` lines, the last one `data: [DONE]`
    with httpx.stream("POST", tiny_server.url("/v1/chat/completions"), headers=tiny_server.headers("analyst"),
                      json={"model": "tiny-qwen2", "messages": messages, "max_tokens": 3, "temperature": 0,
                            "stream": True}) as resp:
        assert resp.headers["content-type"].startswith("text/event-stream")
        lines = [line for line in resp.iter_lines() if line]
    assert all(line.startswith("data: ") for line in lines) and lines[-1] == "data: [DONE]"
    assert json.loads(lines[0][6:])["object"] == "chat.completion.chunk"


def test_a_session_prefills_only_the_new_turn_and_answers_as_a_cold_request(tiny_server):
    client = tiny_server.client("analyst")
    turn1 = [SYSTEM, {"role": "user", "content": "Remember the number 42."}]
    r1 = chat(client, turn1, c2c={"session": "reuse-1"})
    assert c2c_field(r1)["session"]["state"] == "new"
    turn2 = turn1 + [{"role": "assistant", "content": r1.choices[0].message.content},
                     {"role": "user", "content": "Which number?"}]
    r2 = chat(client, turn2, c2c={"session": "reuse-1"})
    cold = chat(client, turn2)
    cached = r2.usage.prompt_tokens_details.cached_tokens
    assert c2c_field(r2)["session"] == {"name": "reuse-1", "state": "warm", "turns": 2}
    assert cached >= r1.usage.prompt_tokens  # at least all of turn 1's prompt came from the cache
    assert c2c_field(r2)["prefilled_tokens"] == r2.usage.prompt_tokens - cached
    assert r2.usage.prompt_tokens == cold.usage.prompt_tokens
    assert r2.choices[0].message.content == cold.choices[0].message.content


def test_a_session_that_changes_its_history_is_never_answered_from_the_old_cache(tiny_server):
    client = tiny_server.client("analyst")
    chat(client, [SYSTEM, {"role": "user", "content": "First version of the question."}], c2c={"session": "edit-1"})
    edited = [SYSTEM, {"role": "user", "content": "An entirely different question."}]
    r = chat(client, edited, c2c={"session": "edit-1"})
    cold = chat(client, edited)
    assert 0 < c2c_field(r)["reused_tokens"] < r.usage.prompt_tokens  # the shared system turn, no more
    assert r.choices[0].message.content == cold.choices[0].message.content


def test_sessions_are_per_agent(tiny_server):
    turn = [SYSTEM, {"role": "user", "content": "Private to the analyst."}]
    chat(tiny_server.client("analyst"), turn, c2c={"session": "mine"})
    r = chat(tiny_server.client("writer"), turn, c2c={"session": "mine"})
    assert c2c_field(r)["session"]["state"] == "new" and r.usage.prompt_tokens_details.cached_tokens == 0


def test_an_evicted_session_is_rebuilt_from_its_messages(tiny_server):
    # The server holds 0.5 MB of sessions; tiny-qwen2 keeps 1 KiB of K/V per token.
    client = tiny_server.client("analyst")
    big = "lorem ipsum dolor sit amet " * 12  # ~330 tokens with the byte-level tokenizer
    a = [SYSTEM, {"role": "user", "content": "A: " + big}]
    r1 = chat(client, a, c2c={"session": "evict-a"}, max_tokens=4)
    chat(client, [SYSTEM, {"role": "user", "content": "B: " + big}], c2c={"session": "evict-b"}, max_tokens=4)
    a2 = a + [{"role": "assistant", "content": r1.choices[0].message.content}, {"role": "user", "content": "Go on."}]
    r2 = chat(client, a2, c2c={"session": "evict-a"}, max_tokens=4)
    assert c2c_field(r2)["session"]["state"] == "rebuilt"
    assert r2.usage.prompt_tokens_details.cached_tokens == 0
    assert r2.choices[0].message.content == chat(client, a2, max_tokens=4).choices[0].message.content
    assert httpx.get(tiny_server.url("/healthz")).json()["session_bytes"] <= 512 * 1024


def test_a_seed_makes_sampling_reproducible(tiny_server):
    client = tiny_server.client("analyst")
    messages = [SYSTEM, {"role": "user", "content": "Tell me something."}]
    runs = [client.chat.completions.create(model="tiny-qwen2", messages=messages, max_tokens=10, temperature=1.0,
                                           top_p=0.9, seed=1234).choices[0].message.content for _ in range(2)]
    assert runs[0] == runs[1]


def test_a_stop_string_ends_the_reply_before_it(tiny_server):
    client = tiny_server.client("analyst")
    messages = [SYSTEM, {"role": "user", "content": "Write anything."}]
    full = chat(client, messages, max_tokens=16).choices[0].message.content
    i = next(i for i in range(2, len(full)) if full[i] != "\ufffd")  # a real character past the start
    r = chat(client, messages, max_tokens=16, stop=[full[i]])
    assert r.choices[0].message.content == full[: full.index(full[i])]
    assert r.choices[0].finish_reason == "stop"


def test_logit_bias_bans_a_token(tiny_server):
    # 258 is tiny-qwen2's end-of-turn token: banned, the reply runs to max_tokens
    r = chat(tiny_server.client("analyst"), [SYSTEM, {"role": "user", "content": "Stop soon."}], max_tokens=40,
             logit_bias={"258": -100})
    assert r.usage.completion_tokens == 40 and r.choices[0].finish_reason == "length"


def test_logprobs_and_top_logprobs_in_openais_shape_whole_and_streamed(tiny_server):
    """#55, part: logprobs up to 20, as OpenAI and vLLM give them; the stream carries the same entries."""
    client = tiny_server.client("analyst")
    msgs = [SYSTEM, {"role": "user", "content": "Count."}]
    r = chat(client, msgs, max_tokens=6, logprobs=True, top_logprobs=4)
    content = r.choices[0].logprobs.content
    assert 0 < len(content) <= 6 and "".join(c.token for c in content) == r.choices[0].message.content
    for c in content:
        assert c.logprob <= 0 and len(c.top_logprobs) == 4 and c.top_logprobs[0].logprob >= c.logprob - 1e-6
        assert c.bytes == list(c.token.encode())
    streamed = [e for ch in client.chat.completions.create(model="tiny-qwen2", messages=msgs, max_tokens=6,
                                                           temperature=0, logprobs=True, top_logprobs=4, stream=True)
                if ch.choices and ch.choices[0].logprobs for e in ch.choices[0].logprobs.content]
    assert [(e.token, round(e.logprob, 4)) for e in streamed] == [(c.token, round(c.logprob, 4)) for c in content]
    plain = chat(client, msgs, max_tokens=6)
    assert plain.choices[0].logprobs is None and plain.choices[0].message.content == r.choices[0].message.content


def test_n_choices_decode_from_one_prefill_each_its_own_draw(tiny_server):
    """#55, part: n up to 8. Greedy choices agree; seeded sampled ones are each reproducible and not copies."""
    client = tiny_server.client("analyst")
    msgs = [SYSTEM, {"role": "user", "content": "Say something."}]
    greedy = chat(client, msgs, max_tokens=5, n=3)
    assert [c.index for c in greedy.choices] == [0, 1, 2]
    assert len({c.message.content for c in greedy.choices}) == 1
    one = chat(client, msgs, max_tokens=5)
    assert greedy.choices[0].message.content == one.choices[0].message.content
    assert greedy.usage.completion_tokens == 3 * one.usage.completion_tokens
    assert greedy.usage.prompt_tokens == one.usage.prompt_tokens
    kw = dict(model="tiny-qwen2", messages=msgs, max_tokens=8, temperature=1.0, seed=7, n=4)
    a = client.chat.completions.create(**kw)
    b = client.chat.completions.create(**kw)
    texts = [c.message.content for c in a.choices]
    assert texts == [c.message.content for c in b.choices] and len(set(texts)) > 1
    stream = client.chat.completions.create(**kw, stream=True)
    got: dict[int, str] = {}
    for ch in stream:
        for c in ch.choices:
            got[c.index] = got.get(c.index, "") + (c.delta.content or "")
    assert [got[i] for i in range(4)] == texts


PERSON = {"type": "object", "additionalProperties": False, "required": ["name", "age", "tags"],
          "properties": {"name": {"type": "string", "maxLength": 12}, "age": {"type": "integer", "minimum": 0},
                         "tags": {"type": "array", "items": {"enum": ["a", "b"]}, "maxItems": 3}}}


def _valid_person(doc) -> bool:
    return (isinstance(doc, dict) and set(doc) == {"name", "age", "tags"} and isinstance(doc["name"], str)
            and len(doc["name"]) <= 12 and isinstance(doc["age"], int) and doc["age"] >= 0
            and isinstance(doc["tags"], list) and len(doc["tags"]) <= 3 and set(doc["tags"]) <= {"a", "b"})


def test_a_json_schema_reply_always_parses_and_validates_even_from_random_weights(tiny_server):
    """#55, part: structured output by constrained decoding (llguidance, as vLLM's guidance backend). tiny-qwen2 has
    random weights: unconstrained it writes noise, so every valid reply here is the grammar's doing."""
    client = tiny_server.client("analyst")
    rf = {"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON, "strict": True}}
    msgs = [SYSTEM, {"role": "user", "content": "A person, as JSON."}]
    for seed in range(4):   # sampled, so each draw walks another path through the grammar
        r = client.chat.completions.create(model="tiny-qwen2", messages=msgs, max_tokens=120, temperature=1.0,
                                           seed=seed, response_format=rf)
        assert r.choices[0].finish_reason == "stop", r.choices[0].message.content
        assert _valid_person(json.loads(r.choices[0].message.content)), r.choices[0].message.content
    streamed = "".join(c.choices[0].delta.content or "" for c in client.chat.completions.create(
        model="tiny-qwen2", messages=msgs, max_tokens=120, temperature=0, response_format=rf, stream=True)
        if c.choices)
    assert _valid_person(json.loads(streamed))
    obj = chat(client, msgs, max_tokens=60, response_format={"type": "json_object"})
    if obj.choices[0].finish_reason == "stop":
        assert isinstance(json.loads(obj.choices[0].message.content), dict)
    else:   # the object ran out of tokens: what there is is the start of one
        assert obj.choices[0].message.content.startswith("{")


def test_a_schema_the_engine_cannot_compile_is_a_400_naming_response_format(tiny_server):
    resp = httpx.post(tiny_server.url("/v1/chat/completions"), headers=tiny_server.headers("analyst"), timeout=60,
                      json={"model": "tiny-qwen2", "messages": [SYSTEM, {"role": "user", "content": "x"}],
                            "response_format": {"type": "json_schema", "json_schema": {
                                "name": "bad", "schema": {"type": "object", "properties": {"x": {"type": "strin"}}}}}})
    assert resp.status_code == 400, resp.text
    e = resp.json()["error"]
    assert (e["code"], e["param"], e["c2c_error"]) == ("invalid_schema", "response_format", "SchemaError"), e
    assert "strin" in e["message"]


def test_langchain_with_structured_output_gets_a_validated_object(tiny_server):
    """LangChain's ``with_structured_output(Model, method="json_schema")`` against c2c serve: it was a 400."""
    pytest.importorskip("langchain_openai")
    from langchain_openai import ChatOpenAI
    from pydantic import BaseModel, Field

    class Finding(BaseModel):
        host: str = Field(max_length=10)
        severity: int = Field(ge=1, le=5)

    llm = ChatOpenAI(base_url=tiny_server.base_url, api_key="tok-analyst-0123456789abcdef", model="tiny-qwen2",
                     temperature=0, max_tokens=80, max_retries=0)
    got = llm.with_structured_output(Finding, method="json_schema").invoke("Which host failed, and how badly?")
    assert isinstance(got, Finding) and 1 <= got.severity <= 5 and len(got.host) <= 10
