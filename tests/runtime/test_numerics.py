"""Numerics named, not assumed: what changes the bits of a forward pass is in the fingerprint.

Measured in issue #31: on an Intel Xeon with AMX-BF16 the oneDNN-packed bf16 linear gives other tokens
than PyTorch's bf16 ``linear``; on the AMD EPYC (AVX512-BF16, no AMX) the two are bit-identical. So a
runtime's engine id names the CPU's vendor and ISA class and the linear kernel, and two runtimes that
differ there never hand a cache over as exact (``decide`` takes text in ``auto``), while a check within
a tolerance (``c2c verify``) still accepts it.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from c2c.artifact.fingerprint import Fingerprint
from c2c.errors import FingerprintMismatchError
from c2c.runtime import dtype as dt
from c2c.runtime import numerics
from c2c.runtime.transformers import TransformersRuntime

AMX_XEON = {"avx2", "fma", "avx512f", "avx512bw", "avx512vl", "avx512dq", "avx512_bf16", "amx_tile", "amx_bf16"}
EPYC = {"avx2", "fma", "avx512f", "avx512bw", "avx512vl", "avx512dq", "avx512_bf16"}


@pytest.mark.parametrize("flags, bf16, fp32", [
    (AMX_XEON, "amx", "avx512"),
    (EPYC, "avx512_bf16", "avx512"),
    ({"avx2", "fma", "avx512f"}, "avx2", "avx2"),       # AVX-512 F alone is not the class oneDNN packs for
    ({"avx2", "fma"}, "avx2", "avx2"),
    (set(), "baseline", "baseline"),
])
def test_the_isa_class_is_the_widest_one_a_dtype_can_use(monkeypatch, flags, bf16, fp32):
    monkeypatch.setattr(numerics, "cpu_flags", lambda: frozenset(flags))
    assert (numerics.isa_class("bfloat16"), numerics.isa_class("float32")) == (bf16, fp32)


def test_this_machine_is_described_as_its_cpuinfo_says():
    text = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").is_file() else ""
    rec = numerics.machine_record()
    assert rec["cpu_model"] == (text.split("model name", 1)[1].split(":", 1)[1].split("\n")[0].strip()
                                if "model name" in text else "")
    assert set(rec["cpu_flags"]) == set(numerics.RECORDED_FLAGS) & dt.cpu_flags()
    assert numerics.cpu_numerics("float32") == f"cpu-{numerics.cpu_vendor()}-{numerics.isa_class('float32')}"
    if "GenuineIntel" in text or "AuthenticAMD" in text:
        assert numerics.cpu_vendor() == ("intel" if "GenuineIntel" in text else "amd")


def test_a_cache_from_an_amx_machine_is_not_exact_on_one_without(tiny, monkeypatch):
    rt = tiny("qwen2")
    monkeypatch.setattr(numerics, "cpu_flags", lambda: frozenset(AMX_XEON))
    monkeypatch.setattr(numerics, "cpu_vendor", lambda: "intel")
    xeon = Fingerprint.of(rt)
    monkeypatch.setattr(numerics, "cpu_flags", lambda: frozenset(EPYC))
    monkeypatch.setattr(numerics, "cpu_vendor", lambda: "amd")
    epyc = Fingerprint.of(rt)
    assert "cpu-intel-avx512" in xeon.backend.numerics and "cpu-amd-avx512" in epyc.backend.numerics  # fp32
    assert set(xeon.diff(epyc)) == {"backend"} and xeon.diff(epyc, exact=False) == {}
    with pytest.raises(FingerprintMismatchError, match="numerics: torch-.*/cpu-amd-avx512/linear-dense != "
                                                       "torch-.*/cpu-intel-avx512/linear-dense"):
        epyc.require_same(xeon)
    epyc.require_same(xeon, exact=False)


def test_decide_takes_text_in_auto_when_only_the_numerics_differ(tiny):
    from c2c.artifact.prefix import PrefixRef
    from c2c.handoff import HandoffPolicy, decide
    from c2c.handoff.decide import Party

    fp = Fingerprint.of(tiny("qwen2"))
    other = replace(fp, backend=replace(fp.backend, numerics="torch-x/cpu-intel-amx/linear-onednn-packed"))
    prefix = PrefixRef.of((1, 2, 3))
    a = Party(name="a", domain="d", fingerprint=other, prefix=prefix)
    b = Party(name="b", domain="d", fingerprint=fp, prefix=prefix)
    d = decide(a, b, HandoffPolicy(mode="auto"))
    assert d.path == "text" and "backend" in d.reason
    assert decide(replace(a, fingerprint=fp), b, HandoffPolicy(mode="auto")).path != "text"


@pytest.mark.skipif(not dt.cpu_can_pack_bf16(), reason="a CPU oneDNN cannot pack bf16 for")
def test_packing_is_named_in_the_fingerprint_and_unpacking_changes_only_that(tiny):
    rt = TransformersRuntime.load(tiny("qwen2").path, name="tiny-qwen2", dtype="bfloat16")  # own copy: unpacked below
    packed = Fingerprint.of(rt)
    assert rt.packed > 0 and packed.backend.numerics.endswith("/linear-onednn-packed")
    assert f"/cpu-{numerics.cpu_vendor()}-{numerics.isa_class('bfloat16')}/" in packed.backend.numerics
    rt.ensure_dense()
    dense = Fingerprint.of(rt)
    assert dense.backend.numerics.endswith("/linear-dense")
    assert set(packed.diff(dense)) == {"backend"} and packed.diff(dense, exact=False) == {}


def test_verification_within_a_tolerance_accepts_a_cache_of_other_numerics(tiny):
    """``c2c verify`` compares K/V within a tolerance: another CPU class is not a mismatch there."""
    from c2c.artifact import Artifact
    from c2c.artifact.prefix import PrefixRef
    from c2c.trust.verify import verify_kv

    rt = tiny("qwen2")
    ids = rt.encode("The quick brown fox jumps over the lazy dog.")
    _, cache = rt.prefill(ids)
    fp = Fingerprint.of(rt)
    other = replace(fp, backend=replace(fp.backend, numerics="torch-x/cpu-intel-amx/linear-onednn-packed"))
    art = Artifact.build(cache, fingerprint=other, prefix=PrefixRef.of(ids[:2]))
    assert verify_kv(art, rt, mode="strict").passed
    assert verify_kv(art, rt, mode="sample", samples=4).passed
    with pytest.raises(FingerprintMismatchError):
        fp.require_same(other)  # ... but it is not exact here


def test_setup_never_builds_llama_cpp_with_amx_even_on_an_amx_cpu(tmp_path):
    """An AMX build of llama.cpp died with an illegal instruction on a 512-token prefill on these machines:
    the flags scripts/setup.sh derives from /proc/cpuinfo name every SIMD level but never turn AMX on."""
    import re
    import subprocess

    setup = (Path(__file__).resolve().parents[2] / "scripts" / "setup.sh").read_text()
    block = re.search(r'^if \[ -z "\$\{CMAKE_ARGS:-\}" \].*?^fi$', setup, re.S | re.M).group(0)
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text("flags\t\t: " + " ".join(sorted(AMX_XEON | {"avx", "f16c", "amx_int8"})) + "\n")
    script = block.replace("/proc/cpuinfo", str(cpuinfo)).replace('[ "$(uname -m)" = x86_64 ]', "true")
    args = subprocess.run(["bash", "-c", f"CMAKE_ARGS=; {script}\necho \"$CMAKE_ARGS\""], capture_output=True,
                          text=True, check=True).stdout
    assert "-DGGML_AVX512=ON" in args and "-DGGML_AVX512_BF16=ON" in args and "-DGGML_NATIVE=OFF" in args
    assert "AMX" not in args.upper()  # ggml's GGML_AMX_* options default to OFF


def test_the_installed_llama_cpp_reports_the_features_it_was_built_with():
    llama_cpp = pytest.importorskip("llama_cpp")
    from c2c.runtime.llama_cpp import build_features

    features = build_features()
    info = llama_cpp.llama_print_system_info().decode().upper()  # "CPU : SSE3 = 1 | AVX = 1 | ... |"
    assert features and all(f"{f.upper()} = 1" in info for f in features)
    assert sum(info.count(f"{f.upper()} = 1") for f in features) >= info.count("= 1")  # every one found
    if not any(f.startswith("amx") for f in dt.cpu_flags()):
        assert not any(f.startswith("amx") for f in features)  # no AMX build on a CPU without it
