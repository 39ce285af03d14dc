"""Cross-engine attach (c2c.handoff.cross_engine): refused by default, allowed by opt-in, always verified first.

A vLLM cache is a fingerprint that differs from the receiver's in the engine only (``backend``); through the
store, vLLM's real publisher commits a tiny model's own K/V under such a fingerprint.
"""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from c2c.artifact import Artifact
from c2c.artifact.prefix import PrefixRef, SharedPrefix
from c2c.errors import ConfigError, FingerprintMismatchError, VerificationFailedError
from c2c.handoff import HandoffPolicy, Party, decide, fall_back
from c2c.handoff.cross_engine import CrossEnginePolicy, EngineFidelity
from c2c.runtime.facts import EngineId
from c2c.testing.synthetic import synthetic_fingerprint

FP = synthetic_fingerprint()                                  # transformers (the default engine)
VLLM = EngineId.parse("vllm 0.32.0 cpu_attn:vec k:DxB v:BxD block:128")
PREFIX = PrefixRef.of(list(range(40)))
FIDELITY = EngineFidelity(engines=("vllm", "transformers"), dtype="float32", prompts=64, rel_kv_median=2e-6,
                          rel_kv_max=3e-6, top1_agreement=1.0, exact_match=1.0, model="synthetic")
OPT_IN = HandoffPolicy(cross_engine=CrossEnginePolicy(fidelity=FIDELITY))


def party(name="a", fingerprint=FP, **kw):
    return Party(name=name, domain="lab", fingerprint=fingerprint, prefix=PREFIX, **kw)


def from_vllm(policy=HandoffPolicy(), **fp):
    return decide(party("vllm", replace(FP, backend=VLLM, **fp)), party("b", replace(FP, **fp)), policy)


def test_by_default_a_cache_of_another_engine_is_refused_naming_the_engines_and_the_opt_in():
    d = from_vllm()
    assert d.path == "text" and d.check("fingerprint").ok is False and d.verify is None
    assert "vllm made the cache, transformers would attach it" in d.reason and "cross_engine=" in d.reason
    explicit = from_vllm(HandoffPolicy(mode="full"))
    assert isinstance(explicit.refusal(), FingerprintMismatchError) and "cross_engine=" in str(explicit.refusal())


@pytest.mark.parametrize("mode", ["auto", "full"])
def test_the_opt_in_takes_the_cache_forcing_a_sampled_check_and_recording_the_fidelity(mode):
    d = from_vllm(replace(OPT_IN, mode=mode))
    assert (d.path, d.refusal(), d.verify) == ("cache", None, "sample")
    assert d.fidelity == FIDELITY.to_dict() and d.to_dict()["fidelity"]["prompts"] == 64
    assert d.check("fingerprint").ok and "allowed by the cross-engine policy" in d.check("fingerprint").detail
    assert "sample K/V check before attaching" in d.reason
    back = decide(party("tf"), party("vllm", replace(FP, backend=VLLM)), OPT_IN)  # transformers -> vLLM
    assert back.path == "cache" and back.verify == "sample"
    strict = replace(OPT_IN, cross_engine=CrossEnginePolicy(fidelity=FIDELITY, verify="strict"))
    assert from_vllm(strict).verify == "strict"
    assert fall_back(d, HandoffPolicy(), VerificationFailedError("x")).verify is None


@pytest.mark.parametrize("change, policy, why", [
    (dict(dtype="bfloat16"), OPT_IN, "measured in float32, not bfloat16"),
    (dict(), HandoffPolicy(cross_engine=CrossEnginePolicy(fidelity=replace(FIDELITY, weights_digest="9" * 64))),
     "measured on other weights"),
    (dict(), HandoffPolicy(cross_engine=CrossEnginePolicy(fidelity=replace(FIDELITY, engines=("llama.cpp", "vllm")))),
     "measured for ('llama.cpp', 'vllm')"),
])
def test_the_opt_in_holds_only_for_the_pair_dtype_and_weights_measured(change, policy, why):
    d = from_vllm(policy, **change)
    assert d.path == "text" and why in d.check("fingerprint").detail
    assert isinstance(from_vllm(replace(policy, mode="full"), **change).refusal(), FingerprintMismatchError)


@pytest.mark.parametrize("theirs", [
    dict(backend=VLLM, weights_digest="3" * 64),        # other weights
    dict(backend=VLLM, dtype="bfloat16"),               # other dtype (the receiver's is float32)
    dict(backend=VLLM, head_dim=16),                    # other shapes
    dict(backend=EngineId.parse("transformers 5.24.0 numerics:torch-2.13.0+cpu/cpu-intel-amx/linear-onednn-packed")),
])
def test_more_than_the_engine_or_the_same_engine_elsewhere_is_refused_as_before(theirs):
    d = decide(party("s", replace(FP, **theirs)), party("b"), OPT_IN)
    assert d.path == "text" and d.verify is None and "cross-engine" not in d.check("fingerprint").detail


