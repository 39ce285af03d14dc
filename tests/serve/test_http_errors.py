"""Every bad input gets an HTTP error in OpenAI's shape, and the server keeps serving after each."""

from __future__ import annotations

import json

import httpx
import openai
import pytest

from serve_helpers import SYSTEM, c2c_field, chat


def post(server, body: bytes | dict, agent: str | None = "analyst", **headers) -> httpx.Response:
    h = {"content-type": "application/json", **(server.headers(agent) if agent else {}), **headers}
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    return httpx.post(server.url("/v1/chat/completions"), content=data, headers=h, timeout=60)


# OpenAI's error types by status (the c2c class rides in c2c_error, c2c's reason in code)
OPENAI_TYPE = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
               404: "not_found_error", 405: "invalid_request_error", 409: "invalid_request_error",
               413: "invalid_request_error", 422: "invalid_request_error", 429: "rate_limit_error",
               500: "server_error", 503: "server_error", 504: "server_error"}


def error_of(resp: httpx.Response) -> dict:
    """The error of ``resp``, after checking its shape: the five fields, OpenAI's type for the status."""
    e = resp.json()["error"]
    assert set(e) == {"message", "type", "code", "param", "c2c_error"} and e["message"], e
    assert e["type"] == OPENAI_TYPE[resp.status_code], (resp.status_code, e)
    assert isinstance(e["code"], str) and e["code"].isidentifier() and e["code"].islower(), e
    return e


GOOD = {"model": "tiny-qwen2", "messages": [SYSTEM, {"role": "user", "content": "hi"}], "max_tokens": 2,
        "temperature": 0}
SCHEMA = ("invalid_request", None)  # refused by the schema: no c2c class


