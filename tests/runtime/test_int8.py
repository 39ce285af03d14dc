"""The int8 dtype: prefill is bf16's bit for bit, a one-token step reads int8 weights, and the fingerprint says so."""

from __future__ import annotations

import threading

import pytest
import torch

from c2c.artifact.fingerprint import Fingerprint
from c2c.errors import RuntimeUnsupportedError
from c2c.runtime import dtype as dt
from c2c.runtime import zoo
from c2c.runtime.transformers import int8, packing

FULL = str(dt.torch_dtype("int8")).removeprefix("torch.")   # what int8 prefills in: bfloat16, or float32
needs_int8 = pytest.mark.skipif(int8.available() is not None, reason=f"int8 cannot run here: {int8.available()}")


@needs_int8
@pytest.mark.parametrize("arch", ["qwen2", "llama", "gemma3"])
def test_int8_prefills_as_bf16_and_decodes_on_int8_weights(arch):
    full = zoo.load(f"tiny-{arch}", dtype=FULL)
    q = zoo.load(f"tiny-{arch}", dtype="int8")
    assert q.int8 > 0 and q.dtype == full.dtype
    wrapped = {id(m.full) for m in q.model.modules() if isinstance(m, int8.Int8DecodeLinear)}
    linears = [m for m in q.model.modules() if isinstance(m, (torch.nn.Linear, packing.PackedLinear))]
    # every linear layer has an int8 copy; the LM head keeps its full weights beside it, to re-score its best
    assert linears and all(id(m) in wrapped for m in linears)
    assert isinstance(q.model.lm_head, int8.Int8DecodeHead) and q.int8 == len(linears)
    ids = list(range(3, 60))
    logits, cache = q.prefill(ids)
    ref_logits, ref_cache = full.prefill(ids)
    assert cache.max_abs_diff(ref_cache) == 0  # prefill's K/V: the full weights, bit for bit
    # its last row's logits go through the head as a decode step's do: the int8 copy's best, re-scored on the
    # full weights (in fp32 sums, so within a few bf16 roundings of bf16's), pick bf16's token
    best = logits.float().topk(int8.TOP_K).indices
    assert int(logits.argmax()) == int(ref_logits.argmax())
    assert (logits[best].float() - ref_logits[best].float()).abs().max() <= 2 ** -6 * ref_logits.float().abs().max()
    step, after = q.prefill([7], cache)
    ref_step, ref_after = full.prefill([7], ref_cache)
    assert not torch.equal(step, ref_step)  # the one-token step ran on int8 weights
    cos = torch.nn.functional.cosine_similarity(step.float(), ref_step.float(), dim=0)
    assert cos > 0.98, cos
    assert 0 < after.max_abs_diff(ref_after) < 0.5  # only the new position's K/V differ
    assert 0 < len(q.generate(ids, max_new_tokens=5).token_ids) <= 5
    q.ensure_dense()  # LoRA and gradients: the int8 copies go, the numerics are the full runtime's again
    assert q.int8 == 0 and not any(isinstance(m, int8.Int8DecodeLinear) for m in q.model.modules())
    assert torch.equal(q.prefill([7], cache)[0], full.prefill([7], ref_cache)[0])


@needs_int8
def test_the_fingerprint_names_int8_and_never_passes_it_as_exact_for_bf16():
    q, b = zoo.load("tiny-qwen2", dtype="int8"), zoo.load("tiny-qwen2", dtype=FULL)
    assert str(q.engine_id).endswith(f"+{int8.kernel_name()}") and "int8" not in str(b.engine_id)
    assert set(Fingerprint.of(q).diff(Fingerprint.of(b))) == {"backend"}


def test_without_vnni_activations_keep_7_bits_and_the_numerics_say_so(monkeypatch):
    monkeypatch.setattr(int8, "cpu_flags", lambda: frozenset({"avx512f"}))
    assert int8.reduce_range() and int8.kernel_name() == "int8-decode-7bit"
    monkeypatch.setattr(int8, "cpu_flags", lambda: frozenset({"avx512f", "avx512_vnni"}))
    assert not int8.reduce_range() and int8.kernel_name() == "int8-decode"