def test_the_policy_and_the_record_are_validated_and_read_from_the_benchmark(tmp_path):
    with pytest.raises(ConfigError, match="CrossEnginePolicy"):
        HandoffPolicy(cross_engine={"fidelity": FIDELITY.to_dict()})
    with pytest.raises(ConfigError, match="verify"):
        CrossEnginePolicy(fidelity=FIDELITY, verify="none")
    with pytest.raises(ConfigError, match="engines"):
        replace(FIDELITY, engines=("vllm", "vllm"))
    with pytest.raises(ConfigError, match="top1_agreement"):
        replace(FIDELITY, top1_agreement=1.5)
    assert FIDELITY.engines == ("transformers", "vllm") and EngineFidelity.from_dict(FIDELITY.to_dict()) == FIDELITY
    results = tmp_path / "vllm_fidelity.json"
    results.write_text(json.dumps({"model": "Qwen2.5-Coder-0.5B-Instruct", "dtypes": {"bfloat16": {
        "weights_digest": "2" * 64, "summary": {"prompts": 64, "rel_kv_median": 0.01, "rel_kv_max": 0.05,
                                                "top1_own": 0.97, "exact_own": 0.8}}}}))
    f = EngineFidelity.from_results(results)
    assert (f.dtype, f.prompts, f.top1_agreement, f.source) == ("bfloat16", 64, 0.97,
                                                                "benchmarks/results/vllm_fidelity.json")
    with pytest.raises(ConfigError, match="no float32 run"):
        EngineFidelity.from_results(results, dtype="float32")


# ------------------------------------------------------------------ through the store
@pytest.fixture
def lab(tiny, tmp_path):
    """A tiny model's team whose domain checks signatures only (kv "none"), an analyst with context, a store."""
    from c2c.store import open_store
    from c2c.team.agent import Agent, Team
    from c2c.trust.keys import Keyring

    ring = Keyring(tmp_path / "keys")
    ring.create_key("lab")
    ring.set_policy("lab", {"kv": "none"})
    rt = tiny("qwen2")
    team = Team(shared=SharedPrefix.build("You are a team of careful agents."), domain="lab", keyring=ring)
    analyst = Agent("analyst", rt, team)
    analyst.read("The outage began at 09:14, right after deploy 7 reached the eu-west pool. " * 2)
    with open_store(f"sqlite:///{tmp_path}/store") as store:
        yield team, analyst, store


def publish_as_vllm(team, analyst, store, cache=None) -> str:
    """The analyst's K/V (or ``cache``) committed by vLLM's real publisher (c2c.vllm.commits.Publisher), as a vLLM
    instance of the same model would: its fingerprint differs in the engine only, and it knows the request by its
    tokens alone (the shared prefix it declares is found in them)."""
    from c2c.vllm import tickets
    from c2c.vllm.commits import Publisher

    run_dir = store.root.parent / "vllm-run"
    (run_dir / "tickets").mkdir(parents=True, exist_ok=True)
    pub = Publisher(store_url=store.url, domain="lab", keyring=team.keyring, run_dir=run_dir,
                    fingerprint=replace(analyst.fingerprint, backend=VLLM), model_dir=analyst.runtime.path)
    try:
        out = pub.publish(cache or analyst.cache, ticket=tickets.new_ticket(), stream="vllm")
    finally:
        pub.close()
    assert "commit" in out, out
    return out["commit"]


def test_pull_attaches_another_engines_commit_only_by_opt_in_after_the_forced_sampled_check(lab):
    from c2c.flows.chain import pull
    from c2c.team.agent import Agent

    team, analyst, store = lab
    cid = publish_as_vllm(team, analyst, store)
    header = Artifact.decode(store.in_domain("lab").get(cid).data).header
    assert header.prefix == analyst.prefix and header.producer["engine"] == "vllm"  # part 0, as every author
    writer = Agent("writer", analyst.runtime, team)
    with pytest.raises(FingerprintMismatchError, match="cross_engine="):
        pull(store, cid, writer, mode="full")
    reader = Agent("reader", analyst.runtime, team)
    as_text = pull(store, cid, reader)   # auto: the commit's text, the engine named
    assert as_text.record["path"] == "text" and "cross_engine=" in as_text.record["reason"]
    assert reader.context.spans[-1].label == "from:vllm" and reader.cache.token_ids != analyst.cache.token_ids
    fidelity = replace(FIDELITY, weights_digest=analyst.fingerprint.weights_digest)
    got = pull(store, cid, writer, policy=HandoffPolicy(cross_engine=CrossEnginePolicy(fidelity=fidelity)))
    assert got.decision["verify"] == "sample" and got.decision["fidelity"] == fidelity.to_dict()
    assert got.verified["mode"] == "sample" and got.verified["layers"] == "all"  # though the domain checks none
    assert writer.cache.token_ids == analyst.cache.token_ids


