"""3 x 3: a commit published by each front-end (the library, a real `c2c serve`, a real `vllm serve`), attached by
each, in auto, full and text (#54): every receiver continues the commit's conversation (its question, the reply,
a follow-up), as a vLLM request must to load a commit.

All three serve SmolLM2-135M-Instruct in float32, in domain ``research``, over one Redis store and one keyring. Each
publisher commits the same conversation (the shared system turn and one question) through its own front-end, every
header made by ``c2c.commit.author.commit_of``. Same-engine pairs (the library and ``c2c serve`` run transformers;
vLLM and vLLM) take the cache where every check passes; every other pair gives the same record at every front-end:
the commit's text in ``auto``, the fingerprint named; ``FingerprintMismatchError`` in ``full``; text in ``text``.
"""

from __future__ import annotations

import uuid

import httpx
import pytest
from openai import APIStatusError, OpenAI

from c2c.errors import C2CError
from c2c.testing import front_ends as fe
from c2c.testing.server_process import ServeProcess, write_tokens
from c2c.trust.keys import Keyring

from vllm_helpers import DOMAIN, FOLLOW_UP, SYSTEM, chat, kv, model_dir

pytestmark = [pytest.mark.vllm, pytest.mark.slow, pytest.mark.redis]

FRONT_ENDS = ("library", "c2c serve", "vllm")
ENGINE = {"library": "transformers", "c2c serve": "transformers", "vllm": "vllm"}
TOKEN = "tok-matrix-0123456789abcdef"


@pytest.fixture(scope="module")
def world(vllm_server, tmp_path_factory):
    """(vLLM client, a c2c serve beside it on the same store and keyring, the library's runtime and keyring)."""
    from c2c.runtime import zoo

    root = tmp_path_factory.mktemp("matrix")
    tokens = write_tokens(root / "tokens.json", {"matrix": (TOKEN, DOMAIN)})
    serve = ServeProcess(vllm_server.home, "--model", str(model_dir()), "--dtype", "float32", "--store",
                         vllm_server.store_url, "--tokens", str(tokens), "--default-max-tokens", "4",
                         log_dir=root).start()
    rt = zoo.load(str(model_dir()), dtype="float32")
    client = OpenAI(base_url=vllm_server.base_url, api_key="unused", max_retries=0, timeout=300)
    yield client, serve, rt, Keyring(vllm_server.home / "keys"), vllm_server.store_url
    serve.stop()


def _question() -> dict:
    return {"role": "user", "content": f"Case {uuid.uuid4().hex[:8]}: summarize the incident in one sentence."}


def publish(world, who: str) -> tuple[str, list[dict]]:
    """(the commit, the messages that continue its conversation: the question, its reply and a follow-up)."""
    client, serve, rt, ring, store_url = world
    question, stream = _question(), f"mx-{uuid.uuid4().hex[:8]}"
    if who == "library":
        from c2c.artifact.prefix import SharedPrefix
        from c2c.flows.chain import publish as library_publish
        from c2c.store import open_store
        from c2c.team.agent import Agent, Team

        agent = Agent("librarian", rt, Team(shared=SharedPrefix.build(SYSTEM["content"]), domain=DOMAIN, keyring=ring))
        reply = agent.respond(question["content"], max_new_tokens=4).text
        with open_store(store_url) as store:
            return library_publish(store, agent), _continued(question, reply)
    if who == "c2c serve":
        body = {"model": model_dir().name, "messages": [SYSTEM, question], "max_tokens": 4,
                "c2c": {"publish": {"stream": stream}}}
        resp = httpx.post(serve.url("/v1/chat/completions"), json=body, timeout=120,
                          headers={"Authorization": f"Bearer {TOKEN}"})
        assert resp.status_code == 200, resp.text
        done = resp.json()
        return done["c2c"]["publish"]["commit"], _continued(question, done["choices"][0]["message"]["content"])
    r = chat(client, [SYSTEM, question], {"publish": {"stream": stream}}, max_tokens=4)
    pub = kv(r)["publish"]
    assert "commit" in pub, pub
    return pub["commit"], _continued(question, r.choices[0].message.content)


def _continued(question: dict, reply: str) -> list[dict]:
    return [SYSTEM, question, {"role": "assistant", "content": reply}, FOLLOW_UP]


def attach(world, who: str, cid: str, messages: list[dict], mode: str) -> tuple[fe.Outcome, dict]:
    client, serve, rt, ring, store_url = world
    if who == "library":
        from c2c.artifact.prefix import SharedPrefix
        from c2c.flows.chain import pull
        from c2c.store import open_store
        from c2c.team.agent import Agent, Team

        agent = Agent("reader", rt, Team(shared=SharedPrefix.build(SYSTEM["content"]), domain=DOMAIN, keyring=ring))
        with open_store(store_url) as store:
            try:
                got = pull(store, cid, agent, mode=mode)
            except C2CError as e:
                return fe.of_error(e), {"error": str(e)}
        return fe.of_record(got.record), got.record
    if who == "c2c serve":
        body = {"model": model_dir().name, "messages": messages, "max_tokens": 2,
                "c2c": {"attach": [cid], "mode": mode}}
        resp = httpx.post(serve.url("/v1/chat/completions"), json=body, timeout=120,
                          headers={"Authorization": f"Bearer {TOKEN}"})
        if resp.status_code != 200:
            return fe.of_body(resp.status_code, resp.json()), resp.json()
        return fe.of_record(resp.json()["c2c"]["attach"][0]), resp.json()["c2c"]["attach"][0]
    try:
        r = chat(client, messages, {"attach": cid, "mode": mode}, max_tokens=2)
    except APIStatusError as e:
        return fe.of_body(e.status_code, {"error": e.body}), {"error": e.body}
    return fe.of_record(kv(r)["attach"]), kv(r)["attach"]


def expected(publisher: str, receiver: str, mode: str) -> fe.Outcome:
    if ENGINE[publisher] == ENGINE[receiver]:
        return fe.expected("own", checks_kv=True, mode=mode)
    return fe.expected("wrong_model", checks_kv=True, mode=mode)


@pytest.mark.parametrize("publisher", FRONT_ENDS)
def test_a_commit_of_every_front_end_reads_the_same_at_every_front_end(world, publisher):
    cid, messages = publish(world, publisher)
    got, want = {}, {}
    for receiver in FRONT_ENDS:
        for mode in fe.MODES:
            outcome, body = attach(world, receiver, cid, messages, mode)
            got[receiver, mode] = (outcome.comparable(), body)
            want[receiver, mode] = expected(publisher, receiver, mode).comparable()
    wrong = {k: got[k] for k in got if got[k][0] != want[k]}
    assert not wrong, (publisher, wrong)
