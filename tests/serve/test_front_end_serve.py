"""The front-ends' conformance cases (c2c.testing.front_ends) against a real `c2c serve`, through HTTP.

The same table runs against the library (tests/flows/test_front_end_library.py) and a real
`vllm serve` with the connector (tests/vllm/test_front_end_vllm.py). The server is the shared
tiny one: each case uses streams and sessions of its own and puts back what it changed (a
quota, a policy).
"""

from __future__ import annotations

import uuid
from dataclasses import replace

import httpx
import pytest

from serve_helpers import SYSTEM, c2c_field, chat

from c2c.artifact import Artifact
from c2c.artifact.fingerprint import Fingerprint
from c2c.artifact.prefix import PrefixRef
from c2c.store import open_store
from c2c.testing import front_ends as fe
from c2c.trust.keys import Keyring
from c2c.trust.signing import sign

QUESTION = {"role": "user", "content": "When did the outage begin?"}


def publish(server, agent: str, *, share=(), system=SYSTEM) -> str:
    tag = uuid.uuid4().hex[:8]
    evidence = {"role": "user", "name": "evidence", "content": f"Evidence {tag}: the outage began at 09:14."}
    rec = c2c_field(chat(server.client(agent), [system, evidence], max_tokens=4,
                         c2c={"session": f"fe-{tag}", "publish": {"stream": f"fe-{tag}", "share": list(share)}}))
    return rec["publish"]["commit"]


def attach(server, cid: str, *, system=SYSTEM, mode="full") -> tuple[fe.Outcome, dict]:
    body = {"model": "tiny-qwen2", "messages": [system, QUESTION], "max_tokens": 2,
            "c2c": {"attach": [cid], "mode": mode}}
    resp = httpx.post(server.url("/v1/chat/completions"), json=body, headers=server.headers("writer"), timeout=60)
    if resp.status_code != 200:
        return fe.of_body(resp.status_code, resp.json()), resp.json()
    return fe.of_record(resp.json()["c2c"]["attach"][0]), resp.json()


def research_store(server):
    return open_store(server.store_url() + f"?domain={fe.DOMAIN}")


