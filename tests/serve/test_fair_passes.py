"""Fairness holds for every forward pass a served request makes (probe 3, items 1 and 2): a repair's recompute
and the prefix before an imported slice run in passes of the prefill chunk, so another tenant's short request
goes between two of them instead of waiting for the whole. Tenant A is domain ``research``, tenant B ``other``."""

from __future__ import annotations

import threading
import time

import httpx
import pytest

from serve_helpers import SYSTEM, ServeProcess, c2c_field, chat

LONG = "Tool result 2: " + "lorem ipsum dolor sit amet " * 120   # about 3,200 tokens of tiny-qwen2


def u(text):
    return {"role": "user", "content": text}


def a(text):
    return {"role": "assistant", "content": text}


@pytest.fixture
def server(roomy_server):
    return roomy_server


def _while_busy(server: ServeProcess, long_call):
    """Run ``long_call`` on a thread; once the model runs it, time the other tenant's 1-token request.
    Returns (``long_call``'s result, the short request's seconds)."""
    out: dict = {}
    t = threading.Thread(target=lambda: out.update(r=long_call()), daemon=True)
    t.start()
    for _ in range(2000):
        if httpx.get(server.url("/healthz")).json()["requests"]["tiny-qwen2"] >= 1:
            break
        time.sleep(0.002)
    time.sleep(0.05)   # well inside its long pass(es)
    t0 = time.perf_counter()
    r = chat(server.client("outsider"), [SYSTEM, u("hi")], max_tokens=1)
    waited = time.perf_counter() - t0
    assert r.usage.completion_tokens == 1
    t.join(120)
    return out["r"], waited


def test_another_tenant_goes_between_the_passes_of_a_long_repair(server):
    client = server.client("analyst")
    msgs = [SYSTEM, u("Tool result 1: the vault code is 4471."), a("Noted."), u(LONG), a("Noted."), u("Sum up.")]
    r1 = chat(client, msgs, c2c={"session": "repair-long"}, max_tokens=1)
    assert r1.usage.prompt_tokens > 3000
    msgs2 = msgs + [a(r1.choices[0].message.content), u("Again?")]
    r2, waited = _while_busy(server, lambda: chat(client, msgs2, max_tokens=1, c2c={
        "session": "repair-long", "edit": {"drop": [1, 2], "repair": "ratio:0.5"}}))
    e = c2c_field(r2)["edit"]
    assert e["recomputed_tokens"] > 1500
    stall = c2c_field(r2)["timings"]["attach_s"]   # the edit (and its repair) runs before the attachments
    assert stall > 0.3, f"the repair took {stall:.2f} s: too short to tell"
    # in one pass, the short request would have waited for most of the repair
    assert waited < 0.5 * stall, f"waited {waited:.2f} s during a {stall:.2f} s repair"


def test_another_tenant_goes_between_the_passes_of_the_prefix_before_an_imported_slice(server):
    system = {"role": "system", "content": "You are one agent of a team. Rules: " + "be brief and exact. " * 150}
    evidence = {"role": "user", "name": "evidence", "content": "Evidence: the outage began at 09:14."}
    pub = c2c_field(chat(server.client("analyst"), [system, evidence], max_tokens=2, c2c={
        "session": "slice-src", "publish": {"stream": "slice-long-prefix", "labels": ["evidence"]}}))["publish"]
    assert pub["kind"] == "slice"
    writer = server.client("writer")
    r, waited = _while_busy(server, lambda: chat(writer, [system, u("When did the outage begin?")], max_tokens=1,
                                                 c2c={"attach": [pub["commit"]], "mode": "slice"}))
    [rec] = c2c_field(r)["attach"]
    assert rec["used"] == "slice" and rec["imported_tokens"] > 0
    stall = c2c_field(r)["timings"]["prefill_s"]
    assert r.usage.prompt_tokens > 2500 and stall > 0.1, f"the prefix took {stall:.2f} s: too short to tell"
    assert waited < 0.5 * stall, f"waited {waited:.2f} s during a {stall:.2f} s prefix prefill"
