"""Property: no request, however malformed, gets a 5xx (issue #30: "no 500 from input").

Hypothesis builds requests from the schema (:mod:`c2c.serve.schema`): valid chat requests
with up to two fields (anywhere, nested ones included) replaced by junk (lone surrogates,
integers past 64 bits, NaN, 1e-320, nested lists, wrong types), junk JSON or bytes, and
requests to the native endpoints. They go to the shared tiny server over loopback; every
answer must be below 500 and in the one error shape, except a 504 (or an error event in a
stream) for a request whose own ``c2c.timeout_s`` ran out. Generations are a few tokens,
and publishes go to ``prop-*`` streams of the ``writer`` agent, away from the other tests'
streams.
"""

from __future__ import annotations

import copy
import json
from urllib.parse import quote

import httpx
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from serve_helpers import SYSTEM

AGENT = "writer"
SURROGATE_TEXT = st.one_of(st.sampled_from(["\ud800", "\udfff", "a\udc00b"]),
                           st.text(st.sampled_from("a\ud800\x00é 0-_."), min_size=1, max_size=6))
TEXT = st.one_of(st.text(max_size=12), SURROGATE_TEXT)
INTS = st.one_of(st.integers(-3, 5), st.sampled_from([2**31, 2**63 - 1, 2**63, 2**64, -(2**63) - 1, 10**30, 10**40]))
FLOATS = st.one_of(st.floats(allow_nan=True, allow_infinity=True), st.sampled_from([1e-320, -0.0, 5e-324, 1e308]))
JUNK = st.recursive(st.one_of(st.none(), st.booleans(), INTS, FLOATS, TEXT),
                    lambda inner: st.one_of(st.lists(inner, max_size=3), st.dictionaries(TEXT, inner, max_size=3)),
                    max_leaves=6)
NAME = st.from_regex(r"[a-z][a-z0-9_-]{0,7}", fullmatch=True)

# ------------------------------------------------------------------ valid chat requests
MESSAGE = st.fixed_dictionaries(
    {"role": st.sampled_from(["system", "developer", "user", "assistant"]),
     "content": st.one_of(st.text(max_size=40), st.lists(st.fixed_dictionaries(
         {"type": st.just("text"), "text": st.text(max_size=20)}), min_size=1, max_size=2))},
    optional={"name": NAME})


def c2c_field(commit: str):
    return st.fixed_dictionaries({}, optional={
        "session": NAME.map(lambda n: f"prop-{n}"),
        "publish": st.fixed_dictionaries({"stream": NAME.map(lambda n: f"prop-{n}")}, optional={
            "labels": st.lists(st.sampled_from(["user", "system", "assistant", "evidence"]), max_size=2)}),
        "attach": st.lists(st.one_of(st.just(commit), st.text("0123456789abcdef", min_size=64, max_size=64)),
                           max_size=2),
        "mode": st.sampled_from(["auto", "full", "slice", "text"]),
        "timeout_s": st.floats(0.05, 30)})


def chat_body(commit: str):
    return st.fixed_dictionaries(
        {"model": st.just("tiny-qwen2"), "messages": st.lists(MESSAGE, min_size=1, max_size=3)},
        optional={"max_tokens": st.integers(1, 3), "max_completion_tokens": st.integers(1, 3),
                  "temperature": st.floats(0, 2), "top_p": st.floats(0, 1, exclude_min=True),
                  "seed": st.integers(-(2**63), 2**63 - 1),
                  "stop": st.one_of(st.text(min_size=1, max_size=5), st.lists(st.text(min_size=1, max_size=5),
                                                                               max_size=4)),
                  "logit_bias": st.dictionaries(st.integers(0, 300).map(str), st.floats(-100, 100), max_size=3),
                  "stream": st.booleans(), "stream_options": st.fixed_dictionaries({"include_usage": st.booleans()}),
                  "n": st.just(1), "user": st.text(max_size=10), "c2c": c2c_field(commit)})


# where junk may go: every field, and the containers above them
PATHS = [("model",), ("messages",), ("messages", 0), ("messages", 0, "role"), ("messages", 0, "content"),
         ("messages", 0, "name"), ("messages", 0, "tool_calls"), ("max_tokens",), ("max_completion_tokens",),
         ("temperature",), ("top_p",), ("seed",), ("stop",), ("logit_bias",), ("stream",), ("stream_options",),
         ("n",), ("tools",), ("logprobs",), ("response_format",), ("user",), ("c2c",), ("c2c", "session"),
         ("c2c", "publish"), ("c2c", "publish", "stream"), ("c2c", "publish", "labels"), ("c2c", "attach"),
         ("c2c", "mode"), ("c2c", "timeout_s")]


def with_junk(body: dict, changes: list[tuple[tuple, object]]) -> dict:
    """``body`` with ``value`` put at each path (containers on the way are made dicts if they are not)."""
    body = copy.deepcopy(body)
    for path, value in changes:
        node = body
        for key in path[:-1]:
            if isinstance(node, list):
                node = node[key]
            else:
                if not isinstance(node.get(key), (dict, list)):
                    node[key] = {}
                node = node[key]
        node[path[-1]] = value
    return body


