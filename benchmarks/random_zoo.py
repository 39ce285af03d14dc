"""A zoo model with random weights of its real shapes: the speed benchmarks on a machine the weights cannot reach.

    # where the zoo model is pulled: everything but its weights (config, tokenizer, chat template, the
    # safetensors' names and shapes, and the GGUF's metadata without its tensors), ~25 MB for Qwen 0.5B
    .venv/bin/python benchmarks/random_zoo.py skeleton Qwen2.5-Coder-0.5B-Instruct --out build/skeleton

    # on the other machine: a zoo folder under $C2C_HOME with random weights (stored as the zoo stores
    # them: float32 safetensors) and a GGUF quantized as the zoo's (llama.cpp's quantizer, Q4_K_M)
    C2C_HOME=/tmp/c2c python benchmarks/random_zoo.py build build/skeleton

    # then any benchmark runs on it by its zoo name, e.g.
    C2C_HOME=/tmp/c2c python benchmarks/handoff_sweep.py --model Qwen2.5-Coder-0.5B-Instruct --lengths 256 ...

What it is for: timing. A forward pass costs the same for any values of weights of the same shapes
and storage, and the benchmarks that time pipelines force their token counts (``handoff.run``
decodes with ``min_new_tokens``, ``llama_text.py`` and ``runtime_speed.py`` block the end of turn),
so a pipeline over random weights does the work the real one does. What it is not for: anything that
reads the answers (agreement, accuracy, exactness against another engine). A folder it builds says
so in its ``c2c-pulled.json`` (``"random_weights": true``), and its weights digest is not the zoo's,
so no cache from it is ever taken for the real model's.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
from pathlib import Path

SKELETON_SKIP = ("model.gguf", "model.gguf.sha256.json", "c2c-pulled.json", "c2c-weights.sha256.json")


def skeleton(model: str, out: Path) -> Path:
    """Everything of the pulled zoo model ``model`` but its weights, into ``out``."""
    import gguf
    from safetensors import safe_open

    from c2c.runtime import zoo
    from gguf_quant import copy_metadata

    src = zoo.model_path(zoo.pull(model))
    out.mkdir(parents=True, exist_ok=True)
    tensors = {}
    for f in sorted(src.iterdir()):
        if f.suffix == ".safetensors":
            with safe_open(str(f), framework="pt") as st:
                for key in st.keys():
                    s = st.get_slice(key)
                    tensors[key] = {"file": f.name, "shape": list(s.get_shape()), "dtype": s.get_dtype()}
        elif f.is_file() and f.name not in SKELETON_SKIP:
            shutil.copy2(f, out / f.name)
    reader = gguf.GGUFReader(str(zoo.gguf(model)))
    w = gguf.GGUFWriter(str(out / "metadata.gguf"), reader.get_field("general.architecture").contents())
    copy_metadata(reader, w)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    quant = reader.get_field("general.file_type").contents()
    (out / "skeleton.json").write_text(json.dumps({"name": zoo.resolve(model).name, "architecture":
                                                   zoo.resolve(model).architecture, "gguf_file_type": quant,
                                                   "tensors": tensors}, indent=1))
    return out


def _random(name: str, shape: list[int], generator):
    """A tensor of ``shape`` for weight ``name``: norms 1, biases small, matrices as transformers initializes
    them (normal, std 0.02)."""
    import torch

    if name.endswith("norm.weight"):
        return torch.ones(shape)
    std = 0.01 if name.endswith(".bias") else 0.02
    return torch.randn(shape, generator=generator) * std


def build(skel: Path, *, quant: str, threads: int, seed: int = 0) -> Path:
    """The zoo folder of ``skel``'s model under ``$C2C_HOME``, with random weights and a quantized GGUF."""
    import llama_cpp
    import torch
    from safetensors.torch import save_file

    from c2c.runtime import zoo
    from gguf_quant import quantize, write_bf16_gguf

    meta = json.loads((skel / "skeleton.json").read_text())
    out = zoo.models_dir() / meta["name"]
    if out.exists():
        shutil.rmtree(out)
    out.mkdir()
    for f in skel.iterdir():
        if f.name not in ("skeleton.json", "metadata.gguf"):
            shutil.copy2(f, out / f.name)
    g = torch.Generator().manual_seed(seed)
    files: dict[str, dict] = {}
    dtypes = {"F32": torch.float32, "BF16": torch.bfloat16, "F16": torch.float16}   # safetensors' names
    for key, t in meta["tensors"].items():
        files.setdefault(t["file"], {})[key] = _random(key, t["shape"], g).to(dtypes[t["dtype"]])
    for name, state in files.items():
        save_file(state, str(out / name))
    (out / "c2c-pulled.json").write_text(json.dumps({"name": meta["name"], "architecture": meta["architecture"],
                                                     "random_weights": True, "seed": seed}))
    names = {v: k.removeprefix("LLAMA_FTYPE_MOSTLY_") for k, v in vars(llama_cpp).items()
             if k.startswith("LLAMA_FTYPE_MOSTLY_")}
    kind = quant or names[meta["gguf_file_type"]]
    with tempfile.TemporaryDirectory(prefix="c2c-random-", dir=zoo.models_dir()) as work:
        bf16 = write_bf16_gguf(meta["name"], Path(work) / "bf16.gguf", metadata=skel / "metadata.gguf")
        quantize(bf16, kind, out / zoo.GGUF_NAME, threads)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("skeleton", help="write everything of a pulled zoo model but its weights")
    s.add_argument("model")
    s.add_argument("--out", required=True)
    b = sub.add_parser("build", help="a zoo folder under $C2C_HOME with random weights of the skeleton's shapes")
    b.add_argument("skeleton")
    b.add_argument("--quant", default=None, help="llama.cpp file type of the GGUF (default: the zoo file's)")
    b.add_argument("--threads", type=int, default=2)
    b.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    if args.cmd == "skeleton":
        print(skeleton(args.model, Path(args.out)))
    else:
        print(build(Path(args.skeleton), quant=args.quant, threads=args.threads, seed=args.seed))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
