"""The front-ends' conformance cases (c2c.testing.front_ends) against a real `vllm serve` with the connector.

The same table runs against the library (tests/flows/test_front_end_library.py) and a real
`c2c serve` (tests/serve/test_front_end_serve.py). The server is the session's: each case uses
streams of its own and puts back what it changed (a quota, a policy). vLLM's connector holds no
second copy of the model to re-compute K/V with, so a domain whose policy asks for a sampled
check is refused by name (``KV_REFUSED``), never accepted unchecked.
"""

from __future__ import annotations

import uuid
from dataclasses import replace

import pytest
from openai import APIStatusError, OpenAI

from c2c.artifact import Artifact
from c2c.artifact.header import SHARE_KEY
from c2c.runtime.facts import EngineId
from c2c.store import open_store
from c2c.testing import front_ends as fe
from c2c.trust.keys import Keyring
from c2c.trust.signing import sign

from vllm_helpers import FOLLOW_UP, OTHER, SYSTEM, chat, kv

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


def attach(client, messages, cid) -> tuple[fe.Outcome, dict]:
    try:
        r = chat(client, messages, {"attach": cid, "mode": "full"}, max_tokens=2)
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


def run_case(case: str, client, server) -> tuple[fe.Outcome, dict]:
    ring = Keyring(server.home / "keys")
    if case == "made_up":
        return attach(client, [SYSTEM, FOLLOW_UP], "ab" * 32)
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
        return attach(client, messages, cid)
    if case == "shared":
        return attach(client, messages, resigned(server, cid, domain=fe.OTHER, share=[fe.DOMAIN]))
    if case == "foreign":
        return attach(client, messages, resigned(server, cid, domain=fe.OTHER))
    if case == "stale":
        with open_store(server.store_url) as store:
            store.in_domain(fe.DOMAIN).invalidate(cid, reason="retracted")
        return attach(client, messages, cid)
    if case == "tampered":
        with open_store(server.store_url) as store:
            s = store.in_domain(fe.DOMAIN)
            where = f"{s.prefix}chunk:{s._load(cid)[2][-1][0]}"  # its last chunk: its own tokens only
            raw = bytearray(s._r.get(where))
            raw[len(raw) // 2] ^= 1
            s._r.set(where, bytes(raw))
        return attach(client, messages, cid)
    if case == "wrong_model":
        with open_store(server.store_url) as store:
            fp = Artifact.decode(store.in_domain(fe.DOMAIN).get(cid).data).header.fingerprint
        other = replace(fp, backend=EngineId.parse("transformers"))  # the same weights in another engine
        return attach(client, messages, resigned(server, cid, domain=fe.DOMAIN, fingerprint=other))
    if case == "wrong_prefix":
        return attach(client, OTHER, cid)
    if case == "kv_policy":
        ring.set_policy(fe.DOMAIN, {"kv": "sample", "samples": 4})
        try:
            return attach(client, messages, cid)
        finally:
            ring.set_policy(fe.DOMAIN, {"kv": "none"})
    raise AssertionError(case)


@pytest.mark.parametrize("case", fe.CASES)
def test_vllm_answers_every_case_as_every_front_end(client, vllm_server, case):
    got, body = run_case(case, client, vllm_server)
    want = fe.expected(case, checks_kv=False)
    assert got.comparable() == want.comparable(), (case, body)
    if case == "kv_policy":  # refused, naming the policy and the way out
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
