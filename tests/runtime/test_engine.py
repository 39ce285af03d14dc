"""Runtime: prefill, continue, generate and re-position, on tiny models of each architecture."""

import pytest
import torch

from c2c.errors import ConfigError, IncompatibleCacheError, RuntimeUnsupportedError
from c2c.runtime.edit import drop

ARCHS = ["llama", "qwen2", "gemma3"]
# Chunked vs one-shot prefill differ only by float32 summation order.
CHUNK_ATOL = 1e-4
# Re-rotated keys vs keys computed fresh at the new positions: float32 rounding of one
# extra rotation, relative to key magnitudes of about 5.
ROPE_ATOL = 1e-5


def ids_for(rt, n=60):
    ids = rt.encode("The quick brown fox jumps over the lazy dog. " * 4)
    assert len(ids) >= n
    return ids[:n]


@pytest.mark.parametrize("arch", ARCHS)
def test_continuing_a_cache_equals_one_prefill(tiny, arch):
    rt = tiny(arch)
    ids = ids_for(rt)
    logits_all, full = rt.prefill(ids)
    _, first = rt.prefill(ids[:25])
    logits_rest, rest = rt.prefill(ids[25:], first)
    assert rest.token_ids == tuple(ids)
    assert full.max_abs_diff(rest) < CHUNK_ATOL
    assert (logits_all - logits_rest).abs().max().item() < CHUNK_ATOL


@pytest.mark.parametrize("arch", ARCHS)
def test_reposition_matches_fresh_keys(tiny, arch):
    """A slice moved from p to q has layer-0 keys equal to keys computed fresh at q."""
    rt = tiny(arch)
    ids = ids_for(rt)
    _, cache = rt.prefill(ids)
    p, q, n = 50, 7, 8  # positions 50..57 move to 7..14
    moved = rt.reposition(cache.slice(p, p + n), q)
    filler = rt.encode("x" * q)[:q]
    _, fresh = rt.prefill(filler + ids[p:p + n])
    fresh_slice = fresh.slice(q, q + n)
    assert moved.start == q and moved.token_ids == tuple(ids[p:p + n])
    err = (moved.keys[0] - fresh_slice.keys[0]).abs().max().item()
    assert err < ROPE_ATOL
    # values carry no position: unchanged
    assert torch.equal(moved.values[0], cache.slice(p, p + n).values[0])
    # moving back restores the original keys
    back = rt.reposition(moved, p)
    assert (back.keys[0] - cache.slice(p, p + n).keys[0]).abs().max().item() < ROPE_ATOL


@pytest.mark.parametrize("arch", ARCHS)
def test_reposition_matches_a_shifted_prefill_on_every_layer(tiny, arch):
    """Shifting every position by d leaves attention unchanged (RoPE is relative), so the
    K/V of a prefill at positions d.. equal the re-positioned K/V of a prefill at 0..,
    on every layer, including Gemma's full-attention layers with their second RoPE base."""
    rt = tiny(arch)
    ids = ids_for(rt, 12)  # shorter than tiny Gemma's window
    _, at0 = rt.prefill(ids)
    _, at_d = rt.prefill(ids, start=37)
    moved = rt.reposition(at0, 37)
    assert moved.start == at_d.start == 37
    assert moved.max_abs_diff(at_d) < 1e-4


def test_gemma_slice_outside_window_is_refused(tiny):
    rt = tiny("gemma3")  # sliding window 16
    _, cache = rt.prefill(ids_for(rt))
    with pytest.raises(RuntimeUnsupportedError, match="sliding window"):
        cache.slice(10, 20)
    cache.slice(50, 60)  # near the end: exact


def test_generate_is_greedy_and_caches_what_it_fed(tiny):
    rt = tiny("qwen2")
    ids = ids_for(rt, 20)
    g = rt.generate(ids, max_new_tokens=6, min_new_tokens=6)
    assert len(g.token_ids) == 6
    assert g.cache.token_ids == tuple(ids) + g.token_ids[:-1]
    # the first generated token is the argmax after the prompt
    logits, _ = rt.prefill(ids)
    assert g.token_ids[0] == int(torch.argmax(logits))
    # continuing the returned cache with the last token gives the second-to-next token
    g2 = rt.generate(g.token_ids[-1:], g.cache, max_new_tokens=1)
    g_long = rt.generate(ids, max_new_tokens=7, min_new_tokens=7)
    assert g_long.token_ids[:6] == g.token_ids and g_long.token_ids[6] == g2.token_ids[0]


