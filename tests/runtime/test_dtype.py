"""Dtypes: ``auto`` picks bf16 where the hardware has it; packed bf16 weights change no bit."""

from __future__ import annotations

import pytest
import torch

from c2c.config import Settings
from c2c.errors import ConfigError
from c2c.runtime import dtype as dt
from c2c.runtime import zoo
from c2c.runtime.transformers import attention, packing, partial_forward


def test_auto_is_bf16_exactly_where_the_cpu_or_gpu_has_it(monkeypatch):
    monkeypatch.setattr(dt, "cpu_flags", lambda: frozenset({"avx2", "avx512_bf16"}))
    assert dt.resolve("auto") == "bfloat16"
    monkeypatch.setattr(dt, "cpu_flags", lambda: frozenset({"avx2", "amx_bf16", "amx_tile"}))
    assert dt.resolve("auto") == "bfloat16"
    monkeypatch.setattr(dt, "cpu_flags", lambda: frozenset({"avx2", "avx512f"}))
    assert dt.resolve("auto") == "float32"
    assert dt.resolve("auto", "cuda:0") == "bfloat16"
    assert dt.resolve("float32", "cuda") == "float32" and dt.resolve("bfloat16") == "bfloat16"
    with pytest.raises(ConfigError, match="unknown dtype 'fp8'"):
        dt.resolve("fp8")


def test_the_default_comes_from_C2C_DTYPE(monkeypatch):
    monkeypatch.setenv("C2C_DTYPE", "bfloat16")
    assert dt.resolve(None) == "bfloat16"
    monkeypatch.setenv("C2C_DTYPE", "auto")
    monkeypatch.setattr(dt, "cpu_flags", lambda: frozenset())
    assert dt.resolve(None) == "float32"
    with pytest.raises(ConfigError, match="C2C_DTYPE='half'"):
        Settings.from_env({"C2C_DTYPE": "half"})
    assert Settings.from_env({}).dtype == "auto"


def test_this_machine_reads_its_own_flags():
    flags = dt.cpu_flags()
    assert dt.cpu_has_bf16() == bool({"avx512_bf16", "amx_bf16"} & flags)


needs_pack = pytest.mark.skipif(not hasattr(torch.ops.mkldnn, "_reorder_linear_weight")
                                or not torch.backends.mkldnn.is_available() or not dt.cpu_can_pack_bf16(),
                                reason="no oneDNN packed linear, or a CPU it cannot pack bf16 for "
                                       "(needs AVX512-BW/VL/DQ or AVX-NE-CONVERT)")


def test_bf16_weights_stay_dense_on_a_cpu_onednn_cannot_pack_for(monkeypatch):
    """An AVX2-only CPU (no AVX512-BW/VL/DQ, no AVX-NE-CONVERT): oneDNN's reorder would raise, so
    bf16 runs on plain ``F.linear`` instead, and gives the same logits as the dense model."""
    monkeypatch.setattr(dt, "cpu_flags", lambda: frozenset({"avx", "avx2", "fma", "f16c"}))
    assert not dt.cpu_can_pack_bf16()
    rt = zoo.load("tiny-qwen2", dtype="bfloat16")
    assert rt.packed == 0 and str(rt.dtype) == "torch.bfloat16"
    assert not any(isinstance(m, packing.PackedLinear) for m in rt.model.modules())
    dense = zoo.load("tiny-qwen2", dtype="float32")
    logits, _ = rt.prefill(list(range(3, 40)))      # (vocab,)
    ref, _ = dense.prefill(list(range(3, 40)))      # (vocab,)
    cos = torch.nn.functional.cosine_similarity(logits.float(), ref.float(), dim=0)
    assert torch.isfinite(logits).all() and cos > 0.99  # bf16 rounding only
    monkeypatch.setattr(dt, "cpu_flags", lambda: frozenset({"avx512bw", "avx512vl"}))  # DQ missing
    assert not dt.cpu_can_pack_bf16()
    monkeypatch.setattr(dt, "cpu_flags", lambda: frozenset({"avx512bw", "avx512vl", "avx512dq"}))
    assert dt.cpu_can_pack_bf16()
    monkeypatch.setattr(dt, "cpu_flags", lambda: frozenset({"avx2", "avx_ne_convert"}))
    assert dt.cpu_can_pack_bf16()


