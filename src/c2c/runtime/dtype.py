"""Which floating-point type a model runs in: ``auto`` picks bf16 where the hardware has it.

=============  ==========================================================
``auto``       ``bfloat16`` on CUDA, and on a CPU with AVX512-BF16 or AMX-BF16;
               else ``float32`` (the default, ``C2C_DTYPE``)
``float32``    the reference numerics (every test of exactness holds in it)
``bfloat16``   half the bytes per weight and per cached value: decode reads half
               the memory, and prefill runs on the CPU's bf16 dot products
``float16``    for CUDA; on a CPU it is slow and never chosen by ``auto``
``int8``       bf16 (fp32 without it) with int8 weights for one-token decode
               steps: decode reads half of bf16's bytes; prefill is bf16's
               (:mod:`c2c.runtime.transformers.int8`; transformers on x86 only)
=============  ==========================================================

The dtype is part of a model's fingerprint (and of every artifact), so a cache
made in one dtype is never attached to a runtime in another: exactness holds
within a dtype, and verification tolerances are stated per dtype
(:mod:`c2c.trust.verify`).
"""

from __future__ import annotations

import functools
from pathlib import Path

from c2c.config import DTYPES, settings
from c2c.errors import ConfigError
BF16_CPU_FLAGS = ("avx512_bf16", "amx_bf16")
ONEDNN_BF16_PACK_FLAGS = (("avx512bw", "avx512vl", "avx512dq"), ("avx_ne_convert",))  # any one set suffices


@functools.lru_cache(maxsize=1)
def cpu_flags() -> frozenset[str]:
    """The CPU's feature flags from ``/proc/cpuinfo`` (empty where there is none)."""
    try:
        text = Path("/proc/cpuinfo").read_text(errors="replace")
    except OSError:
        return frozenset()
    for line in text.splitlines():
        if line.startswith("flags"):
            return frozenset(line.split(":", 1)[1].split())
    return frozenset()


def cpu_can_pack_bf16() -> bool:
    """True when oneDNN can reorder bf16 weights into its blocked layout on this CPU (it needs
    AVX512-BW/VL/DQ or AVX-NE-CONVERT; elsewhere ``mkldnn._reorder_linear_weight`` raises). Plain
    bf16 ``F.linear`` runs on any CPU, emulated and slower where the CPU has no bf16."""
    flags = cpu_flags()
    return any(all(f in flags for f in need) for need in ONEDNN_BF16_PACK_FLAGS)


def cpu_has_bf16() -> bool:
    """True when the CPU computes bf16 natively (AVX512-BF16 or AMX-BF16)."""
    return any(f in cpu_flags() for f in BF16_CPU_FLAGS)


def torch_dtype(name: str) -> "torch.dtype":
    """The torch dtype a model of resolved dtype ``name`` holds its activations, K/V and full weights in
    (``int8``: bfloat16 where the CPU computes it, else float32)."""
    import torch  # lazy: this module is read by the CLI before any model loads

    if name == "int8":
        return torch.bfloat16 if cpu_has_bf16() else torch.float32
    return getattr(torch, name)


def resolve(dtype: str | None, device: str = "cpu") -> str:
    """The concrete dtype name for ``dtype`` (``None``: ``C2C_DTYPE``, else ``auto``) on ``device``.

    Raises:
        ConfigError: not one of :data:`DTYPES`.
    """
    if dtype is None:
        dtype = settings().dtype
    if dtype not in DTYPES:
        raise ConfigError(f"unknown dtype {dtype!r}; use one of {', '.join(DTYPES)}")
    if dtype != "auto":
        return dtype
    if str(device).startswith("cuda"):
        return "bfloat16"
    return "bfloat16" if cpu_has_bf16() else "float32"
