"""The front-ends' conformance cases (c2c.testing.front_ends) against a real `vllm serve` with the connector.

The same table runs against the library (tests/flows/test_front_end_library.py) and a real
`c2c serve` (tests/serve/test_front_end_serve.py). The server is the session's: each case uses
streams of its own and puts back what it changed (a quota, a policy). vLLM's connector holds no
second copy of the model to re-compute K/V with, so a domain whose policy asks for a sampled
check is refused by name (``KV_REFUSED``), never accepted unchecked.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import replace

import httpx
import pytest
from openai import APIStatusError, OpenAI

from c2c.artifact import Artifact
from c2c.artifact.header import SHARE_KEY
from c2c.runtime.facts import EngineId
from c2c.store import open_store
from c2c.testing import front_ends as fe
from c2c.trust.keys import Keyring
from c2c.trust.signing import sign

from vllm_helpers import FOLLOW_UP, OTHER, SYSTEM, chat, kv, tamper_chunk

pytestmark = [pytest.mark.vllm, pytest.mark.slow, pytest.mark.redis]


@pytest.fixture(scope="module")
def client(vllm_server):
    return OpenAI(base_url=vllm_server.base_url, api_key="unused", max_retries=0, timeout=300)


def publish(client) -> tuple[list[dict], dict]:
    """A fresh commit on a stream of its own: (the messages that continue it, the publish record)."""
    question = {"role": "user", "content": f"Case {uuid.uuid4().hex[:8]}: summarize the incident in one sentence."}
    r = chat(client, [SYSTEM, question], {"publish": {"stream": f"fe-{uuid.uuid4().hex[:8]}"}}, max_tokens=4)
    pub = kv(r)["publish"]
    assert "error" not in pub, pub
    return [SYSTEM, question, {"role": "assistant", "content": r.choices[0].message.content}, FOLLOW_UP], pub


def attach(client, messages, cid, mode="full") -> tuple[fe.Outcome, dict]:
    try:
        r = chat(client, messages, {"attach": cid, "mode": mode}, max_tokens=2)
    except APIStatusError as e:
        return fe.of_body(e.status_code, {"error": e.body}), {"error": e.body}
    return fe.of_record(kv(r)["attach"]), kv(r)


def resigned(server, cid: str, *, domain: str, share=(), **header) -> str:
    """``cid``'s K/V committed again by ``domain`` (its key trusted by the instance's keyring), with ``share``."""
    ring = Keyring(server.home / "keys")
    try:
        key = ring.signing_key(domain)
    except Exception:
        key = ring.create_key(domain, label="front-end test")
    with open_store(server.store_url) as store:
        art = Artifact.decode(store.in_domain(fe.DOMAIN).get(cid).data)
        h = art.header
        built = Artifact.build(art.cache, fingerprint=header.get("fingerprint", h.fingerprint), prefix=h.prefix,
                               producer={"agent": "analyst", "domain": domain},
                               extra={SHARE_KEY: list(share)} if share else None)
        part = store.in_domain(domain)
        commit = part.put(sign(built, key).encode(), stream=f"fe-{uuid.uuid4().hex[:8]}")
        if share:
            part.grant(commit.id, list(share))
    return commit.id


def run_case(case: str, client, server, mode: str = "full") -> tuple[fe.Outcome, dict]:
    ring = Keyring(server.home / "keys")
    if case == "made_up":
        return attach(client, [SYSTEM, FOLLOW_UP], "ab" * 32, mode=mode)
    if case == "over_quota":
        with open_store(server.store_url) as store:
            store.in_domain(fe.DOMAIN).set_quota(1)
            try:
                r = chat(client, [SYSTEM, FOLLOW_UP], {"publish": {"stream": "fe-quota"}}, max_tokens=2)
            finally:
                store.in_domain(fe.DOMAIN).set_quota(None)
        pub = kv(r)["publish"]  # the reply stands; the publish says what c2c serve would have answered
        return fe.of_body(pub["status"], pub), pub
    messages, pub = publish(client)
    cid = pub["commit"]
    if case == "own":
        return attach(client, messages, cid, mode=mode)
    if case == "shared":
        return attach(client, messages, resigned(server, cid, domain=fe.OTHER, share=[fe.DOMAIN]), mode=mode)
    if case == "foreign":
        return attach(client, messages, resigned(server, cid, domain=fe.OTHER), mode=mode)
    if case == "stale":
        with open_store(server.store_url) as store:
            store.in_domain(fe.DOMAIN).invalidate(cid, reason="retracted")
        return attach(client, messages, cid, mode=mode)
    if case == "tampered":
        with open_store(server.store_url) as store:
            tamper_chunk(store.in_domain(fe.DOMAIN), cid)
        return attach(client, messages, cid, mode=mode)
    if case == "wrong_model":
        with open_store(server.store_url) as store:
            fp = Artifact.decode(store.in_domain(fe.DOMAIN).get(cid).data).header.fingerprint
        other = replace(fp, backend=EngineId.parse("transformers"))  # the same weights in another engine
        return attach(client, messages, resigned(server, cid, domain=fe.DOMAIN, fingerprint=other), mode=mode)
    if case == "wrong_prefix":
        return attach(client, OTHER, cid, mode=mode)
    if case == "kv_policy":
        ring.set_policy(fe.DOMAIN, {"kv": "sample", "samples": 4})
        try:
            return attach(client, messages, cid, mode=mode)
        finally:
            ring.set_policy(fe.DOMAIN, {"kv": "none"})
    raise AssertionError(case)


@pytest.mark.parametrize("case, mode", fe.CASE_MODES)
def test_vllm_answers_every_case_as_every_front_end(client, vllm_server, case, mode):
    got, body = run_case(case, client, vllm_server, mode)
    want = fe.expected(case, checks_kv=False, mode=mode)
    assert got.comparable() == want.comparable(), (case, mode, body)
    if case == "kv_policy" and mode == "full":  # refused, naming the policy and the way out
        assert "policy" in body["error"]["message"] and "kv=none" in body["error"]["message"], body


def test_an_id_another_domain_holds_reads_as_one_that_does_not_exist(client, vllm_server):
    _, a = run_case("foreign", client, vllm_server)
    _, b = run_case("made_up", client, vllm_server)
    ids = [a["error"]["message"].split()[2], b["error"]["message"].split()[2]]
    assert fe.same_answer(a["error"]["message"], b["error"]["message"], *ids)


def test_a_publish_shared_through_vllm_is_granted_as_through_c2c_serve(client, vllm_server):
    """``publish.share`` through the connector: signed in the header, granted in each named domain."""
    question = {"role": "user", "content": f"Share {uuid.uuid4().hex[:8]}: one sentence."}
    r = chat(client, [SYSTEM, question], {"publish": {"stream": "fe-share", "share": [fe.OTHER]}}, max_tokens=4)
    pub = kv(r)["publish"]
    assert pub["share"] == [fe.OTHER], pub
    with open_store(vllm_server.store_url) as store:
        assert store.in_domain(fe.OTHER).granted(pub["commit"]) == fe.DOMAIN
        art = Artifact.decode(store.in_domain(fe.DOMAIN).get(pub["commit"]).data)
    assert art.header.shared_with == (fe.OTHER,)
    with pytest.raises(APIStatusError) as e:  # a bad domain in the share list: a 400, nothing published
        chat(client, [SYSTEM, question], {"publish": {"stream": "fe-share", "share": ["green\n"]}}, max_tokens=2)
    assert e.value.status_code == 400 and e.value.body["c2c_error"] == "ConfigError"


def test_a_tampered_chunk_is_refused_in_every_mode_as_c2c_serve_refuses_it(client, vllm_server):
    """Not an ordinary prefill in ``auto``: the tampering is reported (422 ``store_corrupt``), for a stream before
    any token; nothing of the chunk is loaded in any mode."""
    messages, pub = publish(client)
    with open_store(vllm_server.store_url) as store:
        tamper_chunk(store.in_domain(fe.DOMAIN), pub["commit"])
    want = fe.expected("tampered", checks_kv=False).comparable()
    for mode in ("auto", "full"):
        status, body = attach_in(client, messages, pub["commit"], mode)
        assert status == 422, (mode, body)                                            # auto: not a prefill
        assert fe.of_body(status, body).comparable() == want, (mode, body)
        assert body["kv_transfer_params"]["c2c"]["attach"]["path"] == "error", body   # the reply says what failed
    with pytest.raises(APIStatusError) as e:
        list(client.chat.completions.create(model="smol", messages=messages, max_tokens=2, temperature=0, stream=True,
                                            extra_body={"kv_transfer_params": {"c2c": {"attach": pub["commit"]}}}))
    assert (e.value.status_code, e.value.body["code"], e.value.body["c2c_error"]) == (
        422, "store_corrupt", "ChunkCorruptError")


def attach_in(client, messages, cid, mode) -> tuple[int, dict]:
    """Attach ``cid`` in ``mode``: (the status, the error reply's whole body or the reply's c2c record)."""
    try:
        r = chat(client, messages, {"attach": cid, "mode": mode}, max_tokens=2)
    except APIStatusError as e:
        return e.status_code, e.response.json()
    return 200, kv(r)


@pytest.mark.parametrize("path, body", [
    ("/chat/completions", {"messages": [SYSTEM, FOLLOW_UP]}),
    ("/chat/completions", {"messages": [SYSTEM, FOLLOW_UP], "stream": True}),
    ("/chat/completions", {"messages": [SYSTEM, FOLLOW_UP], "c2c": {"attach": ["ab" * 32], "mode": "auto"}}),
    ("/chat/completions", {"messages": [SYSTEM, FOLLOW_UP], "stream": True,
                           "kv_transfer_params": {"c2c": {"publish": {"stream": "fe-model"}}}}),
    ("/completions", {"prompt": "Give the incident a title."}),
], ids=["chat", "stream", "c2c-field", "native-stream", "completions"])
def test_a_model_it_does_not_serve_is_refused_in_c2c_serves_shape(vllm_server, path, body):
    """vLLM's own 404 (``type: "NotFoundError"``, ``code: 404``) becomes c2c serve's, whatever the request carries."""
    r = httpx.post(vllm_server.base_url + path, json={"model": "no-such-model", "max_tokens": 2, **body}, timeout=120)
    assert r.status_code == 404, r.text
    err = r.json()["error"]
    assert set(err) == {"message", "type", "code", "param", "c2c_error"}, err
    assert (err["type"], err["code"], err["c2c_error"]) == ("not_found_error", "model_not_found", "UnknownModelError")
    assert "no-such-model" in err["message"] and "smol" in err["message"], err   # names what it serves


@pytest.mark.parametrize("content", [
    b'{"model": "smol", "messages": [',                                                      # not JSON
    b'{"model": "smol", "c2c": {"attach": ',                                                 # not JSON, c2c in it
    {"model": "smol", "messages": [SYSTEM, FOLLOW_UP], "temperature": -1},                   # a bad sampling value
    {"model": "smol", "messages": [{"role": "user", "content": "incident " * 3000}]},        # past --max-model-len
], ids=["not-json", "not-json-c2c", "temperature", "too-long"])
def test_vllms_other_refusals_keep_its_shape_and_are_never_5xx(vllm_server, content):
    """What docs/vllm.md says keeps vLLM's own error shape (``code`` the status as a number, no ``c2c_error``)."""
    body = content if isinstance(content, bytes) else json.dumps({"max_tokens": 2, **content}).encode()
    r = httpx.post(vllm_server.base_url + "/chat/completions", content=body,
                   headers={"content-type": "application/json"}, timeout=120)
    assert 400 <= r.status_code < 500, r.text
    err = r.json()["error"]
    assert err["code"] == r.status_code and "c2c_error" not in err, err


def test_no_query_value_reaches_vllms_access_log(vllm_server):
    """Probe 3, item 7, at the vLLM front-end: vLLM's own uvicorn access log wrote the whole request target, so a
    token sent in the URL was logged verbatim; the middleware installs c2c serve's redaction on it."""
    secrets = {name: f"tok-leaked-{uuid.uuid4().hex}" for name in ("api_key", "auth_token", "jwt", "api%5Fkey")}
    query = "&".join(f"{k}={v}" for k, v in secrets.items())
    r = httpx.post(vllm_server.base_url + f"/chat/completions?{query}", timeout=120,
                   json={"model": "smol", "max_tokens": 1, "messages": [SYSTEM, FOLLOW_UP]})
    assert r.status_code == 200, r.text
    httpx.get(vllm_server.base_url + f"/models?{query}", timeout=30)
    log = vllm_server.log()
    assert "/chat/completions?" in log and "api_key=[redacted]" in log   # the line is there, its values are not
    for v in secrets.values():
        assert v not in log
