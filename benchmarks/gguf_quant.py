"""Which GGUF quantization to run on llama.cpp: speed and answers of each, measured in one run.

    .venv/bin/python benchmarks/gguf_quant.py                   # Qwen2.5-Coder-0.5B, 200 prompts
    .venv/bin/python benchmarks/gguf_quant.py --prompts 50 --types Q8_0,Q4_K_M

The zoo ships one quantization per model (Qwen2.5-Coder-0.5B: Q4_K_M). This benchmark builds the
others from the model's own weights and measures them against each other:

1. **A lossless GGUF.** The zoo's transformers weights (bf16) are written as a GGUF with bf16
   matrices and f32 norms and biases, its metadata (tokenizer, chat template, hyper-parameters)
   copied from the zoo's own GGUF file, the tensors named as llama.cpp names them (the ``gguf``
   package: ``pip install -e '.[gguf]'``). Only models
   whose GGUF keeps transformers' Q/K layout are converted (``qwen2``: NEOX RoPE, no permutation).
2. **Each quantization** (``--types``) made from it with llama.cpp's own quantizer
   (``llama_model_quantize``, no importance matrix), and the zoo's shipped file beside them.
3. **Speed**, as ``benchmarks/runtime_speed.py`` times llama.cpp: a ``--prompt-tokens`` prompt then
   ``--decode-tokens`` greedy tokens, median of ``--repeats``; the file's bytes over decode time
   against the read bandwidth measured in this run.
4. **Answers**: on ``--prompts`` instructions of the training corpora (``$C2C_DATA/train``, the
   prompts and seed of ``benchmarks/int8_quality.py``; never an evaluation split), c2c's bf16
   runtime answers greedily and each file is teacher-forced along that answer (one evaluation of
   prompt + answer, all logits kept); agreement is the share of answer positions whose argmax equals
   bf16's token, pooled, with a 95% bootstrap interval over prompts.

Outputs benchmarks/results/gguf_quant.{json,md,jsonl,png} (or ``--out PREFIX``), one record per
(prompt, file) in the JSONL, with the machine. The built files go to ``--work`` (default: a
temporary folder, removed at the end).
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"
TYPES = "Q8_0,Q6_K,Q5_K_M,Q4_K_M,Q4_0"

# transformers' tensor names -> llama.cpp's (qwen2; the layer index replaces {i})
_NAMES = {
    "model.embed_tokens.weight": "token_embd.weight",
    "model.norm.weight": "output_norm.weight",
    "lm_head.weight": "output.weight",
    "model.layers.{i}.input_layernorm.weight": "blk.{i}.attn_norm.weight",
    "model.layers.{i}.post_attention_layernorm.weight": "blk.{i}.ffn_norm.weight",
    "model.layers.{i}.self_attn.q_proj.weight": "blk.{i}.attn_q.weight",
    "model.layers.{i}.self_attn.q_proj.bias": "blk.{i}.attn_q.bias",
    "model.layers.{i}.self_attn.k_proj.weight": "blk.{i}.attn_k.weight",
    "model.layers.{i}.self_attn.k_proj.bias": "blk.{i}.attn_k.bias",
    "model.layers.{i}.self_attn.v_proj.weight": "blk.{i}.attn_v.weight",
    "model.layers.{i}.self_attn.v_proj.bias": "blk.{i}.attn_v.bias",
    "model.layers.{i}.self_attn.o_proj.weight": "blk.{i}.attn_output.weight",
    "model.layers.{i}.mlp.gate_proj.weight": "blk.{i}.ffn_gate.weight",
    "model.layers.{i}.mlp.up_proj.weight": "blk.{i}.ffn_up.weight",
    "model.layers.{i}.mlp.down_proj.weight": "blk.{i}.ffn_down.weight",
}
_CONVERTIBLE = ("qwen2",)


def gguf_name(hf: str) -> str | None:
    """llama.cpp's name of a transformers tensor of a qwen2 model (``None``: not one llama.cpp keeps)."""
    parts = hf.split(".")
    if len(parts) > 2 and parts[1] == "layers" and parts[2].isdigit():
        key, i = ".".join(parts[:2] + ["{i}"] + parts[3:]), parts[2]
        return _NAMES[key].format(i=i) if key in _NAMES else None
    return _NAMES.get(hf)


