"""Handoffs between agents on tiny models: full, slice, text, auto and every refusal."""

import pytest
import torch

from c2c.artifact.prefix import SharedPrefix
from c2c.errors import ConfigError, DomainMismatchError, FingerprintMismatchError, HandoffError, PrefixMismatchError
from c2c.handoff import hand_off
from c2c.team.agent import Agent, Team

SHARED = SharedPrefix.build("You are a team of two agents.", tools=["calc"], context={"task": "t"})
DOC = "Paris is the capital of France. The Seine flows through it. " * 2


def pair(rt, team=None, rt_b=None, team_b=None):
    team = team or Team(shared=SHARED)
    a = Agent("analyst", rt, team, role="You are the analyst (secret instructions).")
    b = Agent("writer", rt_b or rt, team_b or team, role="You are the writer.")
    a.read(DOC, label="evidence")
    return a, b


@pytest.mark.parametrize("arch", ["llama", "qwen2", "gemma3"])
def test_full_handoff_is_exact(tiny, arch):
    rt = tiny(arch)
    a, b = pair(rt)
    h = hand_off(a, b, mode="full")
    assert (h.used, h.requested) == ("full", "full") and h.artifact_bytes > 0
    g = b.respond("Summarize.", max_new_tokens=8, min_new_tokens=8)
    # what the reply was generated from: the conversation before its message, and the generation prompt
    fed = b.context.token_ids[:b.context.spans[-1].start] + tuple(rt.encode(rt.generation_prompt()))
    ref = rt.generate(fed, max_new_tokens=8, min_new_tokens=8)
    assert g.token_ids == ref.token_ids
    assert b.stats.decoded == 8 and a.stats.decoded == 0


def test_slice_excludes_private_spans_and_lands_after_the_prefix(tiny):
    rt = tiny("qwen2")
    a, b = pair(rt)
    a.read("scratch thoughts that must stay home", label="scratch")
    h = hand_off(a, b, mode="slice", labels=("evidence",))
    ev = a.context.spans_labelled("evidence")[0]
    role = a.context.spans_labelled("role")[0]
    received = b.context.spans[-1]
    assert h.used == "slice"
    assert b.context.token_ids[received.start:received.end] == a.context.token_ids[ev.start:ev.end]
    assert received.start == b.context.prefix_len  # attached right after the shared prefix
    assert b.cache.seq_len == b.context.prefix_len + ev.length
    role_ids = a.context.token_ids[role.start:role.end]
    assert role_ids != b.context.token_ids[received.start:received.start + len(role_ids)]
    with pytest.raises(HandoffError, match="private"):
        a.export(labels=("scratch",))


def test_slice_keys_are_repositioned_like_a_fresh_prefill_at_layer0(tiny):
    rt = tiny("llama")
    a, b = pair(rt)
    hand_off(a, b, mode="slice", labels=("evidence",))
    _, fresh = rt.prefill(b.context.token_ids)
    # layer 0 depends only on token and position: equal up to float rounding
    assert (fresh.keys[0] - b.cache.keys[0]).abs().max().item() < 1e-5
    assert (fresh.values[0] - b.cache.values[0]).abs().max().item() < 1e-5


def test_text_handoff_decodes_and_prefills(tiny):
    rt = tiny("qwen2")
    a, b = pair(rt)
    h = hand_off(a, b, mode="text", message_tokens=6, min_message_tokens=6)
    assert h.used == "text" and h.tokens_decoded == 6 and h.tokens_prefilled > 6
    assert b.context.spans[-1].label == "message" and h.artifact_bytes == 0


def test_auto_uses_cache_when_compatible_and_minimizes(tiny):
    a, b = pair(tiny("qwen2"))
    a.read("thinking out loud", label="scratch")
    a.read("The answer is Paris.", label="conclusion")
    h = hand_off(a, b, mode="auto")
    # the sender holds private spans (role, scratch): only what follows them leaves
    assert h.used == "slice" and "same model" in h.reason and "minimized" in h.reason
    assert b.context.spans[-1].length == a.context.spans_labelled("conclusion")[0].length
    team = Team(shared=SHARED)
    c, d = Agent("c", tiny("qwen2"), team), Agent("d", tiny("qwen2"), team)  # no role: nothing private
    c.read(DOC)
    assert hand_off(c, d, mode="auto").used == "full"


