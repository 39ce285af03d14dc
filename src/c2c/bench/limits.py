"""The machine's limits and what a model's forward passes cost against them: the compute bound.

Measured on the threads torch runs on, in the benchmark's own process:

- :func:`memory_bandwidth`: a STREAM-like read (the best of three reductions over 1 GiB) and copy, in GB/s;
- :func:`gemm_gflops`: one prefill-sized matrix product (512x896 by 896x4864, Qwen2.5-0.5B's MLP)
  in fp32, bf16, and bf16 packed for oneDNN.

Counted from the model as the runtime holds it (transformers runtimes only):

- :func:`decode_bytes`: the bytes one decode step reads (each linear layer as the step reads it:
  int8, packed bf16 or dense; norms; one embedding row; the K/V it attends to);
- :func:`prefill_flops`: the floating-point operations of a forward pass over ``n`` new tokens after
  ``past`` cached ones (every linear layer on every token, the LM head on the last token only, and
  causal attention's two products).

:meth:`PassCost.seconds` is the least time one forward pass can take on this machine: the larger
of its FLOPs at the best measured GEMM rate and its bytes at the measured read bandwidth. A
pipeline's compute bound is the sum over its passes (:class:`Bound`); measured time over it says
how far the pipeline runs from the hardware.
"""

from __future__ import annotations

import time
from dataclasses import dataclass


