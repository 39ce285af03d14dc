import pytest

from c2c.artifact.fingerprint import Fingerprint
from c2c.errors import FingerprintMismatchError


def test_same_model_same_fingerprint(tiny):
    rt = tiny("qwen2")
    a, b = Fingerprint.of(rt), Fingerprint.of(rt)
    assert a == b and a.digest == b.digest and a.diff(b) == {}
    assert Fingerprint.from_dict(a.to_dict()) == a


def test_diff_names_every_differing_field(tiny):
    q, l = Fingerprint.of(tiny("qwen2")), Fingerprint.of(tiny("llama"))
    d = q.diff(l)
    assert {"architecture", "rope", "weights_digest"} <= set(d)
    assert "model_name" not in d
    with pytest.raises(FingerprintMismatchError) as e:
        q.require_same(l)
    assert "architecture" in str(e.value) and set(e.value.differences) == set(d)


def test_adapters_and_dtype_change_the_fingerprint(tiny):
    from dataclasses import replace

    fp = Fingerprint.of(tiny("qwen2"))
    assert replace(fp, adapters=("role-coder",)).diff(fp) == {"adapters": (("role-coder",), ())}
    assert set(replace(fp, dtype="bfloat16").diff(fp)) == {"dtype"}
    assert replace(fp, model_name="x").digest == fp.digest  # the name is informational


def test_fingerprint_covers_gemma_layer_types_and_two_rope_bases(tiny):
    fp = Fingerprint.of(tiny("gemma3"))
    assert "sliding_attention" in fp.layer_types and "full_attention" in fp.layer_types
    assert fp.sliding_window == 16
    assert "sliding_attention" in fp.rope and "10000" in fp.rope and "1000000" in fp.rope


def test_weights_digest_is_cached_and_tracks_changes(tiny, tmp_path):
    import shutil

    from c2c.canon import weights_digest

    src = tiny("llama").path
    dst = tmp_path / "m"
    shutil.copytree(src, dst)
    d1 = weights_digest(dst)
    assert (dst / "c2c-weights.sha256.json").is_file()
    assert weights_digest(dst) == d1
    f = next(dst.glob("*.safetensors"))
    data = bytearray(f.read_bytes())
    data[-1] ^= 0xFF
    f.write_bytes(bytes(data))
    assert weights_digest(dst) != d1
