"""C2CConnector in a real ``vllm serve``, driven by the real ``openai`` client over loopback.

One server for the session (SmolLM2-135M, float32, prefix caching off so that every
cached token is one the connector imported), its store a real redis-server.
"""

from __future__ import annotations

import pytest
from openai import OpenAI

from c2c.artifact import Artifact
from c2c.artifact.fingerprint import Fingerprint
from c2c.handoff import HandoffPolicy, Party, decide
from c2c.handoff.cross_engine import CrossEnginePolicy, EngineFidelity, enforce
from c2c.store import open_store
from c2c.trust.keys import Keyring, SigningKey
from c2c.trust.signing import load_signed, sign

from vllm_helpers import FOLLOW_UP, OTHER, QUESTION, SYSTEM, cached, chat, kv, refused

pytestmark = [pytest.mark.vllm, pytest.mark.slow, pytest.mark.redis]


@pytest.fixture(scope="module")
def client(vllm_server):
    return OpenAI(base_url=vllm_server.base_url, api_key="unused", max_retries=0, timeout=300)


@pytest.fixture(scope="module")
def published(client):
    """An analyst's answer, published on stream ``analyst``: (response, commit)."""
    r = chat(client, [SYSTEM, QUESTION], {"publish": {"stream": "analyst"}}, max_tokens=24)
    return r, kv(r)["publish"]


def continuing(published) -> list[dict]:
    r, _ = published
    return [SYSTEM, QUESTION, {"role": "assistant", "content": r.choices[0].message.content}, FOLLOW_UP]


def test_publish_commits_a_signed_cache_of_prompt_and_answer(published, vllm_server):
    r, pub = published
    assert "error" not in pub, pub
    assert pub["stream"] == "analyst" and pub["version"] >= 1 and pub["signed_by"]["domain"] == "research"
    prompt_ids, answer_ids = r.prompt_token_ids, r.choices[0].token_ids
    assert pub["tokens"] == len(prompt_ids) + len(answer_ids) - 1  # the last token's K/V is never computed
    store = open_store(vllm_server.store_url).in_domain("research")
    try:
        rec = store.get(pub["commit"])
    finally:
        store.close()
    artifact, signer = load_signed(rec.data, Keyring(vllm_server.home / "keys"), domain="research")
    h = artifact.header
    assert signer.domain == "research" and h.kind == "full" and h.producer["engine"] == "vllm"
    assert list(h.tokens) == (prompt_ids + answer_ids)[:pub["tokens"]]
    fp = h.fingerprint
    assert str(fp.backend).startswith("vllm 0.32.0 cpu_attn:") and fp.dtype == "float32"
    assert fp.backend.kind == "vllm" and fp.backend.version == "0.32.0"
    assert (fp.architecture, fp.num_layers, fp.kv_heads, fp.head_dim) == ("llama", 30, 3, 64)



def read_commit(server, commit: str) -> Artifact:
    """A commit the instance published, read back from its store (domain ``research``)."""
    store = open_store(server.store_url).in_domain("research")
    try:
        return Artifact.decode(store.get(commit).data)
    finally:
        store.close()


@pytest.mark.zoo
def test_published_kv_are_the_models_kv_as_transformers_computes_them(published, vllm_server, zoo_model):
    """The paged layout is read right: vLLM's K/V equal c2c's transformers runtime's, same weights, fp32."""
    _, pub = published
    ours = read_commit(vllm_server, pub["commit"])
    rt = zoo_model("SmolLM2-135M-Instruct", dtype="float32")
    _, theirs = rt.prefill(list(ours.header.tokens))
    assert ours.header.fingerprint.weights_digest == rt.weights_digest  # the same files, digested alike
    for i in range(theirs.num_layers):
        for a, b in ((ours.cache.keys[i], theirs.keys[i]), (ours.cache.values[i], theirs.values[i])):
            assert a.shape == b.shape
            assert ((a - b).norm() / b.norm()).item() < 1e-3, i


@pytest.mark.zoo
def test_a_vllm_commit_reaches_transformers_only_by_the_cross_engine_opt_in(published, vllm_server, zoo_model):
    """The two fingerprints differ in the engine only; decide() refuses that by default, and with the opt-in
    the sampled check it forces passes on the K/V vLLM wrote."""
    _, pub = published
    art = read_commit(vllm_server, pub["commit"])
    rt = zoo_model("SmolLM2-135M-Instruct", dtype="float32")
    fp = Fingerprint.of(rt)
    assert set(art.header.fingerprint.diff(fp)) == {"backend"}  # tokenizer and weights digested alike
    sender = Party(name="vllm", domain="research", fingerprint=art.header.fingerprint, prefix=art.header.prefix)
    receiver = Party(name="tf", domain="research", fingerprint=fp, prefix=art.header.prefix)
    assert decide(sender, receiver).path == "text"
    fidelity = EngineFidelity(engines=("transformers", "vllm"), dtype="float32", prompts=1, rel_kv_median=1e-6,
                              rel_kv_max=1e-6, top1_agreement=1.0, exact_match=1.0, weights_digest=rt.weights_digest)
    d = decide(sender, receiver, HandoffPolicy(cross_engine=CrossEnginePolicy(fidelity=fidelity)))
    assert (d.path, d.verify) == ("cache", "sample")
    report = enforce(d, art, rt)
    assert report["mode"] == "sample" and report["layers"] == "all" and report["max_error"] <= report["tolerance"]


