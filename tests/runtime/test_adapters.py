"""LoRA roles: training, attach/detach, and the fingerprint recording the adapter."""

import pytest

from c2c.artifact.fingerprint import Fingerprint
from c2c.errors import ModelError
from c2c.runtime import adapters
from c2c.runtime.transformers import TransformersRuntime


@pytest.fixture(scope="module")
def rt_and_adapters(tiny, tmp_path_factory):
    base = tiny("qwen2")
    rt = TransformersRuntime.load(base.path, name="tiny-qwen2-roles")  # own copy: adapters mutate the model
    d = tmp_path_factory.mktemp("adapters")
    c1 = adapters.train(rt, ["def add(a, b): return a + b"] * 4, d / "coder", steps=8, lr=1e-2, progress=False,
                        eval_texts=["def add(a, b): return a + b  "])
    c2 = adapters.train(rt, ["Dear reader, once upon a time."] * 4, d / "writer", steps=8, lr=1e-2, seed=1,
                        progress=False)
    return rt, d, c1, c2


def test_training_lowers_the_loss_and_saves_safetensors(rt_and_adapters):
    rt, d, c1, _ = rt_and_adapters
    assert c1["last_loss"] < c1["first_loss"]
    assert c1["eval_after"] < c1["eval_before"] and c1["eval_texts"] == 1  # measured on a text it did not see
    assert (d / "coder" / "adapter_model.safetensors").is_file()
    assert not list((d / "coder").glob("*.bin"))
    assert rt.adapters == () and not hasattr(rt.model, "peft_config")  # base left clean


def test_adapters_change_kv_and_fingerprint(rt_and_adapters):
    rt, d, _, _ = rt_and_adapters
    ids = rt.encode("def mul(a, b):")
    _, base_kv = rt.prefill(ids)
    fp_base = Fingerprint.of(rt)
    adapters.attach(rt, d / "coder", "coder")
    _, coder_kv = rt.prefill(ids)
    fp_coder = Fingerprint.of(rt)
    adapters.attach(rt, d / "writer", "writer")
    _, writer_kv = rt.prefill(ids)
    fp_writer = Fingerprint.of(rt)
    adapters.detach(rt)
    _, again = rt.prefill(ids)
    assert coder_kv.max_abs_diff(base_kv) > 1e-4 and writer_kv.max_abs_diff(coder_kv) > 1e-4
    assert again.max_abs_diff(base_kv) < 1e-5
    assert set(fp_coder.diff(fp_base)) == {"adapters"} and set(fp_writer.diff(fp_coder)) == {"adapters"}
    assert fp_coder.adapters[0].startswith("coder@")
    # re-positioning still works through the PEFT wrapper
    adapters.attach(rt, d / "coder", "coder")
    moved = rt.reposition(coder_kv, 5)
    assert moved.start == 5
    adapters.detach(rt)


def test_pickled_adapters_are_refused(tmp_path):
    (tmp_path / "adapter_model.bin").write_bytes(b"\x80\x04pickle")
    with pytest.raises(ModelError, match="pickled"):
        adapters.adapter_digest(tmp_path)


def test_team_adapter_policy(rt_and_adapters):
    from c2c.artifact.prefix import SharedPrefix
    from c2c.errors import FingerprintMismatchError, VerificationFailedError
    from c2c.handoff import hand_off
    from c2c.runtime.transformers import TransformersRuntime
    from c2c.team.agent import Agent, Team
    from c2c.team.roles import AdapterPolicy

    rt, d, _, _ = rt_and_adapters
    rt_y = TransformersRuntime.load(rt.path, name="tiny-qwen2-roles")  # same base, another role
    adapters.attach(rt, d / "coder", "coder")
    adapters.attach(rt_y, d / "writer", "writer")
    try:
        def run(policy):
            team = Team(shared=SharedPrefix.build("roles"), adapter_policy=policy)
            a, b = Agent("coder", rt, team), Agent("writer", rt_y, team)
            a.read("def add(a, b): return a + b")
            return a, b, team

        a, b, _ = run(AdapterPolicy(mode="refuse"))
        with pytest.raises(FingerprintMismatchError, match="adapter policy is 'refuse'"):
            hand_off(a, b, mode="full")
        a, b, _ = run(AdapterPolicy(mode="verify", bound=1e-6))
        with pytest.raises(VerificationFailedError, match="diverges"):
            hand_off(a, b, mode="full")
        a, b, _ = run(AdapterPolicy(mode="verify", bound=1e6))
        hand_off(a, b, mode="full")
        assert b.attach_note.startswith("accepted: divergence")
        a, b, _ = run(AdapterPolicy(mode="reprefill"))
        hand_off(a, b, mode="full")
        _, own = rt_y.prefill(list(b.cache.token_ids))
        assert b.cache.max_abs_diff(own) < 1e-5 and b.attach_note.startswith("re-prefilled")
    finally:
        adapters.detach(rt)


def test_team_prefix_cache_follows_the_active_adapter(rt_and_adapters):
    from c2c.artifact.prefix import SharedPrefix
    from c2c.team.agent import Team

    rt, d, _, _ = rt_and_adapters
    team = Team(shared=SharedPrefix.build("roles share this prefix"))
    base = team.prefix_cache(rt)
    adapters.attach(rt, d / "coder", "coder")
    try:
        coder = team.prefix_cache(rt)
        _, fresh = rt.prefill(list(coder.token_ids))
        assert coder.max_abs_diff(base) > 1e-4 and coder.max_abs_diff(fresh) < 1e-5
    finally:
        adapters.detach(rt)
    assert team.prefix_cache(rt) is base