@needs_pack
@pytest.mark.parametrize("arch", ["qwen2", "llama", "gemma3"])
def test_packed_bf16_linears_are_bit_identical_and_reversible(arch):
    rt = zoo.load(f"tiny-{arch}", dtype="bfloat16")
    assert rt.packed > 0 and str(rt.dtype) == "torch.bfloat16"
    assert not any(type(m) is torch.nn.Linear for m in rt.model.modules())
    ids = list(range(3, 60))
    logits, cache = rt.prefill(ids)
    step, _ = rt.prefill([7], cache)
    gen = rt.generate(ids, max_new_tokens=6)
    rt.ensure_dense()
    assert rt.packed == 0 and not any(isinstance(m, packing.PackedLinear) for m in rt.model.modules())
    logits2, cache2 = rt.prefill(ids)
    step2, _ = rt.prefill([7], cache2)
    assert torch.equal(logits, logits2) and torch.equal(step, step2)
    assert cache.max_abs_diff(cache2) == 0
    assert rt.generate(ids, max_new_tokens=6).token_ids == gen.token_ids


def test_float32_is_never_packed_and_the_dtype_is_in_the_fingerprint():
    from c2c.artifact.fingerprint import Fingerprint

    a = zoo.load("tiny-qwen2", dtype="float32")
    b = zoo.load("tiny-qwen2", dtype="bfloat16")
    assert a.packed == 0
    fa, fb = Fingerprint.of(a), Fingerprint.of(b)
    # the dtype differs, and so do the numerics the backend names (the ISA class of bf16 products, the
    # linear kernel where bf16 is packed); a tolerance-based comparison sees the dtype only
    assert (fa.dtype, fb.dtype) == ("float32", "bfloat16") and set(fa.diff(fb)) == {"dtype", "backend"}
    assert set(fa.diff(fb, exact=False)) == {"dtype"}


@pytest.mark.parametrize("arch", ["qwen2", "gemma3"])
def test_one_token_bf16_attention_matches_sdpa_closely(arch):
    """The decode attention (fp32 math for one bf16 query) against transformers' own SDPA."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    torch.manual_seed(0)
    rt = zoo.load(f"tiny-{arch}", dtype="bfloat16")
    module = partial_forward.decoder_layers(rt.model)[0].self_attn
    q = torch.randn(1, 4, 1, 16, dtype=torch.bfloat16)
    k, v = torch.randn(1, 2, 40, 16, dtype=torch.bfloat16), torch.randn(1, 2, 40, 16, dtype=torch.bfloat16)
    mask = torch.ones(1, 1, 1, 40, dtype=torch.bool)
    mask[..., :9] = False  # e.g. a sliding window
    for m in (None, mask):
        ours, _ = attention.decode_attention(module, q, k, v, m, scaling=0.25)
        ref, _ = sdpa_attention_forward(module, q, k, v, m, scaling=0.25)
        assert ours.shape == ref.shape == (1, 1, 4, 16)
        assert (ours.float() - ref.float()).abs().max().item() < 2e-2


def test_backend_choice_errors_name_the_problem(tmp_path):
    from c2c.errors import ModelError

    with pytest.raises(ConfigError, match="unknown backend 'vllm'"):
        zoo.load("tiny-qwen2", backend="vllm")
    with pytest.raises(ModelError, match="no GGUF file"):
        zoo.gguf("tiny-qwen2")
    with pytest.raises(ConfigError, match="llama.cpp backend runs the GGUF as shipped"):
        zoo.load("SmolLM2-135M-Instruct", backend="llama.cpp", dtype="bfloat16")


def test_every_model_command_takes_dtype_and_backend():
    from c2c.cli.main import build_parser

    sub = next(a for a in build_parser()._actions if a.__class__.__name__ == "_SubParsersAction")
    for name in ("export", "continue", "demo", "serve", "advise"):
        dests = {a.dest for a in sub.choices[name]._actions}
        assert {"dtype", "backend"} <= dests, name
    assert "dtype" in {a.dest for a in sub.choices["verify"]._actions}
