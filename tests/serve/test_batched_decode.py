"""Batched decode in `c2c serve`: concurrent requests decode in one forward pass per step (``--max-batch``), and
each gets the reply it gets alone; a request that leaves mid-batch takes nothing of the others with it."""

from __future__ import annotations

import re
import threading

import httpx
import pytest

from serve_helpers import SYSTEM, ServeProcess, c2c_field, chat, make_home

PROMPTS = [f"Agent {i} reports: the {w} build failed on host {i}." for i, w in
           enumerate(["nightly", "release", "canary", "debug", "arm64", "docs"])]


@pytest.fixture(scope="module")
def open_server(tmp_path_factory):
    """tiny-qwen2 with open access: every caller is agent "default" in one domain, as a newcomer runs it."""
    root = tmp_path_factory.mktemp("serve-batch")
    server = ServeProcess(make_home(root), "--model", "tiny-qwen2", "--default-max-tokens", "8").start()
    yield server
    server.stop()


def _batches(server) -> tuple[float, float]:
    """(passes, steps) of the decode-batch histogram: steps > passes once some pass held two requests."""
    text = httpx.get(server.url("/metrics")).text
    count = sum(float(m) for m in re.findall(r'^c2c_decode_batch_count\{[^}]*\} (\S+)$', text, re.M))
    total = sum(float(m) for m in re.findall(r'^c2c_decode_batch_sum\{[^}]*\} (\S+)$', text, re.M))
    return count, total


def _together(server, prompts, **kw) -> list:
    client = server.client()
    out, start = [None] * len(prompts), threading.Barrier(len(prompts))

    def one(i):
        start.wait()
        out[i] = chat(client, [SYSTEM, {"role": "user", "content": prompts[i]}], max_tokens=24, **kw)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(len(prompts))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return out


def test_concurrent_requests_of_one_agent_decode_together_and_each_gets_its_own_reply(open_server):
    client = open_server.client()
    models = client.models.list().data
    c2c = models[0].model_extra["c2c"]
    assert {k: c2c[k] for k in ("max_batch", "batched_decode", "prefix_stable")} == \
        {"max_batch": 16, "batched_decode": True, "prefix_stable": True}
    assert "prefix-stable" in c2c["rendering"]   # the template's check at load (c2c.conversation.render)
    alone = [chat(client, [SYSTEM, {"role": "user", "content": p}], max_tokens=24) for p in PROMPTS]
    passes0, steps0 = _batches(open_server)
    together = _together(open_server, PROMPTS)
    passes, steps = _batches(open_server)
    assert steps - steps0 > passes - passes0            # some forward pass decoded two or more requests
    assert steps - steps0 >= sum(r.usage.completion_tokens - 1 for r in together)   # every step is counted
    for a, b in zip(alone, together):                   # fp32: the same greedy replies, batched or alone
        assert b.choices[0].message.content == a.choices[0].message.content
        assert b.usage == a.usage


def test_a_request_that_leaves_mid_batch_takes_nothing_of_the_others(open_server):
    client = open_server.client()
    alone = [chat(client, [SYSTEM, {"role": "user", "content": p}], max_tokens=24) for p in PROMPTS[:3]]
    left = threading.Event()

    def leaver():   # streams, then hangs up after two chunks: its job is cancelled between two batched steps
        with client.chat.completions.create(model="tiny-qwen2", max_tokens=200, temperature=0, stream=True,
                                            logit_bias={str(i): -100 for i in range(2)},
                                            messages=[SYSTEM, {"role": "user", "content": "Go on and on."}]) as s:
            for k, _ in enumerate(s):
                if k == 2:
                    break
        left.set()

    t = threading.Thread(target=leaver)
    t.start()
    together = _together(open_server, PROMPTS[:3])
    t.join()
    assert left.is_set()
    for a, b in zip(alone, together):
        assert b.choices[0].message.content == a.choices[0].message.content
    # and the server goes on: a session's two turns after it
    first = chat(client, [SYSTEM, {"role": "user", "content": PROMPTS[0]}], c2c={"session": "after"})
    again = chat(client, [SYSTEM, {"role": "user", "content": PROMPTS[0]},
                          {"role": "assistant", "content": first.choices[0].message.content},
                          {"role": "user", "content": "And then?"}], c2c={"session": "after"})
    assert c2c_field(again)["session"]["turns"] == 2 and c2c_field(again)["cached_tokens"] > 0


def test_one_batch_per_pass_is_a_flag_and_the_server_says_so(tmp_path):
    server = ServeProcess(make_home(tmp_path), "--model", "tiny-qwen2", "--max-batch", "1").start()
    try:
        c2c = server.client().models.list().data[0].model_extra["c2c"]
        assert (c2c["max_batch"], c2c["batched_decode"]) == (1, False)
        client = server.client()
        alone = [chat(client, [SYSTEM, {"role": "user", "content": p}], max_tokens=24) for p in PROMPTS[:3]]
        together = _together(server, PROMPTS[:3])
        assert [r.choices[0].message.content for r in together] == [r.choices[0].message.content for r in alone]
        assert _batches(server) == (0, 0)                   # no pass ever held two requests
    finally:
        server.stop()
    assert "decodes one request per forward pass (--max-batch 1)" in server.log()
