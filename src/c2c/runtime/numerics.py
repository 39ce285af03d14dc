"""What decides the bits of a forward pass on this machine, named for the fingerprint.

Two runtimes of one model, dtype and engine still compute different bits when their
kernels differ, and a cache handed between them is then close, not exact. Measured
(issue #31): on an Intel Xeon with AMX-BF16, the oneDNN-packed bf16 linear
(:mod:`c2c.runtime.transformers.packing`) gives other tokens than PyTorch's own bf16
``linear``; on an AMD EPYC with AVX512-BF16 and no AMX the two are bit-identical
(``tests/runtime/test_dtype.py``). Which kernel a library dispatches to depends on the
CPU's vendor (MKL's dispatch does) and on its ISA class, so both are named:

==================  ============================================================
``amx``             AMX-BF16 tiles (bf16 only: oneDNN uses them for bf16 products)
``avx512_bf16``     AVX512-BF16 dot products (bf16 only)
``avx512``          AVX-512 F/BW/VL/DQ
``avx2``            AVX2 + FMA
``baseline``        none of these (or not an x86 CPU: the machine's name is used)
==================  ============================================================

The engine's numerics string goes into :class:`~c2c.runtime.facts.EngineId` (hence into
the fingerprint), so a cache made under other numerics is refused for an exact handoff
and falls back to text in ``auto``; sampled verification compares within a tolerance
and ignores it.
"""

from __future__ import annotations

import functools
import platform
from pathlib import Path

from c2c.runtime.dtype import cpu_flags

_VENDORS = {"GenuineIntel": "intel", "AuthenticAMD": "amd"}


def _cpuinfo_field(name: str) -> str:
    """The first ``name : value`` of ``/proc/cpuinfo`` (``""`` where there is none)."""
    try:
        text = Path("/proc/cpuinfo").read_text(errors="replace")
    except OSError:
        return ""
    return next((line.split(":", 1)[1].strip() for line in text.splitlines()
                 if line.split(":", 1)[0].strip() == name), "")


@functools.lru_cache(maxsize=1)
def cpu_vendor() -> str:
    """``intel``, ``amd``, the raw ``vendor_id``, or the machine's name (e.g. ``aarch64``) without one."""
    vendor = _cpuinfo_field("vendor_id")
    if vendor:
        return _VENDORS.get(vendor, "".join(c for c in vendor if c.isalnum()) or "unknown")
    return platform.machine() or "unknown"


def cpu_model() -> str:
    """The CPU's model name from ``/proc/cpuinfo`` (``""`` where there is none)."""
    return _cpuinfo_field("model name")


def isa_class(dtype: str) -> str:
    """The widest ISA class of this CPU that a ``dtype`` product can use (see the module docstring)."""
    flags = cpu_flags()
    if dtype == "bfloat16":
        if "amx_bf16" in flags:
            return "amx"
        if "avx512_bf16" in flags:
            return "avx512_bf16"
    if all(f in flags for f in ("avx512f", "avx512bw", "avx512vl", "avx512dq")):
        return "avx512"
    if "avx2" in flags and "fma" in flags:
        return "avx2"
    return "baseline"


def cpu_numerics(dtype: str) -> str:
    """``cpu-<vendor>-<isa class>`` for products in ``dtype`` on this CPU, e.g. ``cpu-amd-avx512_bf16``."""
    return f"cpu-{cpu_vendor()}-{isa_class(dtype)}"


# the CPU flags a benchmark records beside its numbers (what decides bf16 and AMX kernels)
RECORDED_FLAGS = ("avx2", "fma", "avx512f", "avx512bw", "avx512vl", "avx512dq", "avx512_bf16", "avx512_vnni",
                  "avx_ne_convert", "amx_tile", "amx_bf16", "amx_int8")


def machine_record() -> dict:
    """The CPU as a benchmark records it: model, vendor, the flags that choose kernels, ISA classes."""
    flags = cpu_flags()
    return {"cpu_model": cpu_model(), "cpu_vendor": cpu_vendor(),
            "cpu_flags": [f for f in RECORDED_FLAGS if f in flags],
            "isa_class": {"float32": isa_class("float32"), "bfloat16": isa_class("bfloat16")}}
