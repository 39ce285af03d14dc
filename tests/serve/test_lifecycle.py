"""Serving: open access, a bounded queue (429), client disconnects stop generation, graceful shutdown."""

from __future__ import annotations

import signal
import threading
import time

import httpx
import pytest

from serve_helpers import SYSTEM, ServeProcess, c2c_field, chat, make_home

# tiny-qwen2's end-of-turn token is 258: banned, 3000 tokens take many seconds
LONG = {"model": "tiny-qwen2", "messages": [SYSTEM, {"role": "user", "content": "Go on forever."}],
        "max_tokens": 3000, "temperature": 0, "stream": True, "logit_bias": {"258": -100}}


@pytest.fixture(scope="module")
def open_server(tmp_path_factory):
    """No --tokens (open access, domain "default") and room for one waiting request."""
    server = ServeProcess(make_home(tmp_path_factory.mktemp("serve-open")), "--model", "tiny-qwen2",
                          "--max-queue", "1").start()
    yield server
    server.stop()


def first_chunk(resp: httpx.Response):
    """The first ``data:`` line, and the line iterator: keep it, or dropping it closes the connection."""
    lines = resp.iter_lines()
    return next(line for line in lines if line.startswith("data: ")), lines


def test_open_access_needs_no_token_and_works_in_domain_default(open_server):
    r = chat(open_server.client(), [SYSTEM, {"role": "user", "content": "hi"}], max_tokens=3,
             c2c={"session": "open-1", "publish": {}})
    pub = c2c_field(r)["publish"]
    assert pub["stream"] == "default" and pub["signed_by"]["domain"] == "default"
    resp = httpx.get(open_server.url(f"/v1/c2c/commits/{pub['commit']}"))  # no Authorization at all
    assert resp.status_code == 200 and resp.json()["summary"]["producer"]["domain"] == "default"


@pytest.mark.parametrize("host", ["evil.example", "evil.example:{port}", "127.0.0.1.evil.example", "0.0.0.0:{port}",
                                  "localhost.evil.example", "[::2]:{port}"])
def test_open_access_refuses_a_host_that_is_not_loopback(open_server, host):
    """DNS rebinding: a page at evil.example resolved to 127.0.0.1 sends `Host: evil.example`."""
    h = {"Host": host.format(port=open_server.port)}
    for method, path, body in (("GET", "/healthz", None), ("GET", "/v1/models", None),
                               ("GET", "/v1/c2c/events?timeout_s=1", None),
                               ("POST", "/v1/chat/completions", {**LONG, "stream": False, "max_tokens": 1})):
        resp = httpx.request(method, open_server.url(path), headers=h, json=body, timeout=30)
        e = resp.json()["error"]
        assert resp.status_code == 400, (path, resp.text)
        assert (e["type"], e["code"], e["c2c_error"]) == ("invalid_request_error", "host_not_allowed",
                                                          "HostNotAllowedError")
        assert "--tokens" in e["message"] and "127.0.0.1" in e["message"]


@pytest.mark.parametrize("host", ["127.0.0.1:{port}", "localhost:{port}", "LOCALHOST", "[::1]:{port}", "127.3.2.1"])
def test_open_access_serves_loopback_host_names(open_server, host):
    resp = httpx.get(open_server.url("/v1/models"), headers={"Host": host.format(port=open_server.port)})
    assert resp.status_code == 200 and resp.json()["data"][0]["id"] == "tiny-qwen2"


def test_a_server_with_tokens_serves_any_host_name(tiny_server):
    h = {"Host": "c2c.internal:443", **tiny_server.headers("writer")}  # e.g. behind a proxy
    resp = httpx.get(tiny_server.url("/v1/models"), headers=h)
    assert resp.status_code == 200


def test_a_client_that_disconnects_stops_its_generation(open_server):
    with httpx.Client(timeout=30) as http, http.stream("POST", open_server.url("/v1/chat/completions"),
                                                       json=LONG) as resp:
        _, lines = first_chunk(resp)  # generating now; 3000 tokens would take many seconds
        time.sleep(0.3)
    del lines  # disconnected
    r = chat(open_server.client(), [SYSTEM, {"role": "user", "content": "next"}], max_tokens=2)
    assert c2c_field(r)["timings"]["queue_s"] < 3  # it would wait ~30 s behind a generation that went on


def test_a_client_that_gives_up_on_a_plain_request_stops_it_too(open_server):
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(open_server.url("/v1/chat/completions"), json={**LONG, "stream": False}, timeout=0.5)
    r = chat(open_server.client(), [SYSTEM, {"role": "user", "content": "next"}], max_tokens=2)
    assert c2c_field(r)["timings"]["queue_s"] < 3


def test_a_full_queue_answers_429_with_retry_after(open_server):
    running = httpx.Client(timeout=30)
    one = {**LONG, "c2c": {"session": "queued"}}   # one session's requests run in order: B waits for A
    resp_a = running.send(running.build_request("POST", open_server.url("/v1/chat/completions"), json=one),
                          stream=True)
    _, lines_a = first_chunk(resp_a)  # A runs (while lines_a is alive)
    waited: list[str] = []

    def request_b():  # B waits in the queue until A goes away
        with httpx.stream("POST", open_server.url("/v1/chat/completions"), json=one, timeout=30) as resp_b:
            waited.append(first_chunk(resp_b)[0])

    tb = threading.Thread(target=request_b)
    tb.start()
    for _ in range(100):
        if httpx.get(open_server.url("/healthz")).json()["queue"]["tiny-qwen2"] == 1:
            break
        time.sleep(0.05)
    resp_c = httpx.post(open_server.url("/v1/chat/completions"), json={**LONG, "stream": False, "max_tokens": 2})
    assert resp_c.status_code == 429 and resp_c.json()["error"]["c2c_error"] == "QueueFullError"
    assert int(resp_c.headers["retry-after"]) >= 1
    del lines_a
    resp_a.close()  # A's client goes away: A stops, B runs
    running.close()
    tb.join(30)
    assert waited and waited[0].startswith("data: ")
    assert "c2c_queue_depth" in httpx.get(open_server.url("/metrics")).text


def test_sigterm_lets_a_running_request_finish_then_exits(open_server):
    lines: list[str] = []

    def stream_one():
        body = {**LONG, "max_tokens": 200}
        with httpx.stream("POST", open_server.url("/v1/chat/completions"), json=body, timeout=60) as resp:
            for line in resp.iter_lines():
                if line:
                    lines.append(line)

    t = threading.Thread(target=stream_one)
    t.start()
    for _ in range(500):  # until it is generating
        if len(lines) >= 3:
            break
        time.sleep(0.01)
    assert len(lines) >= 3 and lines[-1] != "data: [DONE]"
    open_server.proc.send_signal(signal.SIGTERM)
    t.join(60)
    assert lines and lines[-1] == "data: [DONE]"  # finished, not cut
    rc = open_server.stop(timeout_s=30)
    assert rc in (0, -signal.SIGTERM)
    assert "Application shutdown complete" in open_server.log()