def write_bf16_gguf(model: str, out: Path, *, metadata: Path | None = None) -> Path:
    """The zoo model's transformers weights as a GGUF (bf16 matrices, f32 vectors), its metadata copied from the
    zoo's GGUF file (or from ``metadata``, a GGUF of the same model: ``random_zoo.py``'s holds no tensors, and then
    the tensor names are not compared). Refuses an architecture whose GGUF stores Q/K in another layout than
    transformers'."""
    try:
        import gguf
    except ImportError:
        raise SystemExit("benchmarks/gguf_quant.py writes GGUF files with the gguf package: "
                         ".venv/bin/pip install -e '.[gguf]'") from None
    import numpy as np
    import torch
    from safetensors import safe_open

    from c2c.runtime import zoo

    src = gguf.GGUFReader(str(metadata or zoo.gguf(model)))
    arch = src.get_field("general.architecture").contents()
    if arch not in _CONVERTIBLE:
        raise SystemExit(f"{model}: its GGUF architecture {arch!r} is not converted here (only {_CONVERTIBLE}: "
                         "llama-arch files permute Q/K for interleaved RoPE)")
    w = gguf.GGUFWriter(str(out), arch)
    copy_metadata(src, w)
    w.add_file_type(gguf.LlamaFileType.MOSTLY_BF16)
    expected = {t.name for t in src.tensors}
    written = set()
    for shard in sorted(zoo.model_path(model).glob("*.safetensors")):
        with safe_open(str(shard), framework="pt") as f:
            for hf in f.keys():
                name = gguf_name(hf)
                if name is None:
                    raise SystemExit(f"{model}: no llama.cpp name for tensor {hf}")
                t = f.get_tensor(hf)
                if t.dim() == 1:
                    w.add_tensor(name, t.float().numpy())                                   # norms, biases: f32
                else:
                    raw = t.bfloat16().contiguous().view(torch.int16).numpy().view(np.uint8)  # (rows, 2·cols)
                    w.add_tensor(name, raw, raw_dtype=gguf.GGMLQuantizationType.BF16)     # bf16 matrices
                written.add(name)
    if expected and written != expected:
        raise SystemExit(f"{model}: tensors differ from the zoo's GGUF: missing {sorted(expected - written)[:5]}, "
                         f"extra {sorted(written - expected)[:5]}")
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return out


def copy_metadata(src, w) -> None:
    """Every key of GGUF reader ``src`` (tokenizer, chat template, hyper-parameters) into writer ``w``, except the
    file's own bookkeeping and its file type (the writer's tensors decide that)."""
    import gguf

    for field in src.fields.values():
        name = field.name
        if name.startswith("GGUF.") or name in ("general.architecture", "general.file_type",
                                                 "general.quantization_version"):
            continue
        kind = field.types[0]
        if kind == gguf.GGUFValueType.ARRAY:
            w.add_key_value(name, field.contents(), kind, sub_type=field.types[-1])
        else:
            w.add_key_value(name, field.contents(), kind)


def quantize(src: Path, kind: str, out: Path, threads: int) -> Path:
    """``src`` quantized to ``kind`` (a ``LLAMA_FTYPE_MOSTLY_*`` suffix) by llama.cpp's own quantizer."""
    import llama_cpp

    ftype = getattr(llama_cpp, f"LLAMA_FTYPE_MOSTLY_{kind}", None)
    if ftype is None:
        raise SystemExit(f"llama.cpp has no file type {kind!r}")
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype, params.nthread = ftype, threads
    if llama_cpp.llama_model_quantize(str(src).encode(), str(out).encode(), params) != 0:
        raise SystemExit(f"llama.cpp failed to quantize {src.name} to {kind}")
    return out


