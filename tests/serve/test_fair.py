"""Fair shares between tenants (trust domains): the queue, the model's time, the session budget, early
refusals of oversized prompts, and slow clients. Tenant A is domain ``research`` (agents analyst and
writer), tenant B domain ``other`` (outsider)."""

from __future__ import annotations

import json
import socket
import threading
import time

import httpx
import pytest

from serve_helpers import SYSTEM, TOKENS, ServeProcess, c2c_field, chat, make_home, write_tokens

# tiny-qwen2's end-of-turn token is 258: banned, 3000 tokens take many seconds
LONG = {"model": "tiny-qwen2", "messages": [SYSTEM, {"role": "user", "content": "Go on forever."}],
        "max_tokens": 3000, "temperature": 0, "stream": True, "logit_bias": {"258": -100}}


@pytest.fixture(scope="module")
def fair_server(tmp_path_factory):
    """Small shares: 3 waiting (2 requests per domain), 0.4 MB of sessions (0.2 per domain), 6 session
    records (3 per domain), bodies and headers within 1 s."""
    root = tmp_path_factory.mktemp("serve-fair")
    server = ServeProcess(make_home(root), "--model", "tiny-qwen2", "--tokens", str(write_tokens(root / "t.json")),
                          "--max-queue", "3", "--session-budget-mb", "0.4", "--max-sessions", "6",
                          "--read-timeout", "1").start()
    yield server
    server.stop()


class Long:
    """A long streamed generation, read on a thread: ``started`` at its first chunk, ``done`` at [DONE]."""

    def __init__(self, server: ServeProcess, agent: str):
        self.started, self.done = threading.Event(), threading.Event()
        self.http = httpx.Client(timeout=60, headers=server.headers(agent))
        self.resp = self.http.send(self.http.build_request("POST", server.url("/v1/chat/completions"), json=LONG),
                                   stream=True)
        assert self.resp.status_code == 200, self.resp.read()
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()
        assert self.started.wait(30)

    def _read(self) -> None:
        try:
            for line in self.resp.iter_lines():
                if line.startswith("data: "):
                    self.started.set()
                if line == "data: [DONE]":
                    self.done.set()
        except httpx.HTTPError:  # closed by close()
            pass

    def close(self) -> None:
        self.resp.close()
        self.http.close()


@pytest.fixture
def long_streams(fair_server):
    """Start long generations (``start(agent)``); all are closed, and the model idle again, afterwards."""
    streams: list[Long] = []

    def start(agent: str) -> Long:
        streams.append(Long(fair_server, agent))
        return streams[-1]

    yield start
    for s in streams:
        s.close()
    for _ in range(200):  # a closed stream stops at its next forward pass
        if httpx.get(fair_server.url("/healthz")).json()["requests"]["tiny-qwen2"] == 0:
            break
        time.sleep(0.05)


def test_a_tenant_that_holds_its_share_gets_429_while_another_tenant_is_still_answered(fair_server, long_streams):
    a1, a2 = long_streams("analyst"), long_streams("writer")  # domain research: its share of 2, both running
    resp = httpx.post(fair_server.url("/v1/chat/completions"), headers=fair_server.headers("analyst"),
                      json={**LONG, "stream": False, "max_tokens": 2})
    assert resp.status_code == 429 and resp.json()["error"]["c2c_error"] == "QueueFullError"
    assert "research" in resp.json()["error"]["message"] and int(resp.headers["retry-after"]) >= 1
    r = chat(fair_server.client("outsider"), [SYSTEM, {"role": "user", "content": "hi"}], max_tokens=3)
    assert r.choices[0].finish_reason in ("stop", "length") and r.usage.completion_tokens >= 1
    assert not a1.done.is_set() and not a2.done.is_set()


def test_a_short_request_of_one_tenant_finishes_before_another_tenants_long_ones(fair_server, long_streams):
    a1, a2 = long_streams("analyst"), long_streams("writer")
    r = chat(fair_server.client("outsider"), [SYSTEM, {"role": "user", "content": "quick"}], max_tokens=4)
    assert r.usage.completion_tokens >= 1
    # with one queue, it would have waited for both 3000-token generations to end
    assert not a1.done.is_set() and not a2.done.is_set()


