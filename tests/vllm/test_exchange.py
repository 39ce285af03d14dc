"""The connector's exchanges with the store, without vLLM: parsing, attach rulings, publish tickets, error replies."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from c2c.errors import ConfigError
from c2c.runtime.kvcache import KVCache
from c2c.artifact.codec import Artifact
from c2c.vllm import staging, tickets
from c2c.vllm.connector_config import ConnectorConfig
from c2c.vllm.commits import Attacher, Publisher, Request
from c2c.vllm.api_middleware import error_response, native_refusal
from c2c.store import open_store
from c2c.runtime.facts import EngineId
from c2c.testing.synthetic import synthetic_fingerprint
from c2c.trust.keys import Keyring

from vllm_helpers import tamper_chunk

FP = replace(synthetic_fingerprint(), backend=EngineId.parse("vllm 0.32.0 cpu_attn:vec k:DxB v:BxD block:128"))
TOKENS = tuple(range(1000, 1040))   # 40 tokens: two whole 16-token blocks and 8 more


def cache_of(tokens) -> KVCache:
    g = torch.Generator().manual_seed(len(tokens))
    shape = (1, 2, len(tokens), 8)
    return KVCache(keys=tuple(torch.randn(shape, generator=g) for _ in range(2)),
                   values=tuple(torch.randn(shape, generator=g) for _ in range(2)), token_ids=tuple(tokens))


@pytest.fixture
def world(tmp_path):
    """(publisher, attacher factory, store url, keyring) over one SQLite store, domain ``research``."""
    url, keyring = f"sqlite:///{tmp_path}/store", Keyring(tmp_path / "keys")
    for d in ("staging", "tickets"):
        (tmp_path / d).mkdir()
    pub = Publisher(store_url=url, domain="research", keyring=keyring, fingerprint=FP, run_dir=tmp_path)

    def attacher(**kw):
        args = dict(store_url=url, domain="research", keyring=keyring, fingerprint=FP, staging=tmp_path / "staging")
        return Attacher(**{**args, **kw})

    yield pub, attacher, url, keyring, tmp_path
    pub.close()


def publish(pub, root, tokens=TOKENS, **kw):
    ticket = tickets.new_ticket()
    out = pub.publish(cache_of(tokens), ticket=ticket, stream=kw.pop("stream", "analyst"), **kw)
    assert tickets.collect(root, ticket, timeout_s=1) == out
    return out


def test_request_parse_reads_the_c2c_field_and_refuses_bad_shapes():
    assert Request.parse(None) is None and Request.parse({"other": 1}) is None
    r = Request.parse({"c2c": {"attach": "a" * 64, "mode": "full", "publish": {"stream": "s", "parents": ["b" * 64]}}})
    assert (r.attach, r.mode, r.publish, r.stream, r.parents) == ("a" * 64, "full", True, "s", ("b" * 64,))
    assert Request.parse({"c2c": {"publish": True}}).publish
    for bad in ({"c2c": {"attach": "xyz"}}, {"c2c": {"mode": "slice"}}, {"c2c": {"publish": {"stream": "a b"}}},
                {"c2c": {"what": 1}}, {"c2c": "attach"}, {"c2c": {"publish": {"parents": "a" * 64}}}):
        with pytest.raises(ConfigError):
            Request.parse(bad)


def test_connector_config_refuses_unknown_keys_and_values():
    assert ConnectorConfig.from_extra({"store": "redis://x", "domain": "ops"}).domain == "ops"
    for bad in ({"stor": "x"}, {"domain": "a b"}, {"prefix": "some"}, {"max_hops": -1}):
        with pytest.raises(ConfigError):
            ConnectorConfig.from_extra(bad)


def test_publish_signs_and_commits_and_an_exact_prompt_attaches(world):
    pub, attacher, url, keyring, root = world
    out = publish(pub, root)
    assert out["tokens"] == 40 and out["version"] == 1 and out["signed_by"]["domain"] == "research"
    v = attacher().admit(out["commit"], "full", list(TOKENS) + [7, 8, 9], request_id="r1")
    assert v.error is None and v.load_tokens == 40 and v.record["path"] == "cache"
    # staged: the verified commit's K/V of the positions the request may load, read back without a second hash
    stored = Artifact.decode(open_store(url).in_domain("research").get(out["commit"]).data).cache
    with pytest.raises(ConfigError, match="not the commit"):
        staging.unstage(v.staged, "f" * 64, layers=2, end=40)  # a wrong id is refused (and the file is gone)
    v = attacher().admit(out["commit"], "full", list(TOKENS) + [7, 8, 9], request_id="r1")
    keys, values = staging.unstage(v.staged, out["commit"], layers=2, end=40)
    assert all(torch.equal(k, sk) and torch.equal(x, sv) for k, x, sk, sv in
               zip(keys, values, stored.keys, stored.values))
    with pytest.raises(ConfigError, match="gone"):
        staging.unstage(v.staged, out["commit"], layers=2, end=40)
    staging.stage(root / "short.kv", out["commit"], stored, 16)
    with pytest.raises(ConfigError, match="positions up to 40"):
        staging.unstage(root / "short.kv", out["commit"], layers=2, end=40)
    (root / "junk.kv").write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{not json")
    with pytest.raises(ConfigError, match="unreadable"):
        staging.unstage(root / "junk.kv", out["commit"], layers=2, end=40)


def test_auto_loads_the_longest_shared_run_of_blocks_and_full_refuses_it(world):
    pub, attacher, _, _, root = world
    cid = publish(pub, root)["commit"]
    prompt = list(TOKENS[:37]) + [5, 5, 5, 5]                  # differs from token 37 on
    v = attacher().admit(cid, "auto", prompt)
    assert v.load_tokens == 32 and v.record["matched_tokens"] == 32 and v.record["commit_tokens"] == 40
    assert attacher(prefix_policy="exact").admit(cid, "auto", prompt).record["path"] == "text"
    v = attacher().admit(cid, "full", prompt)
    assert v.error["type"] == "PrefixMismatchError" and v.load_tokens == 0
    v = attacher().admit(cid, "auto", [1, 2, 3] + list(TOKENS))   # nothing shared: a prefill, with the reason
    assert v.error is None and v.load_tokens == 0 and "prefix" in v.record["reason"]


def test_other_engines_stale_commits_and_the_hop_limit_are_refusals(world):
    pub, attacher, url, keyring, root = world
    cid = publish(pub, root)["commit"]
    other = attacher(fingerprint=replace(FP, backend=EngineId.parse("transformers")))
    assert other.admit(cid, "auto", list(TOKENS) + [1]).record["path"] == "text"
    assert other.admit(cid, "full", list(TOKENS) + [1]).error["type"] == "FingerprintMismatchError"
    assert attacher(max_hops=0).admit(cid, "full", list(TOKENS) + [1]).error["type"] == "HandoffError"
    open_store(url).in_domain("research").invalidate(cid, reason="wrong logs")
    v = attacher().admit(cid, "auto", list(TOKENS) + [1])
    assert v.record["path"] == "text" and v.record["stale"] and v.load_tokens == 0
    assert attacher().admit(cid, "full", list(TOKENS) + [1]).error["type"] == "StaleCommitError"


def test_invisible_or_untrusted_commits_are_errors_in_every_mode(world):
    pub, attacher, url, keyring, root = world
    ops = Publisher(store_url=url, domain="ops", keyring=keyring, fingerprint=FP, run_dir=root)
    foreign = publish(ops, root, stream="ops")["commit"]
    ops.close()
    # a keyring of its own makes its own research key, which research's keyring never trusted
    rogue = Publisher(store_url=url, domain="research", keyring=Keyring(root / "other-keys"), fingerprint=FP,
                      run_dir=root)
    untrusted = publish(rogue, root, tokens=TOKENS[:20], stream="rogue")["commit"]
    rogue.close()
    for mode in ("auto", "full"):
        assert attacher().admit(foreign, mode, list(TOKENS)).error["type"] == "CommitNotVisibleError"
        assert attacher().admit("f" * 64, mode, list(TOKENS)).error["type"] == "CommitNotVisibleError"
        assert attacher().admit(untrusted, mode, list(TOKENS)).error["type"] == "UnknownSignerError"
        assert attacher().admit("nope", mode, list(TOKENS)).error["type"] == "ConfigError"


def test_a_tampered_chunk_is_an_error_in_every_mode_and_a_store_outage_a_prefill_in_auto(world):
    """Damaged stored bytes are reported (c2c serve's 422 ``store_corrupt``) in ``auto`` too, never prefilled over
    in silence; a store that is down is still an ordinary prefill in ``auto``, with the reason."""
    pub, attacher, url, _, root = world
    cid = publish(pub, root)["commit"]
    with open_store(url) as store:
        tamper_chunk(store.in_domain("research"), cid)
    for mode in ("auto", "full"):
        v = attacher().admit(cid, mode, list(TOKENS) + [1])
        assert v.error is not None and v.error["type"] == "ChunkCorruptError", (mode, v.record)
        assert v.staged is None and v.load_tokens == 0 and v.record["path"] == "error"
        status, body = error_response(v.error)
        assert (status, body["error"]["code"], body["error"]["c2c_error"]) == (422, "store_corrupt",
                                                                               "ChunkCorruptError")
    down = attacher(store_url="redis://127.0.0.1:1/0")   # nothing listens there
    v = down.admit(cid, "auto", list(TOKENS) + [1])
    assert v.error is None and v.record["path"] == "text" and "StoreError" in v.record["reason"]
    assert down.admit(cid, "full", list(TOKENS) + [1]).error["type"] == "StoreError"


def test_an_attached_parent_is_recorded_and_counts_a_hop(world):
    pub, attacher, url, _, root = world
    first = publish(pub, root)["commit"]
    second = publish(pub, root, tokens=TOKENS + (1, 2), parents=[first, "e" * 64])
    assert second["parents"] == [first] and second["shared_parents"] == ["e" * 64]
    assert attacher().admit(second["commit"], "full", list(TOKENS) + [1, 2, 3]).record["hops"] == 2


def test_tickets_time_out_and_sweep(tmp_path):
    for d in ("staging", "tickets"):
        (tmp_path / d).mkdir()
    t = tickets.new_ticket()
    assert tickets.collect(tmp_path, t, timeout_s=0.05) is None
    tickets.settle(tmp_path, t, {"commit": "c"})
    assert tickets.sweep(tmp_path, older_than_s=-1) == 1
    with pytest.raises(ConfigError):
        tickets.collect(tmp_path, "../../etc/passwd", timeout_s=0)


def test_error_replies_take_c2c_serves_status_and_shape():
    status, body = error_response({"type": "PrefixMismatchError", "message": "differs"})
    assert status == 409 and body["error"]["c2c_error"] == "PrefixMismatchError"
    assert body["error"]["code"] == "incompatible_cache" and body["error"]["type"] == "invalid_request_error"
    assert error_response({"type": "CommitNotVisibleError", "message": ""})[0] == 403
    assert error_response({"type": "UnknownSignerError", "message": ""})[0] == 422
    status, body = error_response({"type": "NotAClass", "message": "x"})
    assert status == 500 and body["error"]["c2c_error"] is None


def test_vllms_unknown_model_refusal_takes_c2c_serves_shape_and_nothing_else_does():
    vllm_404 = {"error": {"message": "The model `nope` does not exist. Valid aliases: smol.", "type": "NotFoundError",
                          "param": "model", "code": 404}}
    status, body = native_refusal(404, vllm_404)
    assert status == 404 and body == {"error": {"message": vllm_404["error"]["message"], "type": "not_found_error",
                                                "code": "model_not_found", "param": None,
                                                "c2c_error": "UnknownModelError"}}
    bad_request = {"error": {"message": "temperature", "type": "BadRequestError", "param": "temperature", "code": 400}}
    for other in ((400, bad_request), (404, {"error": {**vllm_404["error"], "param": ["model"]}}),
                  (404, body), (401, {"error": "Unauthorized"}), (200, [1, 2]), (404, {"object": "list"})):
        assert native_refusal(*other) is None, other     # passes as vLLM (or c2c) made it


def test_an_edited_commit_is_refused_by_name_and_prefilled_in_auto(world):
    """vLLM's prefix cache would hand an edited commit's approximate K/V to later requests as exact."""
    from c2c.runtime.kvcache import EditStep, Edits

    pub, attacher, _, _, root = world
    edited = replace(cache_of(TOKENS), edits=Edits(steps=(EditStep(dropped=((16, 30),), repositioned=24),)))
    cid = pub.publish(edited, ticket=tickets.new_ticket(), stream="edited")["commit"]
    prompt = list(TOKENS) + [1]
    v = attacher().admit(cid, "auto", prompt)
    assert v.error is None and v.load_tokens == 0 and v.record["path"] == "text"
    assert "EditedCacheError" in v.record["reason"] and "prefix cache" in v.record["reason"]
    v = attacher().admit(cid, "full", prompt)
    assert v.error["type"] == "EditedCacheError" and v.load_tokens == 0
    exact = publish(pub, root, stream="exact")["commit"]        # the same tokens, unedited: loaded
    assert attacher().admit(exact, "auto", prompt).load_tokens == 40