def test_signed_handoff_with_trust_checks(tiny, tmp_path):
    from c2c.errors import BadSignatureError
    from c2c.trust import Keyring, VerifyPolicy

    ring = Keyring(tmp_path / "keys")
    ring.create_key("lab")
    ring.set_policy("lab", VerifyPolicy(kv="sample", samples=4).to_dict())
    team = Team(shared=SHARED, domain="lab", keyring=ring)
    rt = tiny("qwen2")
    a, b = Agent("a", rt, team), Agent("b", rt, team)
    a.read(DOC)
    h = hand_off(a, b, mode="auto")
    kv = h.trust["kv"]
    assert h.used == "full" and h.trust["signer"]["domain"] == "lab" and kv["mode"] == "sample"
    assert kv["max_error"] <= kv["tolerance"] and kv["deep_positions"] == 4
    assert a.export().signature["domain"] == "lab"

    class Tamper:  # a transport that flips one tensor byte in flight
        def __init__(self):
            self.data = {}

        def send(self, key, payload):
            bad = bytearray(payload)
            bad[-10] ^= 1
            self.data[key] = bytes(bad)

        def receive(self, key):
            return self.data[key]

    a, b = Agent("a", rt, team), Agent("b", rt, team)
    a.read(DOC)
    h = hand_off(a, b, mode="auto", transport=Tamper(), message_tokens=3)
    assert h.used == "text" and "fell back to text" in h.reason
    a, b = Agent("a", rt, team), Agent("b", rt, team)
    a.read(DOC)
    with pytest.raises(Exception) as e:
        hand_off(a, b, mode="full", transport=Tamper())
    assert "digest" in str(e.value) or isinstance(e.value, BadSignatureError)


def test_auto_falls_back_to_text_on_another_model(tiny):
    a, b = pair(tiny("qwen2"), rt_b=tiny("llama"))
    h = hand_off(a, b, mode="auto", message_tokens=4)
    assert h.used == "text" and "models differ" in h.reason and "architecture" in h.reason
    with pytest.raises(FingerprintMismatchError):
        hand_off(*pair(tiny("qwen2"), rt_b=tiny("llama")), mode="full")


def test_auto_falls_back_on_prefix_mismatch_and_explicit_raises(tiny):
    rt = tiny("qwen2")
    other = Team(shared=SharedPrefix.build("You are a team of three agents.", tools=["calc"], context={"task": "t"}))
    a, b = pair(rt, team_b=other)
    h = hand_off(a, b, mode="auto", message_tokens=4)
    assert h.used == "text" and "prefix" in h.reason
    a, b = pair(rt, team_b=other)
    with pytest.raises(PrefixMismatchError, match="first differing block"):
        hand_off(a, b, mode="full")


def test_cross_domain_is_always_text(tiny):
    rt = tiny("qwen2")
    a, b = pair(rt, team=Team(shared=SHARED, domain="red"), team_b=Team(shared=SHARED, domain="blue"))
    h = hand_off(a, b, mode="auto", message_tokens=4)
    assert h.used == "text" and "crosses trust domains" in h.reason
    a, b = pair(rt, team=Team(shared=SHARED, domain="red"), team_b=Team(shared=SHARED, domain="blue"))
    with pytest.raises(DomainMismatchError, match="trust"):
        hand_off(a, b, mode="slice")


def test_auto_falls_back_when_a_check_refuses(tiny):
    from c2c.errors import UnsignedArtifactError

    def refuse(artifact):
        raise UnsignedArtifactError("policy requires a signature")

    a, b = pair(tiny("qwen2"))
    h = hand_off(a, b, mode="auto", check=refuse, message_tokens=4)
    assert h.used == "text" and "UnsignedArtifactError" in h.reason


def test_auto_asks_the_advisor_and_records_its_prediction(tiny, tmp_path, monkeypatch):
    from dataclasses import replace

    from c2c.advise import Calibration

    monkeypatch.setenv("C2C_HOME", str(tmp_path))  # no saved calibration here
    rt = tiny("qwen2")
    team = Team(shared=SHARED)
    fast = Calibration(model=rt.name, decode_s_per_token=0.05, decode_s_per_position=0.0, prefill_s_fixed=0.01,
                       prefill_s_per_token=0.001, prefill_s_per_pair=0.0, prefill_s_per_past=0.0,
                       kv_bytes_per_token=rt.facts.num_layers * 2 * 2 * 16 * 4, handoff_points=((10**6, 0.001),))
    c, d = Agent("c", rt, team), Agent("d", rt, team)
    c.read(DOC)
    h = hand_off(c, d, mode="auto", calibration=fast)
    assert h.used == "full" and "advisor predicts cache" in h.reason
    assert h.advice["cache_is_faster"] and h.advice["cache_handoff_s"] < h.advice["text_handoff_s"]
    # a link so slow that moving the cache costs more than writing 4 tokens: text, and why
    slow = replace(fast, handoff_points=((1, 10.0),))  # 10 s per byte
    c, d = Agent("c", rt, team), Agent("d", rt, team)
    c.read(DOC)
    h = hand_off(c, d, mode="auto", calibration=slow, message_tokens=4)
    assert h.used == "text" and "costs more than writing and reading 4 tokens" in h.reason
    assert not h.advice["cache_is_faster"] and d.context.spans[-1].label == "message"
    # without any calibration auto still works, and says it did not predict
    c, d = Agent("c", rt, team), Agent("d", rt, team)
    c.read(DOC)
    h = hand_off(c, d, mode="auto")
    assert h.used == "full" and h.advice is None and "latency not predicted" in h.reason