def teacher_forced(llm, prompt: list[int], answer: list[int]) -> list[int]:
    """llama.cpp's argmax at each answer position, fed ``prompt + answer[:-1]`` in one evaluation."""
    import numpy as np

    llm.reset()
    llm.eval(prompt + answer[:-1])
    scores = np.asarray(llm.scores[len(prompt) - 1: len(prompt) - 1 + len(answer)])   # (answer, vocab)
    return [int(i) for i in scores.argmax(axis=1)]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="Qwen2.5-Coder-0.5B-Instruct")
    ap.add_argument("--types", default=TYPES, help=f"comma-separated llama.cpp file types (default {TYPES})")
    ap.add_argument("--prompts", type=int, default=200)
    ap.add_argument("--answer-tokens", type=int, default=32)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--prompt-tokens", type=int, default=512, help="speed: the timed prompt's length")
    ap.add_argument("--decode-tokens", type=int, default=32, help="speed: tokens decoded after it")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--work", default=None, help="folder for the built GGUF files (kept); default a temporary one")
    ap.add_argument("--out", default=str(RESULTS / "gguf_quant"))
    args = ap.parse_args()

    import llama_cpp
    import torch
    from tqdm import tqdm

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from int8_quality import MAX_INSTRUCTION_CHARS, SYSTEM, ratio_interval  # its prompts, asked as it asks
    from runtime_speed import time_llama_cpp

    from c2c.bench import results
    from c2c.bench.limits import memory_bandwidth
    from c2c.runtime import zoo
    from c2c.xmodel.streams import instructions

    torch.set_num_threads(args.threads)
    work = Path(args.work) if args.work else Path(tempfile.mkdtemp(prefix="c2c-gguf-"))
    work.mkdir(parents=True, exist_ok=True)
    try:
        files = {"BF16": work / f"{args.model}.BF16.gguf"}
        if not files["BF16"].exists():
            print("writing the bf16 GGUF ...", file=sys.stderr, flush=True)
            write_bf16_gguf(args.model, files["BF16"])
        for kind in args.types.split(","):
            files[kind] = work / f"{args.model}.{kind}.gguf"
            if not files[kind].exists():
                print(f"quantizing to {kind} ...", file=sys.stderr, flush=True)
                quantize(files["BF16"], kind, files[kind], args.threads)
        zoo_file = zoo.gguf(args.model)
        files[f"zoo: {zoo_file.name}"] = zoo_file

        bandwidth = memory_bandwidth()
        rows = []
        for label, path in files.items():       # speed first, nothing else running
            row = time_llama_cpp(args.model, args.threads, args.prompt_tokens, args.decode_tokens, args.repeats,
                                 path=path)
            row.update(label=label, file_mb=path.stat().st_size / 1e6,
                       decode_gb_s=path.stat().st_size / (row["decode_ms"] / 1e3) / 1e9)
            row["fraction_of_read_bandwidth"] = row["decode_gb_s"] / bandwidth["read_gb_s"]
            rows.append(row)
            print(f"{label}: prefill {row['prefill_tok_s']:.0f} tok/s, decode {row['decode_ms']:.1f} ms/token",
                  file=sys.stderr, flush=True)

        ref = zoo.load(args.model, dtype="bfloat16")
        prompts = instructions(args.prompts, seed=args.seed, max_chars=MAX_INSTRUCTION_CHARS)
        asked = []
        with torch.inference_mode():
            for text in tqdm(prompts, desc="bf16 answers", file=sys.stderr):
                ids = ref.encode(ref.render_chat([{"role": "system", "content": SYSTEM},
                                                  {"role": "user", "content": text}], add_generation_prompt=True))
                asked.append((ids, list(ref.generate(ids, max_new_tokens=args.answer_tokens).token_ids)))
        baseline = str(ref.engine_id)
        del ref
        records = []
        for row in rows:
            llm = llama_cpp.Llama(model_path=str(files[row["label"]]), n_ctx=2048, n_batch=2048, n_ubatch=512,
                                  n_threads=args.threads, n_threads_batch=args.threads, logits_all=True,
                                  verbose=False)
            hits, totals = [], []
            for i, (ids, answer) in enumerate(tqdm(asked, desc=row["label"], file=sys.stderr)):
                pred = teacher_forced(llm, ids, answer)
                agree = [int(a == b) for a, b in zip(pred, answer)]
                hits.append(sum(agree))
                totals.append(len(agree))
                records.append({"file": row["label"], "i": i, "prompt_tokens": len(ids), "positions": len(agree),
                                "agree": sum(agree), "exact": all(agree),
                                "first_disagreement": agree.index(0) if 0 in agree else None})
            del llm
            row["agreement"] = sum(hits) / max(1, sum(totals))
            row["agreement_ci95"] = list(ratio_interval(hits, totals))
            row["exact_answers"] = sum(h == t for h, t in zip(hits, totals))
    finally:
        if not args.work:
            shutil.rmtree(work, ignore_errors=True)
    out = {"model": args.model, "prompts": len(asked), "answer_tokens": args.answer_tokens, "seed": args.seed,
           "threads": args.threads, "baseline": baseline, "memory_bandwidth": bandwidth,
           "llama_cpp_python": llama_cpp.__version__, "rows": rows, "choice": choose(rows),
           "machine": results.machine(),
           "command": "python benchmarks/gguf_quant.py " + " ".join(sys.argv[1:]),
           "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    return results.write(args.out, out, markdown(out), records=records, plot=lambda p: plot(out, p))


def choose(rows: list[dict], floor: float = 0.97) -> dict:
    """The fastest-decoding file whose agreement's lower 95% bound clears ``floor`` (int8's bar), else the most
    faithful one."""
    ok = [r for r in rows if r["agreement_ci95"][0] >= floor]
    pick = min(ok, key=lambda r: r["decode_ms"]) if ok else max(rows, key=lambda r: r["agreement"])
    fastest = min(rows, key=lambda r: r["decode_ms"])
    return {"label": pick["label"], "floor": floor, "cleared": bool(ok), "fastest": fastest["label"],
            "rule": f"the fastest decode whose agreement's lower 95% bound is at least {100 * floor:.0f}%"}


def markdown(r: dict) -> str:
    m = r["machine"]
    lines = [f"# GGUF quantizations on llama.cpp ({r['model']})", "",
             f"`{r['command']}` — {r['created']}. CPU: {m.get('cpu_model', m.get('model_name'))}, "
             f"{r['threads']} threads; llama-cpp-python {r['llama_cpp_python']}. Read bandwidth measured in this "
             f"run: {r['memory_bandwidth']['read_gb_s']:.1f} GB/s.", "",
             f"Agreement: teacher-forced top-1 agreement with c2c's bf16 runtime ({r['baseline']}) along its own "
             f"greedy answers, {r['prompts']} training-corpus prompts (seed {r['seed']}), {r['answer_tokens']} "
             "answer tokens at most, pooled, 95% bootstrap interval over prompts. Files built from the model's "
             "bf16 weights by llama.cpp's quantizer (no importance matrix); `zoo` is the file the zoo ships.", "",
             "| file | MB | prefill tok/s | decode ms/token | of read bandwidth | agreement with bf16 (95% CI) | "
             "whole answers equal |",
             "|---|---:|---:|---:|---:|---|---:|"]
    for x in r["rows"]:
        lo, hi = x["agreement_ci95"]
        agree = f"{100 * x['agreement']:.2f}% ({100 * lo:.2f}–{100 * hi:.2f})"
        if lo >= r["choice"]["floor"]:
            agree = f"**{agree}**"
        lines.append(f"| {x['label']} | {x['file_mb']:.0f} | {x['prefill_tok_s']:.0f} | {x['decode_ms']:.1f} | "
                     f"{100 * x['fraction_of_read_bandwidth']:.0f}% | {agree} | {x['exact_answers']} of "
                     f"{r['prompts']} |")
    c = r["choice"]
    lines += ["", f"Choice ({c['rule']}; bold clears it): **{c['label']}**"
              + ("" if c["cleared"] else " (none cleared the floor: the most faithful)")
              + f". Fastest decode: {c['fastest']}.", ""]
    return "\n".join(lines)


def plot(r: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.5, 4.2))
    for x in r["rows"]:
        lo, hi = x["agreement_ci95"]
        ax.errorbar(x["decode_ms"], 100 * x["agreement"], yerr=[[100 * (x["agreement"] - lo)],
                                                                 [100 * (hi - x["agreement"])]], fmt="o", capsize=3)
        ax.annotate(x["label"], (x["decode_ms"], 100 * x["agreement"]), textcoords="offset points", xytext=(5, 4))
    ax.axhline(100 * r["choice"]["floor"], color="grey", lw=0.8, ls="--")
    ax.set_xlabel("decode ms/token (llama.cpp)")
    ax.set_ylabel("top-1 agreement with bf16 (%)")
    ax.set_title(r["model"])
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    raise SystemExit(main())
