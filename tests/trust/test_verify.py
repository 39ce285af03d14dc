"""KV verification: honest caches pass, tampered ones fail, and what cannot be checked is said."""

import random
from dataclasses import replace

import pytest
import torch

from c2c.artifact import Artifact
from c2c.errors import FingerprintMismatchError, UnverifiableError, VerificationFailedError
from c2c.runtime.pace import Pace
from c2c.trust.probe import kv_at_positions, layer0_kv
from c2c.trust.verify import default_tolerance, stratified_positions, verify_kv

from .conftest import build


def rebuild(art: Artifact, keys=None, values=None, token_ids=None) -> Artifact:
    """What a compromised signer does: edit the cache or the claimed tokens, then build (and sign) anew."""
    c = art.cache
    c = replace(c, keys=tuple(keys or c.keys), values=tuple(values or c.values),
                token_ids=tuple(token_ids or c.token_ids))
    return Artifact.build(c, fingerprint=art.header.fingerprint, prefix=art.header.prefix)


def shifted(t: torch.Tensor) -> torch.Tensor:
    return torch.roll(t, shifts=1, dims=2)


def test_probe_matches_one_step_prefill(qwen, qwen_art):
    cache = qwen_art.cache
    pos = [0, 7, 30, cache.end - 1]
    K, V = kv_at_positions(qwen, cache, pos)
    for i, p in enumerate(pos):
        _, step = qwen.prefill([cache.token_ids[p]], past=cache.slice(0, p) if p else None)
        for layer in range(cache.num_layers):
            assert torch.allclose(K[layer][0, :, i], step.keys[layer][0, :, p], atol=1e-4)
            assert torch.allclose(V[layer][0, :, i], step.values[layer][0, :, p], atol=1e-4)
    k0, v0 = layer0_kv(qwen, cache.token_ids[10:20], 10)
    assert torch.allclose(k0, cache.keys[0][:, :, 10:20], atol=1e-5)


def test_honest_cache_passes_every_mode(qwen, qwen_art):
    s = verify_kv(qwen_art, qwen, mode="sample", samples=8, rng=random.Random(0))
    assert s.passed and s.layers == "all" and s.deep_positions == 8 and s.layer0_positions == qwen_art.header.seq_len
    assert s.max_error < 1e-4 and s.tolerance == default_tolerance(torch.float32, "cpu")
    t = verify_kv(qwen_art, qwen, mode="strict")
    assert t.passed and t.deep_positions == qwen_art.header.seq_len and t.max_error < 1e-4