def test_rooted_transport_is_durable_and_the_ephemeral_one_is_not(tmp_path, monkeypatch):
    import os

    from c2c.handoff import DirectoryTransport
    from c2c.testing.synthetic import synthetic_artifact

    payload = synthetic_artifact().encode()
    synced = []
    real = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: (synced.append(fd), real(fd)))
    kept = DirectoryTransport(tmp_path / "kept")
    kept.send("k", payload)
    assert len(synced) == 2 and kept.receive("k") == payload and (tmp_path / "kept" / "k.c2c").exists()
    synced.clear()
    once = DirectoryTransport()
    once.send("k", payload)
    root = once.root
    assert synced == [] and once.receive("k") == payload
    assert not root.exists()  # the one-shot folder goes with its last file


def keyring_team(tmp_path):
    from c2c.trust import Keyring

    ring = Keyring(tmp_path / "keys")
    ring.create_key("lab")
    return Team(shared=SHARED, domain="lab", keyring=ring)  # the default policy: sampled KV check


def test_auto_with_a_private_role_sends_a_recomputed_slice_verified_at_every_layer(tiny, tmp_path):
    from c2c.errors import UnverifiableError

    rt, team = tiny("qwen2"), keyring_team(tmp_path)
    a, b = pair(rt, team)
    h = hand_off(a, b, mode="auto")
    kv = h.trust["kv"]
    assert h.used == "slice" and kv["mode"] == "sample"
    assert kv["layers"] == "all" and kv["deep_positions"] > 0 and kv["note"] == ""  # was: layer 0 only
    assert "minimized" in h.reason and "isolation recompute" in h.reason
    received, ev = b.context.spans[-1], a.context.spans_labelled("evidence")[0]
    assert received.label == "from:analyst"
    assert b.context.token_ids[received.start:received.end] == a.context.token_ids[ev.start:ev.end]
    # positions slices follow the sender's private role, which the receiver does not hold: not verifiable
    a, b = pair(rt, team)
    h = hand_off(a, b, mode="auto", isolation="positions", message_tokens=3)
    assert h.used == "text" and "UnverifiableError" in h.reason and "not verified beyond layer 0" in h.reason
    a, b = pair(rt, team)
    with pytest.raises(UnverifiableError):
        hand_off(a, b, mode="slice", labels=("evidence",), isolation="positions")


def test_the_handoff_record_says_how_a_slice_was_cut(tiny):
    rt = tiny("qwen2")
    a, b = pair(rt)
    h = hand_off(a, b, mode="slice", labels=("evidence",), isolation="positions")
    assert "isolation positions" in h.reason and "leak" in h.reason and "attention" in h.reason
    a, b = pair(rt)
    h = hand_off(a, b, mode="slice", labels=("evidence",))
    assert "isolation recompute" in h.reason and "no trace of private spans" in h.reason
    _, fresh = rt.prefill(b.context.token_ids)  # the receiver now holds exactly [prefix + evidence]
    assert b.cache.max_abs_diff(fresh) < 1e-4
    with pytest.raises(ConfigError, match="isolation"):
        hand_off(*pair(rt), mode="slice", isolation="clean")


@pytest.mark.parametrize("mode", ["full", "slice"])
def test_an_in_process_handoff_shares_the_tensors_and_moves_no_bytes(tiny, mode):
    from c2c.handoff import SharedTransport

    rt = tiny("qwen2")
    a, b = pair(rt)
    ref_a, ref_b = pair(rt)
    h = hand_off(a, b, mode=mode, labels=("evidence",), transport=SharedTransport())
    ref = hand_off(ref_a, ref_b, mode=mode, labels=("evidence",))  # the same hop through artifact bytes
    assert h.used == mode and h.artifact_bytes == 0 and "no bytes moved" in h.reason
    if mode == "full":
        assert b.cache.keys[0].data_ptr() == a.cache.keys[0].data_ptr()  # the very same storage
    assert b.context.token_ids == ref_b.context.token_ids
    assert b.cache.max_abs_diff(ref_b.cache) == 0
    before = a.cache.keys[0].clone()
    g = b.respond("Where is it?", max_new_tokens=4)
    assert g.token_ids == ref_b.respond("Where is it?", max_new_tokens=4).token_ids
    assert torch.equal(a.cache.keys[0], before)  # the receiver's growth never touched the sender's cache


def test_a_shared_handoff_still_decides_and_checks(tiny):
    from c2c.handoff import SharedTransport

    rt = tiny("qwen2")
    a, b = pair(rt, team=Team(shared=SHARED, domain="red"), team_b=Team(shared=SHARED, domain="blue"))
    assert hand_off(a, b, mode="auto", message_tokens=4, transport=SharedTransport()).used == "text"
    a, b = pair(rt, team_b=Team(shared=SharedPrefix.build("Another team.")))
    with pytest.raises(PrefixMismatchError):
        hand_off(a, b, mode="full", transport=SharedTransport())