def encode(body) -> bytes:
    """JSON as Python writes it: surrogates as \\u escapes, NaN and Infinity as bare literals."""
    return json.dumps(body).encode()


def requests(commit: str):
    """(method, path, body bytes): 2 in 3 a chat request with 0-2 junk fields, else any other kind."""
    chats = st.tuples(st.just("POST"), st.just("/v1/chat/completions"), st.builds(
        with_junk, chat_body(commit), st.lists(st.tuples(st.sampled_from(PATHS), JUNK), max_size=2)).map(encode))
    path_text = st.one_of(st.just(commit), st.text(st.characters(exclude_categories=("Cs",)), max_size=70))
    query = st.dictionaries(st.sampled_from(["after", "limit", "timeout_s"]),
                            st.one_of(INTS.map(str), FLOATS.map(str),
                                      st.text(st.sampled_from("0123456789-e.n"), max_size=25)), max_size=3)
    others = st.one_of(
        st.tuples(st.just("POST"), st.just("/v1/chat/completions"), JUNK.map(encode)),
        st.tuples(st.just("POST"), st.just("/v1/chat/completions"), st.binary(max_size=40)),
        st.tuples(st.just("POST"), st.just("/v1/c2c/advise"), st.one_of(
            st.fixed_dictionaries({"model": st.one_of(st.just("tiny-qwen2"), TEXT), "message_tokens": INTS},
                                  optional={"context_tokens": INTS, "hops": INTS, "bandwidth_gbps": FLOATS,
                                            "cross_domain": JUNK, "same_model": JUNK}), JUNK).map(encode)),
        # the commit itself: an invalidation needs a reason that is a valid string, which junk never is
        st.tuples(st.just("POST"), path_text.map(lambda i: f"/v1/c2c/commits/{quote(i, safe='')}/invalidate"),
                  st.fixed_dictionaries({"reason": JUNK.filter(lambda r: not isinstance(r, str))}).map(encode)),
        st.tuples(st.just("GET"), path_text.map(lambda i: f"/v1/c2c/commits/{quote(i, safe='')}"), st.just(b"")),
        st.tuples(st.just("GET"), query.map(lambda q: "/v1/c2c/events?" + "&".join(
            f"{k}={quote(v)}" for k, v in q.items())), st.just(b"")))
    return st.integers(0, 2).flatmap(lambda i: others if i == 2 else chats)


@pytest.fixture(scope="module")
def http(tiny_server):
    with httpx.Client(base_url=tiny_server.url(""), timeout=60,
                      headers={"content-type": "application/json", **tiny_server.headers(AGENT)}) as client:
        yield client


@pytest.fixture(scope="module")
def commit(http):
    """A commit of the writer's, for requests to attach, show or (with a junk reason) invalidate."""
    r = http.post("/v1/chat/completions", json={"model": "tiny-qwen2", "messages": [SYSTEM, {
        "role": "user", "name": "evidence", "content": "The disk filled at 02:10."}], "max_tokens": 2,
        "temperature": 0, "c2c": {"publish": {"stream": "prop-base"}}})
    return r.json()["c2c"]["publish"]["commit"]


def send(http: httpx.Client, method: str, path: str, content: bytes) -> tuple[int, str]:
    """(status, body); an event stream is read only to its first line (it may never end)."""
    with http.stream(method, path, content=content or None) as resp:
        if resp.headers.get("content-type", "").startswith("text/event-stream") and "/events" in path:
            return resp.status_code, next(resp.iter_text(), "")
        return resp.status_code, resp.read().decode("utf-8", "replace")


@settings(max_examples=150, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(data=st.data())
def test_no_request_gets_a_5xx(http, commit, data):
    method, path, content = data.draw(requests(commit), label="request")
    status, text = send(http, method, path, content)
    own_deadline = '"code":"timeout"' in text  # c2c.timeout_s ran out: 504, or an error event in a stream
    assert status < 500 or (status == 504 and own_deadline), (status, text[:500])
    assert '"type":"server_error"' not in text or own_deadline, text[:500]  # an error event inside a stream
    if status >= 400:
        assert set(json.loads(text)["error"]) == {"message", "type", "code", "param", "c2c_error"}, text[:500]


def test_the_server_is_still_healthy_and_the_commit_intact(tiny_server, http, commit):
    r = http.post("/v1/chat/completions", json={"model": "tiny-qwen2", "max_tokens": 1, "temperature": 0,
                                                "messages": [SYSTEM, {"role": "user", "content": "ok?"}]})
    assert r.status_code == 200 and httpx.get(tiny_server.url("/healthz")).json()["status"] == "ok"
    assert http.get(f"/v1/c2c/commits/{commit}").json()["stale"] is False
