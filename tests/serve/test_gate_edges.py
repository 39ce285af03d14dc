"""What a probe of `c2c serve` found at the gate's edges, each against a real server.

- A session that attached a commit goes on when the commit is gone (retired by its stream's retention):
  it never answers 403 for good.
- A domain name that ends in a newline is refused wherever one is named.
- A bearer token sent in the query string (``?api_key=``, ``?jwt=``, any name) is refused, and no query
  value is ever written to the access log.
(The never-issued events cursor is in test_http_errors.py, beside the other cursors.)
"""

from __future__ import annotations

import httpx
import pytest

from serve_helpers import SYSTEM, c2c_field, chat

from c2c.store import open_store

EVIDENCE = {"role": "user", "name": "evidence", "content": "Evidence: the pager fired at 03:12 for disk 4."}


def test_a_session_goes_on_when_a_commit_it_attached_is_retired(tiny_server):
    """Domain research keeps one version of a stream; a session of each domain attached V1; V2 retires V1.
    Every later turn of both sessions still answers, from the K/V the session holds."""
    with open_store(tiny_server.store_url() + "?domain=research") as store:
        store.set_retention("retire-t", keep_last=1)
    v1 = c2c_field(chat(tiny_server.client("analyst"), [SYSTEM, EVIDENCE], max_tokens=4,
                        c2c={"session": "retire-pub-1", "publish": {"stream": "retire-t", "share": ["other"]}}))
    v1 = v1["publish"]["commit"]
    ask = {"role": "user", "content": "When did the pager fire?"}
    sessions = {"writer": "retire-own", "outsider": "retire-shared"}
    for agent, session in sessions.items():
        first = c2c_field(chat(tiny_server.client(agent), [SYSTEM, ask], max_tokens=4,
                               c2c={"session": session, "attach": [v1], "mode": "auto"}))
        assert first["attach"][0]["commit"] == v1 and first["attached"] == [v1]
    c2c_field(chat(tiny_server.client("analyst"), [SYSTEM, EVIDENCE, {"role": "user", "content": "v2"}],
                   max_tokens=4, c2c={"session": "retire-pub-2", "publish": {"stream": "retire-t"}}))
    with open_store(tiny_server.store_url() + "?domain=research") as store:
        assert not store.has(v1)  # retired by keep_last=1
    for agent, session in sessions.items():
        for turn in range(2):  # not a one-off: the session stays usable
            r = chat(tiny_server.client(agent), [SYSTEM, ask, {"role": "assistant", "content": "03:12"},
                                                 {"role": "user", "content": f"And then? ({turn})"}],
                     max_tokens=4, c2c={"session": session})
            rec = c2c_field(r)
            assert r.choices[0].message.content is not None and rec["attached"] == [v1], rec
            # it went on from what it held, or (evicted meanwhile: this server keeps 0.5 MB of sessions) rebuilt
            # from the tokens it holds, and says so
            assert rec["reused_tokens"] > 0 or rec["session"]["state"] == "rebuilt", rec
    # attaching the retired commit afresh is the one "not visible" answer, as for any id it cannot see
    body = {"model": "tiny-qwen2", "messages": [SYSTEM, ask], "max_tokens": 2, "c2c": {"attach": [v1]}}
    resp = httpx.post(tiny_server.url("/v1/chat/completions"), json=body, headers=tiny_server.headers("writer"),
                      timeout=60)
    assert resp.status_code == 403 and resp.json()["error"]["code"] == "commit_not_visible"


@pytest.mark.parametrize("share", [["green\n"], ["green\r\n"], ["\ngreen"], ["gr een"]])
def test_a_share_list_with_a_newline_in_a_domain_is_refused(tiny_server, share):
    body = {"model": "tiny-qwen2", "messages": [SYSTEM, EVIDENCE], "max_tokens": 2,
            "c2c": {"publish": {"stream": "nl-t", "share": share}}}
    resp = httpx.post(tiny_server.url("/v1/chat/completions"), json=body, headers=tiny_server.headers("analyst"),
                      timeout=60)
    assert resp.status_code == 400, resp.text
    assert resp.json()["error"]["c2c_error"] == "ConfigError" and "trust domain" in resp.json()["error"]["message"]


#: query parameter names a token rides under, beyond any list of credential names (the last one percent-encoded)
TOKEN_PARAMS = ("api_key", "token", "access_token", "auth_token", "api_token", "bearer", "password", "x-api-key",
                "session_token", "id_token", "jwt", "api%5Fkey")


def test_a_token_in_the_query_string_is_refused_and_never_logged(tiny_server):
    secret = "tok-leaked-in-url-0123456789"
    paths = [f"/v1/models?x=1&token={secret}&y=2", f"/v1/c2c/events?after=0&access_token={secret}",
             f"/v1/models?{secret}"]  # a bare value, with no name
    paths += [f"/v1/models?{name}={secret}-{i}" for i, name in enumerate(TOKEN_PARAMS)]
    for path in paths:
        resp = httpx.get(tiny_server.url(path), timeout=30)
        assert resp.status_code == 401, path
    resp = httpx.get(tiny_server.url("/v1/models?x=1&token=abc"), headers=tiny_server.headers("analyst"), timeout=30)
    assert resp.status_code == 200
    log = tiny_server.log()
    assert secret not in log and "token=abc" not in log
    # the line stays, with its parameter names; every value is one marker
    assert "/v1/models?x=[redacted]&token=[redacted]&y=[redacted]" in log
    assert "/v1/c2c/events?after=[redacted]&access_token=[redacted]" in log and "/v1/models?[redacted] " in log
    for name in TOKEN_PARAMS:
        assert f"/v1/models?{name}=[redacted]" in log, name