@pytest.mark.parametrize("body, status, code, c2c_error", [
    (b'{"model": "tiny-qwen2", "messages": [', 400, "json_invalid", None),          # malformed JSON
    (b"[1, 2, 3]", 400, *SCHEMA),                                                     # not an object
    ({"model": "tiny-qwen2"}, 400, *SCHEMA),                                          # no messages
    ({**GOOD, "messages": [{"role": "wizard", "content": "x"}]}, 400, *SCHEMA),
    ({**GOOD, "temperature": -1}, 400, *SCHEMA),
    ({**GOOD, "n": 9}, 400, *SCHEMA),                                                 # at most 8
    ({**GOOD, "tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "objekt"}}}]},
     400, "invalid_schema", "SchemaError"),                                           # not a JSON Schema
    ({**GOOD, "c2c": {"mode": "sideways"}}, 400, *SCHEMA),
    ({**GOOD, "c2c": {"unknown": 1}}, 400, *SCHEMA),
    ({**GOOD, "model": "no-such-model"}, 404, "model_not_found", "UnknownModelError"),
    ({**GOOD, "c2c": {"attach": ["0" * 64]}}, 403, "commit_not_visible", "CommitNotVisibleError"),  # no oracle
    ({**GOOD, "c2c": {"publish": {"stream": "bad stream name!"}}}, 400, "invalid_value", "ConfigError"),
    ({**GOOD, "messages": [{"role": "user", "content": "x" * 5000}]}, 400,            # 4096 positions
     "context_length_exceeded", "ContextLengthError"),
    ({**GOOD, "max_tokens": 5000}, 400, "context_length_exceeded", "ContextLengthError"),
    ({**GOOD, "logit_bias": {"999999": 5}}, 400, "invalid_value", "ConfigError"),  # not a token id
    ({**GOOD, "logit_bias": {"5": 500}}, 400, *SCHEMA),
    ({**GOOD, "logit_bias": {"\u00b2": 1}}, 400, *SCHEMA),                           # a non-ASCII digit
    ({**GOOD, "logit_bias": {"1" * 5000: 1}}, 400, *SCHEMA),                          # past int()'s digit limit
    ({**GOOD, "seed": 2**64}, 400, *SCHEMA),                                          # past torch's seed range
])
def test_bad_input_gets_an_openai_shaped_error(tiny_server, body, status, code, c2c_error):
    resp = post(tiny_server, body)
    assert resp.status_code == status, resp.text
    e = error_of(resp)
    assert (e["code"], e["c2c_error"]) == (code, c2c_error), e


def test_a_body_over_the_limit_is_413_by_length_and_by_stream(tiny_server):
    big = {**GOOD, "messages": [{"role": "user", "content": "x" * (1 << 20)}]}  # the server allows 1 MB
    resp = post(tiny_server, big)
    assert resp.status_code == 413 and error_of(resp)["c2c_error"] == "RequestTooLargeError"

    def chunks():  # no Content-Length: counted as it arrives
        data = json.dumps(big).encode()
        for i in range(0, len(data), 1 << 16):
            yield data[i:i + (1 << 16)]

    resp = httpx.post(tiny_server.url("/v1/chat/completions"), content=chunks(),
                      headers={"content-type": "application/json", **tiny_server.headers("analyst")})
    assert resp.status_code == 413 and error_of(resp)["c2c_error"] == "RequestTooLargeError"


def test_no_token_or_an_unknown_token_is_401(tiny_server):
    resp = post(tiny_server, GOOD, agent=None)
    assert resp.status_code == 401 and error_of(resp)["c2c_error"] == "AuthError"
    assert resp.headers["www-authenticate"] == "Bearer"
    resp = post(tiny_server, GOOD, agent=None, authorization="Bearer tok-analyst-0123456789abcdeX")
    assert resp.status_code == 401 and error_of(resp)["c2c_error"] == "AuthError"
    assert "tok-analyst" not in resp.text
    bad = openai.OpenAI(base_url=tiny_server.base_url, api_key="wrong-token", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        bad.models.list()
    assert "tok-analyst-0123456789abcdeX" not in tiny_server.log() and "wrong-token" not in tiny_server.log()


def test_an_unknown_route_or_method_is_refused_in_the_same_shape(tiny_server):
    resp = httpx.get(tiny_server.url("/v1/nothing-here"))
    assert resp.status_code == 404 and error_of(resp)["code"] == "route_not_found"
    resp = httpx.put(tiny_server.url("/v1/chat/completions"), headers=tiny_server.headers("analyst"))
    e = error_of(resp)  # was code "405", type invalid_request_error
    assert resp.status_code == 405 and (e["code"], e["c2c_error"]) == ("method_not_allowed", None)


def test_a_request_past_its_deadline_is_504_and_stops(tiny_server):
    resp = post(tiny_server, {**GOOD, "max_tokens": 3000, "logit_bias": {"258": -100}, "c2c": {"timeout_s": 0.05}})
    e = error_of(resp)
    assert resp.status_code == 504 and (e["code"], e["c2c_error"]) == ("timeout", "RequestTimeoutError")


def test_an_error_inside_a_stream_has_the_same_shape(tiny_server):
    body = {**GOOD, "stream": True, "max_tokens": 3000, "logit_bias": {"258": -100}, "c2c": {"timeout_s": 1.0}}
    with httpx.stream("POST", tiny_server.url("/v1/chat/completions"), json=body, timeout=60,
                      headers=tiny_server.headers("analyst")) as resp:
        events = [json.loads(line[6:]) for line in resp.iter_lines() if line.startswith("data: {")]
    assert resp.status_code == 200 and "choices" in events[0]  # the deadline passes mid-stream
    e = events[-1]["error"]
    assert set(e) == {"message", "type", "code", "param", "c2c_error"}
    assert (e["type"], e["code"], e["c2c_error"]) == ("server_error", "timeout", "RequestTimeoutError")


def test_the_server_keeps_serving_after_every_error(tiny_server):
    r = chat(tiny_server.client("analyst"), [SYSTEM, {"role": "user", "content": "still there?"}], max_tokens=2)
    assert r.usage.completion_tokens >= 1 and c2c_field(r)["session"] is None
    assert httpx.get(tiny_server.url("/healthz")).json()["status"] == "ok"


# ------------------------------------------------------------------ no 5xx from input
LONE = "\ud800"  # JSON carries it as the escape "\ud800"; it is not valid UTF-8, so a tokenizer or database fails


def user(text):
    return {"role": "user", "content": text}


@pytest.mark.parametrize("body, param", [
    ({**GOOD, "messages": [SYSTEM, user(LONE)]}, "messages.1.content"),
    ({**GOOD, "messages": [SYSTEM, user(f"ok {LONE} ok")]}, "messages.1.content"),
    ({**GOOD, "messages": [SYSTEM, user([{"type": "text", "text": "\udfff"}])]}, "messages.1.content.0.text"),
    ({**GOOD, "messages": [{"role": "system", "content": LONE}, user("hi")]}, "messages.0.content"),
    ({**GOOD, "messages": [SYSTEM, {**user("hi"), "name": LONE}]}, "messages.1.name"),
    ({**GOOD, "stop": LONE}, "stop"),
    ({**GOOD, "stop": ["x", LONE]}, "stop.1"),
    ({**GOOD, "model": LONE}, "model"),
    ({**GOOD, "logit_bias": {LONE: 1}}, "logit_bias.'\\ud800'"),
    ({**GOOD, "user": LONE}, "user"),                                 # an OpenAI field this server ignores
    ({**GOOD, "c2c": {"session": LONE}}, "c2c.session"),
    ({**GOOD, "c2c": {"publish": {"stream": LONE}}}, "c2c.publish.stream"),
    ({**GOOD, "c2c": {"publish": {"labels": [LONE]}}}, "c2c.publish.labels.0"),
    ({**GOOD, "c2c": {"attach": [LONE * 64]}}, "c2c.attach.0"),
])
def test_a_lone_surrogate_anywhere_is_400_naming_where(tiny_server, body, param):
    resp = post(tiny_server, body)
    assert resp.status_code == 400, resp.text
    e = error_of(resp)
    assert (e["code"], e["param"], e["c2c_error"]) == ("invalid_request", param, None) and "UTF-8" in e["message"]


@pytest.mark.parametrize("body, param", [
    ({**GOOD, "max_tokens": 10**30}, "max_tokens"),                  # was a ContextLengthError, after tokenizing
    ({**GOOD, "max_completion_tokens": 2**63}, "max_completion_tokens"),
    ({**GOOD, "c2c": {"timeout_s": 1e308}}, "c2c.timeout_s"),         # was served
])
def test_a_number_out_of_bounds_is_400(tiny_server, body, param):
    resp = post(tiny_server, body)
    assert resp.status_code == 400, resp.text
    e = error_of(resp)
    assert (e["code"], e["param"]) == ("invalid_request", param), e


@pytest.mark.parametrize("field", ["temperature", "top_p"])
def test_a_vanishing_temperature_or_top_p_is_served(tiny_server, field):
    """1e-320 is within [0, 2] and (0, 1]; it was a 500 from torch.multinomial (the runtime now copes)."""
    resp = post(tiny_server, {**GOOD, "temperature": 1.0, field: 1e-320})
    assert resp.status_code == 200 and resp.json()["usage"]["completion_tokens"] >= 1, resp.text


@pytest.mark.parametrize("value", ["Infinity", "NaN"])
def test_nan_and_infinity_are_400(tiny_server, value):
    """Python's JSON parser takes these literals (Infinity was served as a deadline); no field may."""
    raw = ('{"model": "tiny-qwen2", "messages": [{"role": "user", "content": "x"}], "max_tokens": 1, '
           '"c2c": {"timeout_s": %s}}' % value).encode()
    resp = post(tiny_server, raw)
    assert resp.status_code == 400 and error_of(resp)["param"] == "c2c.timeout_s", resp.text


def test_advise_bandwidth_is_bounded(tiny_server):
    body = {"model": "tiny-qwen2", "message_tokens": 8, "bandwidth_gbps": 1e308}
    resp = httpx.post(tiny_server.url("/v1/c2c/advise"), json=body, headers=tiny_server.headers("analyst"))
    assert resp.status_code == 400 and error_of(resp)["param"] == "bandwidth_gbps", resp.text


def events_error(server, query: str, **headers) -> dict:
    """The error of ``GET /v1/c2c/events?query``, after checking it is a 400 (a stream let through fails at
    its status, not by waiting for an end that may never come)."""
    with httpx.stream("GET", server.url(f"/v1/c2c/events?{query}"), headers={**server.headers("analyst"), **headers},
                      timeout=30) as resp:
        assert resp.status_code == 400, resp.status_code
        resp.read()
        return error_of(resp)


@pytest.mark.parametrize("after, headers", [
    ("9223372036854775808", {}),                                      # 2**63: past SQLite's integers
    ("99999999999999999999999999", {}),
    ("-1", {}),
    ("%D9%A1", {}),                                                   # an Arabic-Indic digit: int() takes it
    ("0", {"Last-Event-ID": "9223372036854775808"}),
    ("1111111111111111111", {}),                                      # well formed, past the last one issued
    ("0", {"Last-Event-ID": "1111111111111111111"}),
])
def test_an_absurd_events_cursor_is_400(tiny_server, after, headers):
    e = events_error(tiny_server, f"after={after}", **headers)
    assert (e["code"], e["c2c_error"]) == ("invalid_value", "ConfigError") and "cursor" in e["message"]


@pytest.mark.parametrize("query", ["timeout_s=1e400", "timeout_s=1e12"])  # both were streams without end
def test_events_timeout_is_bounded(tiny_server, query):
    assert events_error(tiny_server, query)["code"] == "invalid_request"


@pytest.mark.parametrize("extra, param", [
    ({"tool_choice": "required"}, "tool_choice"),                                        # required, but no tools
    ({"functions": [{"name": "f", "parameters": {"type": "object"}}]}, "functions"),   # legacy: was ignored, 200
    ({"function_call": "auto"}, "function_call"),                                        # legacy: was ignored, 200
    ({"top_logprobs": 2}, "top_logprobs"),                                               # needs logprobs
    ({"logprobs": True, "top_logprobs": 21}, "top_logprobs"),                            # at most 20
    ({"n": 2, "c2c": {"session": "s-n"}}, "n"),                                          # a session is one reply
    ({"response_format": {"type": "xml"}}, "response_format.type"),
    ({"messages": [SYSTEM, {"role": "assistant", "content": None, "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{x"}}]}]},
     "messages.1.tool_calls.0.function.arguments"),
])
def test_a_field_this_server_does_not_serve_is_refused_naming_it(tiny_server, extra, param):
    """Probe 3: these refusals carried ``param: null``, and the legacy ``functions``/``function_call`` were
    silently ignored (200)."""
    resp = post(tiny_server, {**GOOD, **extra})
    assert resp.status_code == 400, resp.text
    e = error_of(resp)
    assert (e["code"], e["param"], e["c2c_error"]) == ("invalid_request", param, None), e
    assert param.split(".")[-1] in e["message"] or param.split(".")[0] in e["message"]