def run_case(case: str, server, mode: str = "full") -> tuple[fe.Outcome, dict]:
    ring = Keyring(server.home / "keys")
    if case == "own":
        return attach(server, publish(server, "analyst"), mode=mode)
    if case == "shared":
        return attach(server, publish(server, "outsider", share=[fe.DOMAIN]), mode=mode)
    if case == "foreign":
        return attach(server, publish(server, "outsider"), mode=mode)
    if case == "made_up":
        return attach(server, "ab" * 32, mode=mode)
    if case == "stale":
        cid = publish(server, "analyst")
        httpx.post(server.url(f"/v1/c2c/commits/{cid}/invalidate"), headers=server.headers("analyst"),
                   json={"reason": "retracted"}, timeout=30).raise_for_status()
        return attach(server, cid, mode=mode)
    if case == "tampered":
        cid = publish(server, "analyst")
        with research_store(server) as s:
            path = s._chunk_path(fe.DOMAIN, s._load(cid)[2][-1][0])  # its last chunk: its own tokens only
            raw = bytearray(path.read_bytes())
            raw[len(raw) // 2] ^= 1
            path.write_bytes(bytes(raw))
        return attach(server, cid, mode=mode)
    if case == "wrong_model":
        from c2c.runtime import zoo

        publish(server, "analyst")  # research's key exists
        # another model's commit, as the library publishes one (commit_of: its text kept)
        cid = _library_commit(server, zoo.load("tiny-llama"), SYSTEM["content"], "Evidence: the outage began at 09:14.")
        return attach(server, cid, mode=mode)
    if case == "wrong_prefix":
        return attach(server, publish(server, "analyst"), system={"role": "system", "content": "Another team."},
                      mode=mode)
    if case == "over_quota":
        with research_store(server) as s:
            s.set_quota(1)
            try:
                tag = uuid.uuid4().hex[:8]
                body = {"model": "tiny-qwen2", "max_tokens": 2, "messages": [SYSTEM, QUESTION],
                        "c2c": {"publish": {"stream": f"fe-{tag}"}}}
                resp = httpx.post(server.url("/v1/chat/completions"), json=body, headers=server.headers("analyst"),
                                  timeout=60)
            finally:
                s.set_quota(None)
        return fe.of_body(resp.status_code, resp.json()), resp.json()
    if case == "kv_policy":
        cid = publish(server, "analyst")
        ring.set_policy(fe.DOMAIN, {"kv": "sample", "samples": 4})
        try:
            return attach(server, cid, mode=mode)
        finally:
            ring.set_policy(fe.DOMAIN, {"kv": "none"})  # as the server's --verify-kv none
    raise AssertionError(case)


@pytest.mark.parametrize("case, mode", fe.CASE_MODES)
def test_c2c_serve_answers_every_case_as_every_front_end(tiny_server, case, mode):
    got, body = run_case(case, tiny_server, mode)
    want = fe.expected(case, checks_kv=True, mode=mode)
    assert got.comparable() == want.comparable(), (case, mode, body)
    if case == "kv_policy" and mode != "text":  # the domain's stored policy ran, though the server's --verify-kv is none
        assert got.kv == "sample" and body["c2c"]["attach"][0]["trust"]["kv"]["mode"] == "sample"


def test_an_id_another_domain_holds_reads_as_one_that_does_not_exist(tiny_server):
    _, a = run_case("foreign", tiny_server)
    _, b = run_case("made_up", tiny_server)
    ids = [x for x in (a["error"]["message"].split()[2], b["error"]["message"].split()[2])]
    assert fe.same_answer(a["error"]["message"], b["error"]["message"], *ids)


def test_a_commit_that_keeps_no_text_falls_back_to_its_own_tokens_in_auto(tiny_server):
    """Probe 3 / #54: a commit the library published keeps no text in its header; attached in auto where a check
    fails, it was a 409 ("not published by c2c serve"). It is read as text from its own tokens after its
    declared shared prefix (the sender's system turn never read out)."""
    from c2c.runtime import zoo
    from c2c.conversation.render import Message, render

    publish(tiny_server, "analyst")  # research's key exists
    rt = zoo.load("tiny-qwen2")
    secret_system = Message(role="system", content="Private: the analyst's instructions, never to be shared.")
    rendering = render(rt, [secret_system, Message(role="user", content="Evidence: the outage began at 09:14.")],
                       generation_prompt=False)
    _, cache = rt.prefill(list(rendering.token_ids))
    art = Artifact.build(cache, fingerprint=Fingerprint.of(rt), prefix=PrefixRef.of(rendering.prefix_ids),
                         producer={"agent": "analyst", "domain": fe.DOMAIN})
    with research_store(tiny_server) as s:
        cid = s.put(sign(art, Keyring(tiny_server.home / "keys").signing_key(fe.DOMAIN)).encode(),
                    stream=f"fe-{uuid.uuid4().hex[:8]}").id
    body = {"model": "tiny-qwen2", "messages": [SYSTEM, QUESTION], "max_tokens": 2,
            "c2c": {"attach": [cid], "mode": "auto"}}      # SYSTEM differs from the commit's: the prefix check fails
    resp = httpx.post(tiny_server.url("/v1/chat/completions"), json=body, headers=tiny_server.headers("writer"),
                      timeout=60)
    assert resp.status_code == 200, resp.text
    [rec] = resp.json()["c2c"]["attach"]
    assert rec["path"] == "text" and rec["used"] == "text" and rec["tokens"] > 0
    # the text read out (its bytes are the record's) is the evidence turn, never the longer system turn before it
    evidence, secret = "Evidence: the outage began at 09:14.", secret_system.content
    assert len(evidence) <= rec["bytes"] < len(secret)


def _library_commit(server, rt, system: str, evidence: str) -> str:
    """``evidence`` read by a library agent of domain research whose shared prefix is ``system``, committed
    through the library's front-end (:func:`c2c.flows.chain.publish`) into the server's store."""
    from c2c.artifact.prefix import SharedPrefix
    from c2c.flows.chain import publish as library_publish
    from c2c.team.agent import Agent, Team

    team = Team(shared=SharedPrefix.build(system), domain=fe.DOMAIN, keyring=Keyring(server.home / "keys"))
    agent = Agent("librarian", rt, team)
    agent.read(evidence)
    with open_store(server.store_url()) as store:
        return library_publish(store, agent)


def _vllm_commit(server, rt, tmp_path, system: str, evidence: str) -> str:
    """The same conversation as vLLM's connector commits it: its real Publisher, from the tokens alone, under the
    fingerprint of a vLLM instance of the same model (another engine)."""
    from c2c.runtime.facts import EngineId
    from c2c.vllm import tickets
    from c2c.vllm.commits import Publisher

    (tmp_path / "tickets").mkdir(exist_ok=True)
    ids = rt.encode(rt.render_chat([{"role": "system", "content": system}, {"role": "user", "content": evidence}]))
    _, cache = rt.prefill(ids)
    fp = replace(Fingerprint.of(rt), backend=EngineId.parse("vllm 0.32.0 cpu_attn:vec k:DxB v:BxD block:128"))
    pub = Publisher(store_url=server.store_url(), domain=fe.DOMAIN, keyring=Keyring(server.home / "keys"),
                    fingerprint=fp, run_dir=tmp_path, model_dir=rt.path)
    try:
        ticket = tickets.new_ticket()
        out = pub.publish(cache, ticket=ticket, stream=f"vllm-{uuid.uuid4().hex[:8]}")
    finally:
        pub.close()
    assert "commit" in out, out
    return out["commit"]


@pytest.mark.parametrize("author", ["library", "c2c serve", "vllm"])
def test_in_auto_a_commit_of_every_front_end_falls_back_to_its_text_when_a_check_fails(tiny_server, author,
                                                                                         tmp_path):
    """#54: whoever published it (one author, c2c.commit.author.commit_of), a commit attached through c2c serve in
    auto where a check fails is read as text: the text the commit keeps, never its sender's system turn, never a
    HandoffError. The check that fails: the shared prefix (another system turn), or for vLLM's commit the engine
    as well."""
    from c2c.runtime import zoo

    rt = zoo.load("tiny-qwen2")
    tag = uuid.uuid4().hex[:8]
    secret, evidence = f"Private instructions {tag}: never shared.", f"Evidence {tag}: the outage began at 09:14."
    if author == "library":
        cid = _library_commit(tiny_server, rt, secret, evidence)
    elif author == "vllm":
        cid = _vllm_commit(tiny_server, rt, tmp_path, secret, evidence)
    else:
        rec = c2c_field(chat(tiny_server.client("analyst"), [{"role": "system", "content": secret},
                                                             {"role": "user", "name": "evidence", "content": evidence}],
                             max_tokens=2, c2c={"session": f"fe-{tag}", "publish": {"stream": f"fe-{tag}"}}))
        cid = rec["publish"]["commit"]
    with research_store(tiny_server) as s:
        h = Artifact.decode(s.get(cid).data).header
    assert h.prefix.length > 0 and h.prefix.length < h.seq_len   # part 0: BOS + the system turn, at every author
    body = {"model": "tiny-qwen2", "messages": [SYSTEM, QUESTION], "max_tokens": 2,
            "c2c": {"attach": [cid], "mode": "auto"}}
    resp = httpx.post(tiny_server.url("/v1/chat/completions"), json=body, headers=tiny_server.headers("writer"),
                      timeout=60)
    assert resp.status_code == 200, resp.text
    [rec] = resp.json()["c2c"]["attach"]
    assert (rec["path"], rec["used"]) == ("text", "text") and rec["tokens"] > 0
    failed = {c["name"] for c in rec["checks"] if c["ok"] is False}
    assert "prefix" in failed and ("fingerprint" in failed) == (author == "vllm")
    # the text read out is the evidence (its bytes are the record's), never the sender's system turn
    assert len(evidence) <= rec["bytes"] < len(evidence) + len(secret)
    full = dict(body, c2c={"attach": [cid], "mode": "full"})
    refused = httpx.post(tiny_server.url("/v1/chat/completions"), json=full, headers=tiny_server.headers("writer"),
                         timeout=60)
    assert refused.status_code == 409 and refused.json()["error"]["code"] == "incompatible_cache"