def test_attach_imports_the_commit_and_prefills_only_the_rest(client, published):
    _, pub = published
    messages = continuing(published)
    plain = chat(client, messages)
    assert cached(plain) == 0
    for mode in ("auto", "full"):
        r = chat(client, messages, {"attach": pub["commit"], "mode": mode})
        rec = kv(r)["attach"]
        assert rec["path"] == "cache", rec
        assert rec["imported_tokens"] == pub["tokens"] == rec["tokens"] == cached(r) and rec["used"] == "full"
        assert rec["prefilled_tokens"] == rec["reused_tokens"] == 0            # of the commit's tokens, as c2c serve
        assert kv(r)["prefilled_tokens"] == r.usage.prompt_tokens - pub["tokens"]   # of the whole prompt
        assert [c["name"] for c in rec["checks"] if c["ok"] is False] == []
        assert r.choices[0].token_ids == plain.choices[0].token_ids  # the imported K/V change no token


def test_refused_attach_in_auto_is_an_ordinary_prefill_with_the_reason(client, published):
    _, pub = published
    plain = chat(client, OTHER)
    r = chat(client, OTHER, {"attach": pub["commit"], "mode": "auto"})
    rec = kv(r)["attach"]
    assert rec["path"] == "text" and "prefix" in rec["reason"] and rec["imported_tokens"] == 0
    assert [c["name"] for c in rec["checks"] if c["ok"] is False] == ["prefix"]
    assert cached(r) == 0 and r.choices[0].token_ids == plain.choices[0].token_ids


def test_refused_attach_in_full_is_an_error_with_the_c2c_type(client, published):
    _, pub = published
    e = refused(client, OTHER, {"attach": pub["commit"], "mode": "full"})
    assert e.status_code == 409
    assert e.body["c2c_error"] == "PrefixMismatchError" and e.body["code"] == "incompatible_cache"


def test_a_partly_shared_prompt_loads_the_longest_common_blocks(client, published):
    _, pub = published
    r = chat(client, [SYSTEM, {"role": "user", "content": "List the zones that failed."}],
             {"attach": pub["commit"], "mode": "auto"})
    rec = kv(r)["attach"]
    assert rec["path"] == "cache" and 0 < rec["matched_tokens"] < pub["tokens"] and rec["matched_tokens"] % 16 == 0
    assert cached(r) == rec["imported_tokens"] == rec["matched_tokens"]
    e = refused(client, [SYSTEM, {"role": "user", "content": "List the zones that failed."}],
                {"attach": pub["commit"], "mode": "full"})
    assert e.status_code == 409 and e.body["c2c_error"] == "PrefixMismatchError"


def test_bad_ids_are_clear_errors_and_the_engine_keeps_serving(client, published, vllm_server):
    r, pub = published
    e = refused(client, OTHER, {"attach": "not-a-commit", "mode": "auto"})
    assert e.status_code == 400 and e.body["c2c_error"] == "ConfigError"
    e = refused(client, OTHER, {"attach": "0" * 64, "mode": "auto"})
    assert e.status_code == 403 and e.body["c2c_error"] == "CommitNotVisibleError"
    e = refused(client, OTHER, {"attach": pub["commit"], "mode": "sideways"})
    assert e.status_code == 400 and "mode" in e.body["message"]
    # another domain's commit (not shared with research), and one signed by a key research does not trust
    store = open_store(vllm_server.store_url)
    try:
        original = Artifact.decode(store.in_domain("research").get(pub["commit"]).data)
        ops = Artifact.build(original.cache, fingerprint=original.header.fingerprint, prefix=original.header.prefix,
                             producer={"agent": "ops-bot"})
        foreign = store.in_domain("ops").put(sign(ops, SigningKey.generate("ops")).encode(), stream="ops")
        rogue = Artifact.build(original.cache, fingerprint=original.header.fingerprint, prefix=original.header.prefix,
                               producer={"agent": "rogue"})
        untrusted = store.in_domain("research").put(sign(rogue, SigningKey.generate("research")).encode(),
                                                    stream="rogue")
    finally:
        store.close()
    for mode in ("auto", "full"):
        e = refused(client, continuing(published), {"attach": foreign.id, "mode": mode})
        assert e.status_code == 403 and e.body["c2c_error"] == "CommitNotVisibleError"
        e = refused(client, continuing(published), {"attach": untrusted.id, "mode": mode})
        assert e.status_code == 422 and e.body["c2c_error"] == "UnknownSignerError"
    again = chat(client, [SYSTEM, QUESTION], max_tokens=24)
    assert again.choices[0].token_ids == r.choices[0].token_ids


def test_a_stale_commit_is_prefilled_in_auto_and_refused_in_full(client, vllm_server):
    r = chat(client, [SYSTEM, QUESTION], {"publish": {"stream": "stale-test"}}, max_tokens=8)
    pub = kv(r)["publish"]
    store = open_store(vllm_server.store_url).in_domain("research")
    try:
        store.invalidate(pub["commit"], reason="the logs were wrong")
    finally:
        store.close()
    messages = [SYSTEM, QUESTION, {"role": "assistant", "content": r.choices[0].message.content}, FOLLOW_UP]
    a = chat(client, messages, {"attach": pub["commit"], "mode": "auto"})
    rec = kv(a)["attach"]
    assert rec["path"] == "text" and rec["stale"] is True and cached(a) == 0
    assert [c["name"] for c in rec["checks"] if c["ok"] is False] == ["staleness"]
    e = refused(client, messages, {"attach": pub["commit"], "mode": "full"})
    assert e.status_code == 409 and e.body["c2c_error"] == "StaleCommitError"

