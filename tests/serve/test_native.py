"""The native endpoints: commits, invalidation events, the advisor, health, metrics, docs; and c2c.client."""

from __future__ import annotations

import json
import threading
from dataclasses import replace

import httpx
import pytest

from c2c import errors
from c2c.client import Client, attach_records, c2c_of, c2c_options, published
from serve_helpers import SYSTEM, TOKENS, chat


def client(server, agent="analyst") -> Client:
    return Client(server.base_url, api_key=TOKENS[agent][0])


def publish(server, stream):
    r = server.client("analyst").chat.completions.create(
        model="tiny-qwen2", messages=[SYSTEM, {"role": "user", "content": f"notes for {stream}"}], max_tokens=3,
        temperature=0, extra_body=c2c_options(session=f"native-{stream}", publish=stream))
    return published(r)


def test_the_client_helpers_build_and_read_the_c2c_field(tiny_server):
    assert c2c_options("s", publish=True, labels=["evidence"]) == {
        "c2c": {"session": "s", "publish": {"labels": ["evidence"]}}}
    commit = publish(tiny_server, "native-helpers")
    r = tiny_server.client("writer").chat.completions.create(
        model="tiny-qwen2", messages=[SYSTEM, {"role": "user", "content": "go"}], max_tokens=2, temperature=0,
        extra_body=c2c_options(attach=[commit], mode="full"))
    [rec] = attach_records(r)
    assert rec["path"] == "cache" and c2c_of(r)["attached"] == [commit]
    raw = client(tiny_server, "writer").chat("tiny-qwen2", [SYSTEM, {"role": "user", "content": "go"}],
                                            max_tokens=2, temperature=0, c2c={"attach": [commit]})
    assert attach_records(raw)[0]["path"] == "cache"


def test_show_a_commit_of_ones_own_domain_only(tiny_server):
    commit = publish(tiny_server, "native-show")
    shown = client(tiny_server).commit(commit)
    assert shown["id"] == commit and shown["stream"] == "native-show" and shown["stale"] is False
    assert shown["summary"]["producer"] == {"agent": "analyst", "domain": "research", "session": "native-native-show"}
    assert shown["hops"]["depth"] == 0
    with pytest.raises(errors.CommitNotVisibleError) as foreign:
        client(tiny_server, "outsider").commit(commit)
    with pytest.raises(errors.CommitNotVisibleError) as absent:
        client(tiny_server, "outsider").commit("ab" * 32)
    # another domain's commit and no commit at all get one answer: nothing confirms the id exists
    assert foreign.value.status == absent.value.status == 403
    assert str(foreign.value).replace(commit[:12], "ID") == str(absent.value).replace("ab" * 6, "ID")


def test_invalidation_events_stream_to_subscribers_of_the_domain(tiny_server):
    commit = publish(tiny_server, "native-events")
    got: list[dict] = []

    def listen():  # everything since cursor 0, until our commit's event arrives
        for ev in client(tiny_server).events(after="0", timeout_s=10):
            got.append(ev)
            if ev["commit"] == commit:
                return

    t = threading.Thread(target=listen)
    t.start()
    events = client(tiny_server).invalidate(commit, "source retracted")
    t.join(10)
    assert [e["commit"] for e in events] == [commit]
    mine = [e for e in got if e["commit"] == commit]
    assert mine and mine[0]["reason"] == "invalidated: source retracted"
    # another domain sees none of research's events
    assert not list(client(tiny_server, "outsider").events(limit=1, timeout_s=0.5))
    with pytest.raises(errors.CommitNotVisibleError):
        client(tiny_server, "outsider").invalidate(commit, "not yours")
    assert client(tiny_server).commit(commit)["stale_reason"] == "invalidated: source retracted"
    with pytest.raises(errors.ConfigError):  # schema: a reason is required
        client(tiny_server).invalidate(commit, "")