def memory_bandwidth(gib: float = 1.0, repeats: int = 5) -> dict:
    """GB/s of a read and a copy (read plus write) over ``gib`` GiB, best of ``repeats``, on torch's threads: what
    a decode step, which reads every weight once, can draw at most. The read is the best of three reductions
    (one fp32 sum, fp32 row sums, one bf16 sum): on a shared VM a single kind under-reads by up to 2x."""
    import torch  # lazy: the module imports without torch until it measures

    n = int(gib * (1 << 30) // 4) // (1 << 20) * (1 << 20)   # whole rows of 1 Mi floats
    a, b = torch.ones(n), torch.empty(n)
    rows, half = a.view(-1, 1 << 20), torch.ones(2 * n, dtype=torch.bfloat16)
    reads = {"fp32_sum": a.sum, "fp32_row_sums": lambda: rows.sum(1), "bf16_sum": half.sum}
    best = {f"read_{k}_gb_s": 0.0 for k in reads} | {"copy_gb_s": 0.0}
    for _ in range(repeats):
        for k, f in reads.items():
            t0 = time.perf_counter()
            f()
            best[f"read_{k}_gb_s"] = max(best[f"read_{k}_gb_s"], 4 * n / (time.perf_counter() - t0) / 1e9)
        t0 = time.perf_counter()
        b.copy_(a)
        best["copy_gb_s"] = max(best["copy_gb_s"], 8 * n / (time.perf_counter() - t0) / 1e9)
    del a, b, rows, half
    return {"read_gb_s": max(best[f"read_{k}_gb_s"] for k in reads), **best, "gib": gib}


def gemm_gflops(m: int = 512, k: int = 896, n: int = 4864, repeats: int = 10) -> dict:
    """Throughput of one prefill-sized matrix product: fp32, bf16, and bf16 packed for oneDNN."""
    import torch  # lazy: the module imports without torch until it measures

    from c2c.runtime.transformers import packing  # lazy: transformers loads only when measuring

    x, w = torch.randn(m, k), torch.randn(n, k)
    lin = torch.nn.Linear(k, n, bias=False)
    lin.weight.data = w.bfloat16()
    packed = packing.PackedLinear(lin) if packing.can_pack(torch.nn.Sequential(lin)) else None
    cases = {"float32": lambda: torch.nn.functional.linear(x, w),
             "bfloat16": lambda: torch.nn.functional.linear(x.bfloat16(), lin.weight)}
    if packed is not None:
        xb = x.bfloat16()
        cases["bfloat16_packed"] = lambda: packed(xb)
    out = {}
    with torch.inference_mode():
        for name, f in cases.items():
            f()
            t0 = time.perf_counter()
            for _ in range(repeats):
                f()
            out[name] = 2 * m * k * n * repeats / (time.perf_counter() - t0) / 1e9
    return out


def _linears(rt) -> tuple[list[tuple[int, int]], tuple[int, int] | None]:
    """``(in, out)`` of every linear layer a forward pass runs, and the LM head's apart (``None`` if not found)."""
    import torch  # lazy: the module imports without torch until it counts

    from c2c.runtime.transformers import int8, packing  # lazy: transformers loads only when counting

    head = getattr(rt.model, "lm_head", None)
    body, head_shape, seen = [], None, set()
    for m in rt.model.modules():
        if id(m) in seen:
            continue
        if isinstance(m, (int8.Int8DecodeLinear, packing.PackedLinear, torch.nn.Linear)):
            seen.update(id(x) for x in m.modules())
            shape = (m.in_features, m.out_features)
            if m is head:
                head_shape = shape
            else:
                body.append(shape)
    return body, head_shape


def decode_bytes(rt, context: int) -> int:
    """Bytes one decode step reads, from the weights' storage: every linear layer as the step reads it (the
    int8 copy, the packed bf16 or the dense weight), the norms, one embedding row, and the K/V of ``context``
    positions. (The embedding table is read one row per token; a tied LM head is counted as its linear.)"""
    import torch  # lazy: the module imports without torch until it counts

    from c2c.runtime.transformers import int8, packing  # lazy: transformers loads only when counting

    total = 0
    seen: set[int] = set()
    for m in rt.model.modules():
        if isinstance(m, int8.Int8DecodeLinear):
            bias = getattr(m.full, "bias", None)
            total += m.in_features * m.out_features + 4 * m.out_features   # int8 weights, fp32 scales
            total += bias.numel() * bias.element_size() if bias is not None else 0
            seen.update(id(x) for x in m.modules())
        elif id(m) in seen:
            continue
        elif isinstance(m, packing.PackedLinear):
            total += m.in_features * m.out_features * 2 + (m.bias.numel() * m.bias.element_size() if m.bias
                                                          is not None else 0)
        elif isinstance(m, torch.nn.Linear):
            total += sum(p.numel() * p.element_size() for p in m.parameters(recurse=False))
        elif isinstance(m, torch.nn.Embedding):
            total += m.embedding_dim * m.weight.element_size()
        elif "norm" in type(m).__name__.lower():
            total += sum(p.numel() * p.element_size() for p in m.parameters(recurse=False))
    f = rt.facts
    kv = 2 * f.num_layers * f.kv_heads * f.head_dim * context * torch.empty((), dtype=rt.dtype).element_size()
    return total + kv


def prefill_flops(rt, n: int, past: int = 0) -> float:
    """FLOPs of one forward pass over ``n`` new tokens after ``past`` cached ones: ``2·in·out`` per token for
    every linear layer, the LM head on the last token only, and causal attention's ``Q·Kᵀ`` and ``P·V``
    (``2·2·heads·head_dim`` per attended position; token ``i`` attends to ``past + i + 1`` positions)."""
    body, head = _linears(rt)
    cfg = rt.model.config
    heads = getattr(cfg, "num_attention_heads", rt.facts.kv_heads)
    attended = n * past + n * (n + 1) / 2                     # Σ over the n tokens of (past + i + 1)
    attention = 4 * rt.facts.num_layers * heads * rt.facts.head_dim * attended
    return 2.0 * n * sum(i * o for i, o in body) + (2.0 * head[0] * head[1] if head else 0.0) + attention


@dataclass(frozen=True, kw_only=True)
class Limits:
    """This machine's measured limits: ``gemm_gflops`` (the best of :func:`gemm_gflops`' kinds) and
    ``read_gb_s`` (:func:`memory_bandwidth`'s read)."""

    gemm_gflops: float
    read_gb_s: float

    @classmethod
    def measure(cls) -> Limits:
        return cls(gemm_gflops=max(gemm_gflops().values()), read_gb_s=memory_bandwidth()["read_gb_s"])

    @classmethod
    def best(cls, measured: list[Limits]) -> Limits:
        """The best of several measurements of each limit: on a shared machine a single one can read low, which
        would make the bound loose (too slow) and a pipeline look closer to it than it is."""
        return cls(gemm_gflops=max(m.gemm_gflops for m in measured), read_gb_s=max(m.read_gb_s for m in measured))


@dataclass(frozen=True, kw_only=True)
class PassCost:
    """What one forward pass must do: ``flops`` (:func:`prefill_flops`) and ``bytes`` read (:func:`decode_bytes`
    of the positions it ends with). For the int8 runtime the bytes are the int8 copies' even for a prefill,
    which reads the bf16 weights: a prefill is bound by its FLOPs there, so the bound does not change."""

    flops: float
    bytes: int

    def seconds(self, limits: Limits) -> float:
        """The least time the pass can take: its FLOPs at the GEMM rate or its bytes at the read bandwidth,
        whichever is larger."""
        return max(self.flops / (limits.gemm_gflops * 1e9), self.bytes / (limits.read_gb_s * 1e9))


def pass_cost(rt, n: int, past: int) -> PassCost:
    """The cost of a forward pass of ``n`` tokens after ``past`` cached ones."""
    return PassCost(flops=prefill_flops(rt, n, past), bytes=decode_bytes(rt, past + n))


@dataclass(frozen=True, kw_only=True)
class Bound:
    """The compute bound of a sequence of forward passes, split as prefill and decode seconds."""

    prefill_s: float
    decode_s: float

    @property
    def seconds(self) -> float:
        return self.prefill_s + self.decode_s

    @classmethod
    def of(cls, prefills: list[PassCost], decodes: list[PassCost], limits: Limits) -> Bound:
        return cls(prefill_s=sum(c.seconds(limits) for c in prefills),
                   decode_s=sum(c.seconds(limits) for c in decodes))