def test_one_tenants_many_sessions_do_not_evict_another_tenants_session(fair_server):
    b = fair_server.client("outsider")
    msgs = [SYSTEM, {"role": "user", "content": "Remember: the deploy failed on host 3."}]
    first = chat(b, msgs, c2c={"session": "b-keep"})
    assert c2c_field(first)["session"]["state"] == "new"
    a = fair_server.client("analyst")
    for i in range(8):  # far past the whole budget (0.4 MB, ~100 KB a session) and the 6 records
        chat(a, [SYSTEM, {"role": "user", "content": f"Session {i} of many, each with its own cache."}],
             c2c={"session": f"a-{i}"})
    health = httpx.get(fair_server.url("/healthz")).json()
    assert health["sessions"] <= 6 and health["session_bytes"] <= int(0.4 * 2**20)
    again = chat(b, msgs + [{"role": "assistant", "content": first.choices[0].message.content},
                            {"role": "user", "content": "Which host?"}], c2c={"session": "b-keep"})
    assert c2c_field(again)["session"]["state"] == "warm" and c2c_field(again)["session"]["turns"] == 2
    assert c2c_field(again)["cached_tokens"] > 0
    # A's own oldest session paid for A's newer ones
    old = chat(a, [SYSTEM, {"role": "user", "content": "Session 0 of many, each with its own cache."}],
               c2c={"session": "a-0"})
    assert c2c_field(old)["session"]["state"] in ("new", "rebuilt") and c2c_field(old)["cached_tokens"] == 0


def test_an_oversized_message_is_refused_before_it_waits_for_the_model(fair_server, long_streams):
    running = long_streams("analyst")  # the analyst's next request would wait for this one to end
    huge = {"model": "tiny-qwen2", "max_tokens": 4,
            "messages": [SYSTEM, {"role": "user", "content": "ab" * 300_000}]}  # 600 K characters, context 4096
    resp = httpx.post(fair_server.url("/v1/chat/completions"), headers=fair_server.headers("analyst"), json=huge,
                      timeout=60)
    assert not running.done.is_set()  # refused while the analyst's generation still runs: never queued
    assert resp.status_code == 400 and resp.json()["error"]["code"] == "context_length_exceeded"
    assert "characters" in resp.json()["error"]["message"]


def test_a_prompt_near_the_context_is_still_checked_exactly(fair_server):
    near = {"model": "tiny-qwen2", "max_tokens": 4,
            "messages": [SYSTEM, {"role": "user", "content": "x" * 4090}]}  # < 4096 × 19.5 characters: tokenized
    resp = httpx.post(fair_server.url("/v1/chat/completions"), headers=fair_server.headers("writer"), json=near,
                      timeout=60)
    assert resp.status_code == 400 and "tokens" in resp.json()["error"]["message"]
    assert "characters" not in resp.json()["error"]["message"]


def _raw(server: ServeProcess, data: bytes) -> tuple[bytes, bool]:
    """Send ``data`` and stop there; (what came back, whether the server closed the connection)."""
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as sock:
        sock.sendall(data)
        got = b""
        while True:
            chunk = sock.recv(65536)  # a socket.timeout here: the server never answered
            if not chunk:
                return got, True
            got += chunk


def _status_and_error(raw: bytes) -> tuple[int, dict]:
    head, _, body = raw.partition(b"\r\n\r\n")
    return int(head.split()[1]), json.loads(body)["error"]


def test_a_body_that_does_not_arrive_gets_408_and_the_connection_closed(fair_server):
    head = (f"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer "
            f"{TOKENS['outsider'][0]}\r\nContent-Type: application/json\r\nContent-Length: 200\r\n\r\n")
    raw, closed = _raw(fair_server, head.encode() + b'{"model": "tiny-qwen2", "mess')
    status, error = _status_and_error(raw)
    assert status == 408 and error["c2c_error"] == "ClientTimeoutError" and error["code"] == "request_timeout"
    assert closed


def test_headers_that_do_not_arrive_get_408_and_the_connection_closed(fair_server):
    raw, closed = _raw(fair_server, b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n")
    status, error = _status_and_error(raw)
    assert status == 408 and error["c2c_error"] == "ClientTimeoutError" and closed
    assert httpx.get(fair_server.url("/healthz")).status_code == 200  # the server goes on