def test_cache_of_another_model_is_refused(tiny):
    _, cache = tiny("gemma3").prefill(ids_for(tiny("gemma3"), 10))
    with pytest.raises(IncompatibleCacheError, match="layers"):
        tiny("qwen2").prefill([1, 2, 3], cache)
    with pytest.raises(IncompatibleCacheError, match="dtype"):
        tiny("qwen2").prefill([1], tiny("qwen2").prefill([1, 2])[1].to(dtype=torch.float16))


def test_slice_not_at_zero_cannot_be_continued(tiny):
    rt = tiny("llama")
    _, cache = rt.prefill(ids_for(rt, 20))
    with pytest.raises(RuntimeUnsupportedError, match="re-position"):
        rt.prefill([5], cache.slice(5, 20))
    with pytest.raises(ConfigError):
        rt.prefill([])


def test_chat_rendering(tiny):
    rt = tiny("qwen2")
    assert rt.render_turn("user", "hi") == "<|im_start|>user\nhi<|im_end|>\n"
    assert rt.generation_prompt() == "<|im_start|>assistant\n"


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_gpu_prefill_matches_cpu_and_artifacts_round_trip(tiny):
    from c2c.artifact import Artifact
    from c2c.artifact.fingerprint import Fingerprint
    from c2c.artifact.prefix import PrefixRef
    from c2c.runtime.transformers import TransformersRuntime

    cpu = tiny("qwen2")
    gpu = TransformersRuntime.load(cpu.path, name="tiny-qwen2", device="cuda")
    ids = ids_for(cpu, 40)
    _, c_cpu = cpu.prefill(ids)
    _, c_gpu = gpu.prefill(ids)
    assert c_gpu.keys[0].is_cuda
    assert c_gpu.to("cpu").max_abs_diff(c_cpu) < 1e-2  # TF32 / other kernels on the GPU
    art = Artifact.build(c_gpu, fingerprint=Fingerprint.of(gpu), prefix=PrefixRef.of(ids[:8]))
    back = Artifact.decode(art.encode())
    assert back.cache.max_abs_diff(c_gpu.to("cpu")) == 0.0
    moved = gpu.reposition(c_gpu.slice(30, 40), 5)
    assert moved.keys[0].is_cuda


@pytest.mark.parametrize("arch", ["llama", "qwen2", "gemma3"])
def test_logits_batch_matches_one_forward_per_sequence(tiny, arch):
    rt = tiny(arch)
    _, past = rt.prefill(rt.encode("The options are scored after this shared context."))
    seqs = [rt.encode(" A. red"), rt.encode(" B. a much longer option text"), rt.encode(" C")]
    batch = rt.logits_batch(seqs, past)
    for s, got in zip(seqs, batch):
        want = rt.logits(s, past)
        assert got.shape == want.shape == (len(s), rt.facts.vocab_size)
        assert torch.allclose(got, want, atol=1e-4, rtol=1e-4)
    with pytest.raises(ConfigError):
        rt.logits_batch([seqs[0], []], past)


@pytest.mark.parametrize("arch", ARCHS)
def test_a_held_sequence_steps_as_prefill_does_and_a_pass_that_fails_is_never_continued(tiny, arch):
    """``stepper``: the sequence held between passes gives ``prefill``'s logits and cache bit for bit, on sliding
    windows (gemma3) and after a drop that leaves a position gap (the others); a pass that raises leaves the
    last export as it was and refuses to go on from a cache that may be half grown."""
    rt = tiny(arch)
    ids = ids_for(rt)
    _, head = rt.prefill(ids[:24])
    if arch != "gemma3":   # sliding-window caches cannot have gaps
        head, _ = drop(rt, head, [(4, 9)], reposition=False)
        assert head.gaps
    s, chain = rt.stepper(head), head
    for part in (ids[24:34], [ids[34]], [ids[35]], ids[36:44]):
        got = s.feed(part)
        want, chain = rt.prefill(part, chain)
        assert torch.equal(got, want)
    out = s.cache()
    assert out.token_ids == chain.token_ids and out.gaps == chain.gaps and out.end == chain.end
    assert out.max_abs_diff(chain) == 0 and s.cache() is out
    kept = [k.clone() for k in out.keys]
    s.feed(ids[44:48])                                      # growing on after an export leaves the export as it was
    assert s.cache() is not out and all(torch.equal(k, c) for k, c in zip(out.keys, kept))
    out = s.cache()
    with pytest.raises(IndexError):
        s.feed([10 ** 9])                                   # no such token: the pass raises
    assert s.cache() is out                                 # the last export stays whole
    with pytest.raises(RuntimeUnsupportedError, match="failed part way"):
        s.feed([ids[0]])
    s = rt.stepper(out)
    s.feed([ids[1]])
    with pytest.raises(IndexError):
        s.feed([10 ** 9])
    with pytest.raises(RuntimeUnsupportedError, match="failed part way"):
        s.cache()                                           # grown since its last export: nothing whole to give