def test_the_advisor_needs_a_calibration(tiny_server):
    with pytest.raises(errors.ConfigError) as e:
        client(tiny_server).advise("tiny-qwen2", 64, context_tokens=512)
    assert "c2c advise" in str(e.value)
    cal = {"model": "tiny-qwen2", "prefill_s_fixed": 0.01, "prefill_s_per_token": 1e-4, "prefill_s_per_pair": 1e-8,
           "prefill_s_per_past": 1e-6, "decode_s_per_token": 0.01, "decode_s_per_position": 1e-6,
           "kv_bytes_per_token": 1024, "handoff_points": [[1000, 0.001], [100000, 0.005]], "version": 2}
    (tiny_server.home / "calibration").mkdir(exist_ok=True)
    (tiny_server.home / "calibration" / "tiny-qwen2.json").write_text(json.dumps(cal))
    a = client(tiny_server).advise("tiny-qwen2", 64, context_tokens=512)
    assert a["decision"] in ("cache", "text") and a["reason"] and a["model"] == "tiny-qwen2"
    assert [c["name"] for c in a["checks"]][-1] == "advisor" and "cache_is_faster" in a
    assert client(tiny_server).advise("tiny-qwen2", 64, cross_domain=True)["decision"] == "text"


def test_health_metrics_and_docs(tiny_server):
    assert client(tiny_server).health()["status"] == "ok"
    chat(tiny_server.client("analyst"), [SYSTEM, {"role": "user", "content": "count me"}], max_tokens=2)
    text = httpx.get(tiny_server.url("/metrics")).text
    for name in ("c2c_requests_total", "c2c_request_seconds_bucket", "c2c_queue_depth", "c2c_tokens_total",
                 "c2c_session_bytes"):
        assert name in text, name
    assert 'route="/v1/chat/completions",status="200"' in text
    docs = httpx.get(tiny_server.url("/docs"))
    assert docs.status_code == 200 and "swagger" in docs.text.lower()
    spec = httpx.get(tiny_server.url("/openapi.json")).json()
    assert {"/v1/chat/completions", "/v1/models", "/v1/c2c/commits/{commit_id}", "/v1/c2c/events",
            "/v1/c2c/advise", "/v1/c2c/commits/{commit_id}/invalidate"} <= set(spec["paths"])


def test_handoff_metrics_count_paths_and_reasons(tiny_server):
    commit = publish(tiny_server, "native-metrics")
    chat(tiny_server.client("writer"), [SYSTEM, {"role": "user", "content": "q"}], max_tokens=2,
         c2c={"attach": [commit]})
    chat(tiny_server.client("writer"), [SYSTEM, {"role": "user", "content": "q"}], max_tokens=2,
         c2c={"attach": [commit], "mode": "text"})
    text = httpx.get(tiny_server.url("/metrics")).text
    assert 'c2c_handoffs_total{path="cache",reason="ok"}' in text
    assert 'c2c_handoffs_total{path="text",reason="requested"}' in text
    assert 'c2c_handoff_bytes_total{direction="publish"}' in text


def test_a_commit_belongs_to_its_verified_signer_not_to_the_domain_its_header_claims(tiny_server):
    from c2c.artifact import Artifact
    from c2c.store import open_store
    from c2c.trust.keys import Keyring
    from c2c.trust.signing import sign

    commit = publish(tiny_server, "native-claim")
    ring = Keyring(tiny_server.home / "keys")
    with open_store(tiny_server.store_url() + "?domain=research") as store:
        art = Artifact.decode(store.get(commit).data)
        # research's own key signs a header that claims the producer is of domain "other"
        claim = replace(art, header=replace(art.header, producer={"agent": "x", "domain": "other"}))
        data = sign(claim, ring.signing_key("research")).encode()
        forged = store.put(data, stream="claims").id
    assert forged != commit
    with pytest.raises(errors.CommitNotVisibleError):
        client(tiny_server, "outsider").invalidate(forged, "the header says it is mine")
    with pytest.raises(errors.CommitNotVisibleError):
        client(tiny_server, "outsider").commit(forged)
    shown = client(tiny_server).commit(forged)  # in research's part of the store: research's commit
    assert shown["id"] == forged and shown["stale"] is False
    # The same bytes slipped into other's part of the store behind the server's back: other cannot
    # attach them, in any mode, since research signed them and never shared them.
    with open_store(tiny_server.store_url() + "?domain=other") as store:
        store.put(data, stream="claims")
    for mode in ("auto", "text", "full"):
        with pytest.raises(errors.CommitNotVisibleError):
            client(tiny_server, "outsider").chat("tiny-qwen2", [SYSTEM, {"role": "user", "content": "q"}],
                                                 max_tokens=2, c2c={"attach": [forged], "mode": mode})