def test_a_strict_check_runs_at_the_pace_it_is_given(qwen, qwen_art):
    """A server's strict check re-prefills the commit in passes of its prefill chunk (the turn free between
    them), and rules as the one pass does, honest or tampered."""
    n, calls = qwen_art.header.seq_len, []
    pace = Pace(chunk=4, between=lambda: calls.append(1))
    t = verify_kv(qwen_art, qwen, mode="strict", pace=pace)
    assert t.passed and t.deep_positions == n and t.max_error < 1e-4 and len(calls) == -(-n // 4) > 1
    c = qwen_art.cache
    with pytest.raises(VerificationFailedError):
        verify_kv(rebuild(qwen_art, keys=c.keys[:2] + (shifted(c.keys[2]),) + c.keys[3:]), qwen, mode="strict",
                  pace=pace)


def test_whole_layer_shift_is_caught(qwen, qwen_art):
    c = qwen_art.cache
    bad = rebuild(qwen_art, keys=c.keys[:2] + (shifted(c.keys[2]),) + c.keys[3:])
    for mode in ("sample", "strict"):
        with pytest.raises(VerificationFailedError) as e:
            verify_kv(bad, qwen, mode=mode, samples=4, rng=random.Random(1))
        assert e.value.report.worst["layer"] >= 2


def test_tenth_of_last_layer_is_caught_by_enough_probes(qwen, qwen_art):
    c = qwen_art.cache
    T, last = c.seq_len, c.num_layers - 1
    v = c.values[last].clone()
    hit = random.Random(3).sample(range(T), T // 10)
    v[:, :, hit] = v[:, :, [(p + 7) % T for p in hit]]  # plausible values, wrong place
    bad = rebuild(qwen_art, values=c.values[:last] + (v,))
    with pytest.raises(VerificationFailedError) as e:
        verify_kv(bad, qwen, mode="sample", samples=T, layer0=False)
    assert e.value.report.worst["layer"] == last and e.value.report.worst["position"] in hit


def test_tokens_swapped_in_the_header_are_caught_at_layer_0(qwen, qwen_art):
    ids = list(qwen_art.cache.token_ids)
    ids[20], ids[21] = ids[21], ids[20]
    assert ids != list(qwen_art.cache.token_ids)
    bad = rebuild(qwen_art, token_ids=ids)
    with pytest.raises(VerificationFailedError) as e:
        verify_kv(bad, qwen, mode="sample", samples=1, rng=random.Random(0))
    assert e.value.report.worst["layer"] == 0 and e.value.report.worst["position"] in (20, 21)


def test_poison_vector_is_caught(qwen, qwen_art):
    c = qwen_art.cache
    v = c.values[1] + 0.05 * c.values[1].std() * torch.randn(c.values[1].shape[-1])
    with pytest.raises(VerificationFailedError):
        verify_kv(rebuild(qwen_art, values=(c.values[0], v) + c.values[2:]), qwen, mode="sample", samples=2)


def test_slices_need_their_context_for_deep_layers(qwen, qwen_ids):
    art = build(qwen, qwen_ids, start=8)
    with pytest.raises(UnverifiableError, match="not verified beyond layer 0"):
        verify_kv(art, qwen, mode="sample", samples=8)
    s = verify_kv(art, qwen, mode="sample", samples=8, allow_partial=True)
    assert s.layers == "0" and s.deep_positions == 0 and "only layer 0" in s.note
    with pytest.raises(UnverifiableError, match="context"):
        verify_kv(art, qwen, mode="strict")
    _, prefix = qwen.prefill(list(qwen_ids[:8]))
    s = verify_kv(art, qwen, mode="sample", samples=8, context=prefix)
    assert s.layers == "all" and s.deep_positions == 8 and all(8 <= p < 48 for p in [s.worst["position"]])
    assert verify_kv(art, qwen, mode="strict", context=prefix).passed
    c = art.cache
    bad = rebuild(art, keys=c.keys[:3] + (shifted(c.keys[3]),))
    with pytest.raises(VerificationFailedError):
        verify_kv(bad, qwen, mode="strict", context=prefix)


def test_withheld_tokens(qwen, qwen_ids):
    art = build(qwen, qwen_ids, withhold=True)
    with pytest.raises(UnverifiableError, match="withholds"):
        verify_kv(art, qwen, mode="sample")
    assert verify_kv(art, qwen, mode="sample", samples=4, token_ids=qwen_ids).passed
    wrong = list(qwen_ids)
    wrong[3] += 1
    with pytest.raises(VerificationFailedError, match="token_digest"):
        verify_kv(art, qwen, mode="sample", token_ids=wrong)


def test_wrong_model_is_refused(tiny, qwen_art):
    with pytest.raises(FingerprintMismatchError):
        verify_kv(qwen_art, tiny("llama"), mode="sample")


def test_sliding_window_models_run_strict(tiny):
    rt = tiny("gemma3")
    ids = rt.encode("sliding windows keep only the last tokens of each layer " * 2)[:40]
    art = build(rt, ids)
    r = verify_kv(art, rt, mode="sample", samples=4)
    assert r.mode == "strict" and "sliding" in r.note and r.passed
    c = art.cache
    bad = rebuild(art, values=c.values[:2] + (shifted(c.values[2]),) + c.values[3:])  # a full-attention layer
    with pytest.raises(VerificationFailedError):
        verify_kv(bad, rt, mode="sample")


def test_half_precision_honest_cache_passes_at_its_tolerance(tiny, c2c_home):
    from c2c.runtime import zoo

    tiny("qwen2")  # make sure it is built under this C2C_HOME
    rt = zoo.load("tiny-qwen2", dtype="bfloat16")
    ids = rt.encode("bf16 rounds at every op, so its tolerance is wider. " * 2)[:48]
    art = build(rt, ids)
    r = verify_kv(art, rt, mode="sample", samples=16, rng=random.Random(0))
    assert r.tolerance == default_tolerance(torch.bfloat16, "cpu") and r.max_error < r.tolerance / 2
    c = art.cache
    with pytest.raises(VerificationFailedError):
        verify_kv(rebuild(art, keys=c.keys[:1] + (shifted(c.keys[1]),) + c.keys[2:]), rt, mode="strict")


def test_stratified_positions():
    rng = random.Random(0)
    pos = stratified_positions(10, 110, 10, rng)
    assert len(pos) == 10 and [p // 10 for p in pos] == list(range(1, 11))
    assert stratified_positions(0, 5, 9, rng) == [0, 1, 2, 3, 4]


def test_default_tolerances_widen_with_lower_precision():
    f32, f16, bf16 = (default_tolerance(d, "cpu") for d in (torch.float32, torch.float16, torch.bfloat16))
    assert f32 < f16 < bf16
    assert default_tolerance(torch.float32, "cuda") > f32


def test_short_sliding_cache_is_probed_exactly(tiny):
    rt = tiny("gemma3")  # window 16: 6 tokens + 4 probes fit in the 15 a sliding layer holds
    ids = rt.encode("short one")[:6]
    art = build(rt, ids)
    r = verify_kv(art, rt, mode="sample", samples=4, rng=random.Random(0))
    assert r.mode == "sample" and r.deep_positions == 4 and r.max_error < 1e-4
    c = art.cache
    bad = rebuild(art, keys=c.keys[:5] + (c.keys[5] * 1.01,))
    with pytest.raises(VerificationFailedError):
        verify_kv(bad, rt, mode="sample", samples=6, layer0=False)