def test_int8_refuses_where_it_cannot_run_naming_the_way_out(monkeypatch):
    monkeypatch.setattr(int8, "available", lambda: "PyTorch's quantized engine is 'qnnpack'")
    with pytest.raises(RuntimeUnsupportedError, match="--dtype bfloat16 or float32"):
        zoo.load("tiny-qwen2", dtype="int8")
    assert dt.torch_dtype("int8") in (torch.bfloat16, torch.float32)
    assert dt.resolve("int8") == "int8"


@needs_int8
def test_the_heads_one_token_step_picks_among_logits_of_the_full_weights():
    torch.manual_seed(0)
    lin = torch.nn.Linear(64, 500)
    head = int8.Int8DecodeHead(lin, lin.weight.detach())
    x = torch.randn(1, 1, 64)
    y, exact = head(x)[0, 0], lin(x)[0, 0]                       # (500,) each
    rough = torch.ops.quantized.linear_dynamic(x.reshape(1, -1), head.int8, head.reduce_range)[0]
    best = rough.topk(int8.TOP_K).indices
    assert torch.allclose(y[best], exact[best], atol=1e-5)        # the int8 copy's best, re-scored on full weights
    rest = torch.ones(500, dtype=torch.bool)
    rest[best] = False
    assert torch.equal(y[rest], rough[rest])                      # the rest stay int8's
    assert not torch.allclose(y[rest], exact[rest], atol=1e-5)    # (which differ from the full weights')
    assert int(y.argmax()) == int(exact.argmax())
    rows = torch.randn(1, 3, 64)
    assert torch.equal(head(rows), lin(rows))                      # more than one row: the full weights alone


@needs_int8
def test_siblings_share_one_product_and_each_gets_its_own_layers_bits():
    torch.manual_seed(1)

    class Attn(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.q_proj, self.k_proj, self.v_proj = (torch.nn.Linear(32, n, bias=b) for n, b in
                                                     ((32, True), (8, False), (8, True)))

    ref = Attn()
    alone = {name: int8.Int8DecodeLinear(getattr(ref, name)) for name in ("q_proj", "k_proj", "v_proj")}
    shared = Attn()
    shared.load_state_dict(ref.state_dict())
    packing.replace_modules(shared, lambda m: type(m) is torch.nn.Linear, int8.Int8DecodeLinear)
    assert int8.share_siblings(shared) == 1 and shared.q_proj.int8 is None   # one int8 matrix for the three
    x, other = torch.randn(1, 1, 32), torch.randn(1, 1, 32)
    for order in (("q_proj", "k_proj", "v_proj"), ("v_proj", "q_proj", "k_proj")):
        for name in order:                                 # bit for bit the separate layers' products
            assert torch.equal(getattr(shared, name)(x), alone[name](x))
    xb = x.bfloat16()                                      # a bf16 row: rounded once for all, as each rounds
    for name in ("k_proj", "q_proj", "v_proj"):
        y = getattr(shared, name)(xb)
        assert y.dtype == torch.bfloat16 and torch.equal(y, alone[name](xb))
    assert torch.equal(shared.q_proj(x), alone["q_proj"](x))
    assert torch.equal(shared.k_proj(other), alone["k_proj"](other))   # another row mid-round: computed anew
    assert torch.equal(shared.q_proj(x), alone["q_proj"](x))           # a sibling twice in a round: anew too
    rows = torch.randn(1, 3, 32)
    assert torch.equal(shared.v_proj(rows), ref.v_proj(rows))          # more than one row: the full weights
    errors = []

    def steps(row):   # two threads on one model: each gets its own row's products, never the other's
        for _ in range(200):
            for name in ("q_proj", "k_proj", "v_proj"):
                if not torch.equal(getattr(shared, name)(row), alone[name](row)):
                    errors.append(name)

    threads = [threading.Thread(target=steps, args=(r,)) for r in (x, other)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    int8.dequantize_linears(shared)
    assert type(shared.q_proj) is torch.nn.Linear and torch.equal(shared.q_proj(x), ref.q_proj(x))