def test_the_forced_check_refuses_a_tampered_cache_of_another_engine(lab):
    from c2c.flows.chain import pull
    from c2c.team.agent import Agent

    team, analyst, store = lab
    c = analyst.cache
    bad = replace(c, values=c.values[:-1] + (c.values[-1] + 5.0,))  # the last layer, every position
    cid = publish_as_vllm(team, analyst, store, bad)
    writer = Agent("writer", analyst.runtime, team)
    with pytest.raises(VerificationFailedError):
        pull(store, cid, writer, mode="full", policy=OPT_IN)
    assert writer.cache is None or writer.cache.token_ids != analyst.cache.token_ids
    reader = Agent("reader", analyst.runtime, team)
    got = pull(store, cid, reader, policy=OPT_IN)   # auto: the failed check falls back to the commit's text
    assert got.record["path"] == "text" and "VerificationFailedError" in got.record["reason"]
    assert reader.cache.token_ids != analyst.cache.token_ids and got.verified is None


def test_a_broken_fidelity_record_is_a_config_error_naming_the_fix(tmp_path):
    results = tmp_path / "vllm_fidelity.json"
    for doc in ([], {"dtypes": {"bfloat16": {}}}, {"dtypes": {"bfloat16": {"summary": {"prompts": 3}}}}):
        results.write_text(json.dumps(doc))
        with pytest.raises(ConfigError, match="vllm_fidelity.py"):
            EngineFidelity.from_results(results)
    with pytest.raises(ConfigError, match="lacks fields"):
        EngineFidelity.from_dict({"dtype": "bfloat16"})
    with pytest.raises(ConfigError, match="JSON object"):
        EngineFidelity.from_dict(["bfloat16"])


def test_a_weaker_check_the_domain_ran_does_not_stand_in_for_the_forced_one(lab):
    from c2c.handoff.cross_engine import enforce

    team, analyst, store = lab
    art = Artifact.decode(store.in_domain("lab").get(publish_as_vllm(team, analyst, store)).data)
    fidelity = replace(FIDELITY, weights_digest=analyst.fingerprint.weights_digest)
    decision = decide(party(fingerprint=art.header.fingerprint), party("b", analyst.fingerprint),
                      HandoffPolicy(cross_engine=CrossEnginePolicy(fidelity=fidelity)))
    assert decision.verify == "sample"
    strong = enforce(decision, art, analyst.runtime)  # the forced check itself
    assert strong["mode"] == "sample" and strong["layers"] == "all"
    assert enforce(decision, art, analyst.runtime, trust={"kv": strong}) is strong  # as strong: not repeated
    for weaker in ({"layers": "0"}, {"tolerance": strong["tolerance"] * 10}, {"deep_positions": 1}):
        weak = {**strong, **weaker}
        again = enforce(decision, art, analyst.runtime, trust={"kv": weak})  # run again, not taken from weak
        assert again is not weak and (again["layers"], again["tolerance"], again["deep_positions"]) == (
            "all", strong["tolerance"], strong["deep_positions"])


def test_hand_off_refuses_a_cross_engine_policy_and_names_pull(tiny):
    from c2c.handoff import hand_off
    from c2c.team.agent import Agent, Team

    rt = tiny("qwen2")
    team = Team(shared=SharedPrefix.build("You are careful."), domain="lab")
    a, b = Agent("a", rt, team), Agent("b", rt, team)
    a.read("The outage began at 09:14.")
    with pytest.raises(ConfigError, match="chain.pull"):
        hand_off(a, b, HandoffPolicy(cross_engine=OPT_IN.cross_engine))
    assert b.cache is None or b.cache.token_ids != a.cache.token_ids  # nothing moved


def test_a_vllm_receiver_is_told_it_cannot_opt_in_not_how_to():
    d = decide(party(), party("b", replace(FP, backend=VLLM)))  # a transformers cache offered to a vLLM instance
    assert d.path == "text" and "a vLLM instance attaches only vLLM caches" in d.reason and "cross_engine=" not in d.reason
