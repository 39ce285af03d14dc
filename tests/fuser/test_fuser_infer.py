import pytest
import torch

from c2c.artifact import Artifact
from c2c.artifact.fingerprint import Fingerprint
from c2c.errors import FingerprintMismatchError, FuserCheckpointError
from c2c.fuser import checkpoint as ckpt
from c2c.fuser.align import align_tokens
from c2c.fuser.data import SYSTEM
from c2c.fuser.infer import FusedReceiver, aligned_sharer

MSGS = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "What is two plus two?"}]


def test_untrained_fuser_leaves_the_receiver_unchanged(make_link, tiny_rt):
    r, s = tiny_rt("qwen2"), tiny_rt("gemma3")
    fr = FusedReceiver(r, [make_link(r, s)])
    fused = fr.fuse(MSGS)
    _, plain = r.prefill(list(fused.rendered.ids))
    assert fused.cache.max_abs_diff(plain) == 0.0
    assert fr.generate(MSGS, max_new_tokens=5).token_ids == r.generate(
        list(fused.rendered.ids) + fr.generation_ids(), max_new_tokens=5).token_ids


def test_several_sharers_are_fused_in_turn(make_link, tiny_rt):
    r, s1, s2 = tiny_rt("qwen2"), tiny_rt("gemma3"), tiny_rt("llama")
    l1, l2 = make_link(r, s1, perturb=1), make_link(r, s2, perturb=2)
    both = FusedReceiver(r, [l1, l2]).fuse(MSGS)
    one = FusedReceiver(r, [l1]).fuse(MSGS)
    assert both.cache.max_abs_diff(one.cache) > 0
    # by hand: fuser 2 applied to fuser 1's output
    sr = FusedReceiver(r, [l2]).links[0].sharer_context(MSGS)
    sk, sv = aligned_sharer(sr[1], align_tokens(one.rendered, sr[0]), l2.fuser.cfg.layer_map, r.facts.windows)
    with torch.no_grad():
        k, v = l2.fuser(list(one.cache.keys), list(one.cache.values), sk, sv)
    assert all(torch.allclose(a, b) for a, b in zip(k + v, both.cache.keys + both.cache.values))
    assert set(both.timings) >= {"receiver_prefill", "sharer_prefill:tiny-gemma3", "fuse:tiny-llama"}


def test_control_link_uses_the_receivers_own_cache(make_link, tiny_rt):
    r = tiny_rt("qwen2")
    ctl = make_link(r, None, perturb=3)
    seen = {}
    forward = ctl.fuser.forward
    ctl.fuser.forward = lambda k, v, sk, sv, **kw: (seen.update(sk=sk, sv=sv), forward(k, v, sk, sv, **kw))[1]
    fused = FusedReceiver(r, [ctl]).fuse(MSGS)
    _, plain = r.prefill(list(fused.rendered.ids))
    assert all(torch.equal(a, b) for a, b in zip(seen["sk"] + seen["sv"], plain.keys + plain.values))
    assert fused.cache.max_abs_diff(plain) > 0


def test_exported_fused_cache_never_passes_for_a_plain_receiver_cache(make_link, tiny_rt, tmp_path):
    r, s = tiny_rt("qwen2"), tiny_rt("gemma3")
    fr = FusedReceiver(r, [make_link(r, s, perturb=1)])
    fused = fr.fuse(MSGS)
    art = fr.export(fused, path=tmp_path / "fused.c2c")
    back = Artifact.read(tmp_path / "fused.c2c")
    assert back.id == art.id and back.cache.max_abs_diff(fused.cache) == 0.0
    fp = back.header.fingerprint
    assert f"c2c-fuser:{fr.links[0].meta.fuser_id}" in fp.adapters
    assert any(a.startswith("c2c-sharer:tiny-gemma3@") for a in fp.adapters)
    info = back.header.extra["c2c.fusion"]
    assert info["fusers"][0]["sharer"] == "tiny-gemma3" and info["gate"] == "hard"
    with pytest.raises(FingerprintMismatchError) as e:
        Fingerprint.of(r).require_same(fp)
    assert "adapters" in e.value.differences


def test_a_fuser_for_other_models_is_refused(make_link, tiny_rt):
    r, s = tiny_rt("qwen2"), tiny_rt("gemma3")
    bad = make_link(r, s)
    bad.meta = ckpt.FuserMeta(fuser=bad.meta.fuser, receiver={**bad.meta.receiver, "weights_digest": "0" * 64},
                              sharer=bad.meta.sharer)
    with pytest.raises(FuserCheckpointError, match="different weights"):
        FusedReceiver(r, [bad])
    with pytest.raises(FuserCheckpointError, match="trained with receiver tiny-qwen2"):
        FusedReceiver(s, [make_link(r, s)])
