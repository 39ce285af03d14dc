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


def error_of(resp: httpx.Response) -> dict:
    e = resp.json()["error"]
    assert set(e) >= {"message", "type", "code"} and e["message"]
    return e


GOOD = {"model": "tiny-qwen2", "messages": [SYSTEM, {"role": "user", "content": "hi"}], "max_tokens": 2,
        "temperature": 0}


@pytest.mark.parametrize("body, status, kind", [
    (b'{"model": "tiny-qwen2", "messages": [', 400, "invalid_request_error"),       # malformed JSON
    (b"[1, 2, 3]", 400, "invalid_request_error"),                                    # not an object
    ({"model": "tiny-qwen2"}, 400, "invalid_request_error"),                           # no messages
    ({**GOOD, "messages": [{"role": "wizard", "content": "x"}]}, 400, "invalid_request_error"),
    ({**GOOD, "temperature": -1}, 400, "invalid_request_error"),
    ({**GOOD, "n": 2}, 400, "invalid_request_error"),
    ({**GOOD, "tools": [{"type": "function", "function": {"name": "f"}}]}, 400, "invalid_request_error"),
    ({**GOOD, "c2c": {"mode": "sideways"}}, 400, "invalid_request_error"),
    ({**GOOD, "c2c": {"unknown": 1}}, 400, "invalid_request_error"),
    ({**GOOD, "model": "no-such-model"}, 404, "UnknownModelError"),
    ({**GOOD, "c2c": {"attach": ["0" * 64]}}, 403, "CommitNotVisibleError"),        # as a foreign id: no oracle
    ({**GOOD, "c2c": {"publish": {"stream": "bad stream name!"}}}, 400, "ConfigError"),
    ({**GOOD, "messages": [{"role": "user", "content": "x" * 5000}]}, 400, "ContextLengthError"),   # 4096 positions
    ({**GOOD, "max_tokens": 5000}, 400, "ContextLengthError"),
    ({**GOOD, "logit_bias": {"999999": 5}}, 400, "ConfigError"),                     # not a token id
    ({**GOOD, "logit_bias": {"5": 500}}, 400, "invalid_request_error"),
    ({**GOOD, "logit_bias": {"\u00b2": 1}}, 400, "invalid_request_error"),           # a non-ASCII digit
    ({**GOOD, "logit_bias": {"1" * 5000: 1}}, 400, "invalid_request_error"),          # past int()'s digit limit
    ({**GOOD, "seed": 2**64}, 400, "invalid_request_error"),                          # past torch's seed range
])
def test_bad_input_gets_an_openai_shaped_error(tiny_server, body, status, kind):
    resp = post(tiny_server, body)
    assert resp.status_code == status, resp.text
    assert error_of(resp)["type"] == kind


def test_a_body_over_the_limit_is_413_by_length_and_by_stream(tiny_server):
    big = {**GOOD, "messages": [{"role": "user", "content": "x" * (1 << 20)}]}  # the server allows 1 MB
    resp = post(tiny_server, big)
    assert resp.status_code == 413 and error_of(resp)["type"] == "RequestTooLargeError"

    def chunks():  # no Content-Length: counted as it arrives
        data = json.dumps(big).encode()
        for i in range(0, len(data), 1 << 16):
            yield data[i:i + (1 << 16)]

    resp = httpx.post(tiny_server.url("/v1/chat/completions"), content=chunks(),
                      headers={"content-type": "application/json", **tiny_server.headers("analyst")})
    assert resp.status_code == 413 and error_of(resp)["type"] == "RequestTooLargeError"


def test_no_token_or_an_unknown_token_is_401(tiny_server):
    resp = post(tiny_server, GOOD, agent=None)
    assert resp.status_code == 401 and error_of(resp)["type"] == "AuthError"
    assert resp.headers["www-authenticate"] == "Bearer"
    resp = post(tiny_server, GOOD, agent=None, authorization="Bearer tok-analyst-0123456789abcdeX")
    assert resp.status_code == 401 and error_of(resp)["type"] == "AuthError"
    assert "tok-analyst" not in resp.text
    bad = openai.OpenAI(base_url=tiny_server.base_url, api_key="wrong-token", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        bad.models.list()
    assert "tok-analyst-0123456789abcdeX" not in tiny_server.log() and "wrong-token" not in tiny_server.log()


def test_an_unknown_route_is_404_in_the_same_shape(tiny_server):
    resp = httpx.get(tiny_server.url("/v1/nothing-here"))
    assert resp.status_code == 404 and error_of(resp)["type"] == "not_found_error"


def test_a_request_past_its_deadline_is_504_and_stops(tiny_server):
    resp = post(tiny_server, {**GOOD, "max_tokens": 3000, "logit_bias": {"258": -100}, "c2c": {"timeout_s": 0.05}})
    assert resp.status_code == 504 and error_of(resp)["type"] == "RequestTimeoutError"


def test_the_server_keeps_serving_after_every_error(tiny_server):
    r = chat(tiny_server.client("analyst"), [SYSTEM, {"role": "user", "content": "still there?"}], max_tokens=2)
    assert r.usage.completion_tokens >= 1 and c2c_field(r)["session"] is None
    assert httpx.get(tiny_server.url("/healthz")).json()["status"] == "ok"
