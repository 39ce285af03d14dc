"""Prefill and decode speed of each zoo model: fp32 against bf16 (packed and not), and llama.cpp beside them.

    .venv/bin/python benchmarks/runtime_speed.py                         # the three small zoo models
    .venv/bin/python benchmarks/runtime_speed.py --models Qwen2.5-Coder-0.5B-Instruct --repeats 5

In one process, one model at a time, with ``--threads`` torch/llama.cpp threads. A model's
transformers rows are loaded together and take turns, one run of each per repeat in an order
rotated between repeats, so that their ratios (bf16 over fp32, int8 over bf16) compare the same
minutes of a machine whose memory bandwidth drifts (runs before 2026-12-04 16:00 timed them one
after the other):

- ``prefill``: a ``--prompt-tokens`` prompt from a fresh cache, tokens per second (median of
  ``--repeats``);
- ``decode``: ``--decode-tokens`` greedy tokens after that prompt, ms per token (median
  over tokens, then over repeats), the end of turn suppressed so every run decodes them all;
  each step a pass of the sequence the engine holds (``Runtime.stepper``, as ``generate`` and
  ``c2c serve`` decode; results created before 2026-12-04 19:00 UTC re-exported the cache after every step).

Rows: ``float32`` (the reference), ``bfloat16`` (c2c's default on CPUs with AVX512-BF16
or AMX: linear layers packed for oneDNN), ``bfloat16-unpacked`` (the same without packing:
what packing buys, and whether it changes a token on this CPU), ``int8`` (bf16 prefill, decode
steps on int8 weights: :mod:`c2c.runtime.transformers.int8`), and, when ``llama-cpp-python``
is installed, ``llama.cpp`` on the zoo's own GGUF file as shipped (its ``Llama.generate``) and
``c2c-llama.cpp`` (c2c's llama.cpp backend on the same file).

The limit: this machine's memory bandwidth, measured in the same process on the same threads
(a STREAM-like read, the best of three reductions over 1 GiB, and copy: :mod:`c2c.bench.limits`; runs
before 2026-12-04 used one fp32 sum), and for every row the bytes one decode step
reads, from the weights' actual storage (each linear layer as the step reads it: int8, packed
bf16 or dense; the K/V the step attends to; for llama.cpp the GGUF's tensors), so every row
says what fraction of the read bandwidth its decode draws.

Each row records the runtime's numerics as its fingerprint names them (``fingerprint_backend``),
and the result the machine: the CPU model, vendor and the flags that choose kernels
(``amx_bf16``, ``avx512_bf16``, ...), and for llama.cpp the CPU features its build was compiled
with (``llama_print_system_info``) and the ``CMAKE_ARGS`` ``scripts/setup.sh`` built it with.

Outputs benchmarks/results/runtime_speed.{json,md,png} (or --out PREFIX).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

from c2c.bench.limits import decode_bytes, gemm_gflops, memory_bandwidth

RESULTS = Path(__file__).resolve().parent / "results"
MODELS = "Qwen2.5-Coder-0.5B-Instruct,SmolLM2-135M-Instruct,Gemma-3-270M"


def prompt_ids(encode, n: int) -> list[int]:
    from c2c.bench.handoff import corpus_text

    ids = encode(corpus_text())
    while len(ids) < n:
        ids = ids + ids
    return ids[:n]


VARIANTS = (("float32", False), ("bfloat16", True), ("bfloat16", False), ("int8", True))


def variant_name(dtype: str, pack: bool) -> str:
    return dtype if pack or dtype == "float32" else "bfloat16-unpacked"


def _one_run(rt, ids: list[int], n_decode: int) -> tuple[float, float, list[int]]:
    """(prefill seconds, median decode-step seconds, the greedy tokens) of one run: the prompt from a fresh cache,
    then ``n_decode`` one-token steps of the sequence the engine holds (``Runtime.stepper``: as ``generate`` and
    ``c2c serve`` decode)."""
    import torch

    t0 = time.perf_counter()
    seq = rt.stepper(None)
    logits = seq.feed(ids)
    prefill = time.perf_counter() - t0
    steps, out, tok = [], [], int(torch.argmax(logits))
    for _ in range(n_decode):
        out.append(tok)
        t0 = time.perf_counter()
        logits = seq.feed([tok])
        steps.append(time.perf_counter() - t0)
        tok = int(torch.argmax(logits))
    return prefill, statistics.median(steps), out


def time_transformers(name: str, n_prompt: int, n_decode: int, repeats: int,
                      variants=VARIANTS) -> list[dict]:
    """One row per (dtype, packed) variant of ``name``. All of them are loaded at once and take turns: each repeat
    runs every variant once, in an order rotated from repeat to repeat, so a ratio of two variants (int8 over
    bf16, say) is measured over the same stretch of the machine's time, not one after the other on a machine
    whose memory bandwidth drifts between minutes."""
    from c2c.runtime import zoo

    runs = []
    for dtype, pack in variants:
        rt = zoo.load(name, dtype=dtype)
        if not pack:
            rt.ensure_dense()
        ids = prompt_ids(rt.encode, n_prompt)
        rt.generate(ids[:32], max_new_tokens=4, min_new_tokens=4)  # warm
        runs.append({"rt": rt, "ids": ids, "variant": variant_name(dtype, pack), "prefill": [], "decode": [],
                     "tokens": None})
    for i in range(repeats):
        for run in runs[i % len(runs):] + runs[:i % len(runs)]:
            prefill, decode, tokens = _one_run(run["rt"], run["ids"], n_decode)
            run["prefill"].append(prefill)
            run["decode"].append(decode)
            run["tokens"] = tokens if run["tokens"] is None else run["tokens"]
    rows = []
    for run in runs:
        rt, ids = run["rt"], run["ids"]
        rows.append({"model": name, "engine": "transformers", "variant": run["variant"],
                     "dtype": str(rt.dtype).replace("torch.", ""), "packed_linears": rt.packed,
                     "int8_linears": rt.int8, "fingerprint_backend": str(rt.engine_id),
                     "bytes_per_token": decode_bytes(rt, len(ids) + n_decode // 2), "prompt_tokens": len(ids),
                     "decode_tokens": n_decode, "prefill_tok_s": len(ids) / statistics.median(run["prefill"]),
                     "decode_ms": 1e3 * statistics.median(run["decode"]), "prefill_s_all": run["prefill"],
                     "decode_ms_all": [1e3 * d for d in run["decode"]], "tokens": run["tokens"],
                     "interleaved": True})
    runs.clear()
    return rows


def time_c2c_llama_cpp(name: str, threads: int, n_prompt: int, n_decode: int, repeats: int) -> dict | None:
    """c2c's llama.cpp backend (``LlamaCppRuntime.generate``), timed like llama-cpp-python's own generate."""
    try:
        from c2c.runtime import zoo

        rt = zoo.load(name, backend="llama.cpp")
    except Exception as e:  # noqa: BLE001 - no llama-cpp-python, or a model the backend refuses
        print(f"{name}: c2c llama.cpp backend skipped: {e}", file=sys.stderr)
        return None
    ids = prompt_ids(rt.encode, n_prompt)
    rt.generate(ids[:32], max_new_tokens=4)  # warm
    prefill, decode, tokens = [], [], None
    for _ in range(repeats):
        g = rt.generate(ids, max_new_tokens=n_decode, min_new_tokens=n_decode)
        prefill.append(g.prefill_s)
        decode.append(g.decode_s / max(len(g.token_ids) - 1, 1))
        tokens = list(g.token_ids) if tokens is None else tokens
    row = {"model": name, "engine": "c2c llama.cpp backend", "dtype": f"gguf ({rt.facts.quantization}), kv f16",
           "prompt_tokens": len(ids), "decode_tokens": n_decode,
           "prefill_tok_s": len(ids) / statistics.median(prefill), "decode_ms": 1e3 * statistics.median(decode),
           "prefill_s_all": prefill, "decode_ms_all": [1e3 * d for d in decode], "tokens": tokens,
           "fingerprint_backend": str(rt.engine_id)}
    rt.close()
    return row


def time_llama_cpp(name: str, threads: int, n_prompt: int, n_decode: int, repeats: int, *,
                   path: Path | None = None) -> dict | None:
    """llama-cpp-python's own ``generate`` on the zoo's GGUF file (or ``path``)."""
    try:
        import llama_cpp
    except ImportError:
        return None
    from c2c.runtime import zoo

    path = path or zoo.gguf(name)
    llm = llama_cpp.Llama(model_path=str(path), n_ctx=max(2048, n_prompt + n_decode + 16), n_threads=threads,
                          n_threads_batch=threads, n_batch=512, verbose=False, logits_all=False)
    ids = prompt_ids(lambda t: llm.tokenize(t.encode(), add_bos=False, special=False), n_prompt)
    eos = llm.token_eos()
    prefill, decode, tokens = [], [], None
    for _ in range(repeats + 1):  # the first run warms
        llm.reset()
        t0 = time.perf_counter()
        stamps, out = [], []
        for tok in llm.generate(ids, top_k=1, top_p=1.0, temp=0.0, reset=True,
                                logits_processor=[lambda _ids, scores: _no_eos(scores, eos)]):
            stamps.append(time.perf_counter())
            out.append(int(tok))
            if len(out) == n_decode:
                break
        prefill.append(stamps[0] - t0)  # the prompt's eval plus the first sample
        decode.append(statistics.median(b - a for a, b in zip(stamps, stamps[1:])))
        tokens = out if tokens is None else tokens
    prefill, decode = prefill[1:], decode[1:]
    types = sorted({str(t) for t in _tensor_types(llm)})
    row = {"model": name, "engine": "llama.cpp", "dtype": "gguf (" + ", ".join(types) + ")",
           "bytes_per_token": path.stat().st_size,   # its tensors (the file, less a small header)
           "llama_cpp_python": llama_cpp.__version__, "gguf": path.name, "prompt_tokens": len(ids),
           "decode_tokens": n_decode, "prefill_tok_s": len(ids) / statistics.median(prefill),
           "decode_ms": 1e3 * statistics.median(decode), "prefill_s_all": prefill,
           "decode_ms_all": [1e3 * d for d in decode], "tokens": tokens, **llama_cpp_build()}
    llm.close()
    return row


def llama_cpp_build() -> dict:
    """How the installed llama.cpp was built: the CPU features it was compiled with (what it runs, as
    ``llama_print_system_info`` reports them) and the ``CMAKE_ARGS`` scripts/setup.sh built its wheel
    with (``""`` where setup did not record them, e.g. a wheel installed by hand)."""
    from c2c.runtime.llama_cpp import build_features

    recorded = Path(sys.prefix) / ".llama-cpp-cmake-args"
    return {"build_features": list(build_features()),
            "build_flags": recorded.read_text().strip() if recorded.is_file() else ""}


def _no_eos(scores, eos: int):
    scores[eos] = -float("inf")
    return scores


def _tensor_types(llm) -> list[str]:
    """The file's quantization as llama.cpp reports it (e.g. ``Q4_K_M``), from its metadata."""
    from c2c.runtime.llama_cpp import FTYPES

    ftype = llm.metadata.get("general.file_type")
    return [FTYPES.get(int(ftype), f"file_type {ftype}")] if ftype is not None else ["unknown"]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default=MODELS, help=f"comma-separated zoo models (default {MODELS})")
    ap.add_argument("--prompt-tokens", type=int, default=512)
    ap.add_argument("--decode-tokens", type=int, default=32)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--no-llama-cpp", action="store_true", help="skip the llama.cpp rows")
    ap.add_argument("--out", default=str(RESULTS / "runtime_speed"))
    ap.add_argument("--render", action="store_true", help="only re-write the markdown and PNG from OUT.json")
    args = ap.parse_args()
    if args.render:
        from c2c.bench.results import write

        result = json.loads(Path(args.out).with_suffix(".json").read_text())
        return write(args.out, result, markdown(result), plot=lambda path: plot(result, path))

    import torch

    from c2c.bench.results import write
    from c2c.runtime import alloc
    from c2c.runtime.dtype import cpu_flags, resolve
    from c2c.runtime.numerics import machine_record

    alloc.keep_large_buffers()
    torch.set_num_threads(args.threads)
    gemm = gemm_gflops()
    bandwidth = memory_bandwidth()
    print(f"memory bandwidth: read {bandwidth['read_gb_s']:.1f} GB/s, copy {bandwidth['copy_gb_s']:.1f} GB/s",
          file=sys.stderr, flush=True)
    rows = []
    for name in args.models.split(","):
        for row in time_transformers(name, args.prompt_tokens, args.decode_tokens, args.repeats):
            rows.append(row)
            print(f"{name} {row['variant']}: prefill {row['prefill_tok_s']:.0f} tok/s, decode "
                  f"{row['decode_ms']:.1f} ms/token", file=sys.stderr, flush=True)
        if not args.no_llama_cpp:
            for variant, timer in (("llama.cpp", time_llama_cpp), ("c2c-llama.cpp", time_c2c_llama_cpp)):
                row = timer(name, args.threads, args.prompt_tokens, args.decode_tokens, args.repeats)
                if row is not None:
                    row["variant"] = variant
                    rows.append(row)
                    print(f"{name} {variant}: prefill {row['prefill_tok_s']:.0f} tok/s, decode "
                          f"{row['decode_ms']:.1f} ms/token", file=sys.stderr, flush=True)
    for row in rows:
        if row.get("bytes_per_token"):
            row["decode_gb_s"] = row["bytes_per_token"] / (row["decode_ms"] / 1e3) / 1e9
            row["fraction_of_read_bandwidth"] = row["decode_gb_s"] / bandwidth["read_gb_s"]
    by = {(r["model"], r["variant"]): r for r in rows}
    ratios = {}
    for name in args.models.split(","):
        f32, b16, raw = by[name, "float32"], by[name, "bfloat16"], by[name, "bfloat16-unpacked"]
        own, ours = by.get((name, "llama.cpp")), by.get((name, "c2c-llama.cpp"))
        ratios[name] = {"prefill_bf16_over_fp32": b16["prefill_tok_s"] / f32["prefill_tok_s"],
                        "decode_fp32_over_bf16": f32["decode_ms"] / b16["decode_ms"],
                        "decode_unpacked_over_packed": raw["decode_ms"] / b16["decode_ms"],
                        "bf16_tokens_equal_unpacked": b16["tokens"] == raw["tokens"]}
        i8 = by.get((name, "int8"))
        if i8:
            ratios[name]["decode_bf16_over_int8"] = b16["decode_ms"] / i8["decode_ms"]
            ratios[name]["prefill_int8_over_bf16"] = i8["prefill_tok_s"] / b16["prefill_tok_s"]
            ratios[name]["int8_greedy_tokens_equal_bf16"] = sum(a == b for a, b in zip(i8["tokens"], b16["tokens"]))
        if own and ours:  # c2c's backend against llama-cpp-python's own generate: total time for the same work
            t_own = own["prompt_tokens"] / own["prefill_tok_s"] + (args.decode_tokens - 1) * own["decode_ms"] / 1e3
            t_ours = ours["prompt_tokens"] / ours["prefill_tok_s"] + (args.decode_tokens - 1) * ours["decode_ms"] / 1e3
            ratios[name]["c2c_llama_cpp_over_own"] = t_ours / t_own
    q = ratios.get("Qwen2.5-Coder-0.5B-Instruct")
    result = {
        "models": args.models.split(","), "prompt_tokens": args.prompt_tokens, "decode_tokens": args.decode_tokens,
        "repeats": args.repeats, "threads": args.threads, "rows": rows, "ratios": ratios,
        "default_dtype_here": resolve("auto"), "gemm_gflops": gemm, "memory_bandwidth": bandwidth,
        "acceptance": {} if q is None else {
            "qwen05_bf16_prefill_ge_6x": q["prefill_bf16_over_fp32"] >= 6,
            "qwen05_bf16_decode_ge_1p8x": q["decode_fp32_over_bf16"] >= 1.8,
            "bf16_is_the_default_here": resolve("auto") == "bfloat16",
            "packing_changes_no_token": all(r["bf16_tokens_equal_unpacked"] for r in ratios.values()),
            # #42: <= 40 ms per token on an AMX machine, or >= 1.6x bf16 on whichever CPU it is measured on
            **({"qwen05_int8_decode_le_40ms_on_amx_or_ge_1p6x_bf16":
                (by["Qwen2.5-Coder-0.5B-Instruct", "int8"]["decode_ms"] <= 40 and "amx_bf16" in cpu_flags())
                or q["decode_bf16_over_int8"] >= 1.6} if "decode_bf16_over_int8" in q else {}),
            **({"c2c_llama_cpp_within_10pct_of_own_generate": q["c2c_llama_cpp_over_own"] <= 1.10}
               if "c2c_llama_cpp_over_own" in q else {}),
        },
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(), "torch": torch.__version__,
                    "bf16_flags": sorted({"avx512_bf16", "amx_bf16"} & cpu_flags()), **machine_record()},
        "command": "python benchmarks/runtime_speed.py " + " ".join(sys.argv[1:]),
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    return write(args.out, result, markdown(result), plot=lambda path: plot(result, path))


def markdown(r: dict) -> str:
    lines = ["# Runtime speed: prefill and decode per dtype and engine", "",
             f"`{r['command']}` — {r['created']}, {r['machine']['cpus']} CPUs"
             f"{' (' + r['machine']['cpu_model'] + ')' if r['machine'].get('cpu_model') else ''}, {r['threads']} "
             f"threads, torch {r['machine']['torch']}, CPU bf16 flags: "
             f"{', '.join(r['machine']['bf16_flags']) or 'none'}; "
             f"`--dtype auto` picks **{r['default_dtype_here']}** here. Prompt {r['prompt_tokens']} tokens, "
             f"{r['decode_tokens']} greedy decoded tokens, median of {r['repeats']} runs, all in one process"
             f"{'; the transformers rows take turns within each repeat' if any(x.get('interleaved') for x in r['rows']) else ''}.", "",
             *([f"Memory bandwidth, measured in this run on the same threads: read **{r['memory_bandwidth']['read_gb_s']:.1f}"
                f" GB/s**, copy {r['memory_bandwidth']['copy_gb_s']:.1f} GB/s. A decode step reads every weight once: "
                "its bytes over its time, against the read bandwidth, is how close it runs to the limit.", ""]
               if r.get("memory_bandwidth") else []),
             "| model | engine | dtype | prefill tok/s | decode ms/token | MB read per token | GB/s drawn | of the limit |",
             "|---|---|---|---:|---:|---:|---:|---:|"]
    for x in r["rows"]:
        label = x["variant"] if x["engine"] == "transformers" else x["dtype"]
        mb = f"{x['bytes_per_token'] / 1e6:.0f}" if x.get("bytes_per_token") else "—"
        gbs = f"{x['decode_gb_s']:.1f}" if x.get("decode_gb_s") else "—"
        frac = f"{100 * x['fraction_of_read_bandwidth']:.0f}%" if x.get("fraction_of_read_bandwidth") else "—"
        lines.append(f"| {x['model']} | {x['engine']} | {label} | {x['prefill_tok_s']:.0f} | {x['decode_ms']:.1f} | "
                     f"{mb} | {gbs} | {frac} |")
    lines += ["", "| model | bf16 prefill / fp32 | fp32 decode / bf16 | unpacked / packed decode | packed tokens = "
              "unpacked | c2c llama.cpp backend / llama-cpp-python generate (time) |", "|---|---:|---:|---:|---|---:|"]
    if any("decode_bf16_over_int8" in q for q in r["ratios"].values()):
        rows_i8 = [f"| {name} | {q['decode_bf16_over_int8']:.2f}× | {q['prefill_int8_over_bf16']:.2f}× | "
                   f"{q['int8_greedy_tokens_equal_bf16']} of {r['decode_tokens']} |"
                   for name, q in r["ratios"].items() if "decode_bf16_over_int8" in q]
        int8_table = ["", "| model | int8 decode speed-up over bf16 | int8 prefill / bf16 | greedy tokens equal to "
                      "bf16's (this prompt) |", "|---|---:|---:|---:|", *rows_i8]
    else:
        int8_table = []
    for name, q in r["ratios"].items():
        own = f"{q['c2c_llama_cpp_over_own']:.3f}" if "c2c_llama_cpp_over_own" in q else "—"
        lines.append(f"| {name} | {q['prefill_bf16_over_fp32']:.2f}× | {q['decode_fp32_over_bf16']:.2f}× | "
                     f"{q['decode_unpacked_over_packed']:.2f}× | {q['bf16_tokens_equal_unpacked']} | {own} |")
    lines += int8_table
    lines += ["", "`bfloat16` is c2c's bf16 runtime: transformers with its linear layers packed once for oneDNN "
              "(`c2c.runtime.transformers.packing.PackedLinear`; whether its products equal unpacked bf16's bit "
              "for bit depends on the CPU, and the tokens column checks it here; the fingerprint names the "
              "kernel and the CPU class either way) and one-token attention computed in fp32 (PyTorch's CPU "
              "flash kernel is slow for a single bf16 query). `bfloat16-unpacked` is the same runtime without "
              "packing. llama.cpp runs the zoo's GGUF as shipped (quantized), through llama-cpp-python's "
              "`generate`; `c2c llama.cpp backend` is c2c's own runtime on the same file "
              "(`c2c.runtime.llama_cpp`, `LlamaCppRuntime.generate`, whose cache is exported once at the end), "
              "which refuses Gemma 3 (sliding-window layers).", ""]
    builds = {tuple(x["build_features"]): x.get("build_flags", "") for x in r["rows"] if x.get("build_features")}
    for features, flags in builds.items():
        lines += [f"llama.cpp build: compiled for {', '.join(features)}; CMAKE_ARGS `{flags or 'not recorded'}`.", ""]
    numerics = sorted({x["fingerprint_backend"] for x in r["rows"]  # (results before #31 held no engine id)
                       if x.get("fingerprint_backend", "").split(" ")[0] in ("transformers", "llama.cpp", "vllm")})
    if numerics:
        lines += ["Fingerprint backends (engine, build and numerics) of the rows:", ""]
        lines += [f"- `{n}`" for n in numerics] + [""]
    lines += ["## Acceptance", ""]
    if "amx_bf16" not in r["machine"]["bf16_flags"]:
        g = r.get("gemm_gflops")
        measured = (f" (a 512x896 by 896x4864 product, measured in this run: bf16 {g['bfloat16_packed']:.0f} "
                    f"GFLOPS packed against fp32 {g['float32']:.0f}, {g['bfloat16_packed'] / g['float32']:.1f}x)"
                    if g else "")
        lines += [f"This CPU has AVX512-BF16 but no AMX: bf16 matrix products run at a few times fp32's "
                  f"speed{measured}, so prefill cannot reach the 6x that AMX tiles give; the 6x target was set on "
                  "a CPU with AMX. Decode is bound by reading the weights, which bf16 halves.", ""]
    for k, v in r["acceptance"].items():
        lines.append(f"- {k}: **{'PASS' if v else 'FAIL'}**")
    return "\n".join(lines) + "\n"


def plot(r: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    models = r["models"]
    variants = [v for v in ("float32", "bfloat16-unpacked", "bfloat16", "int8", "llama.cpp", "c2c-llama.cpp")
                if any(x["variant"] == v for x in r["rows"])]
    by = {(x["model"], x["variant"]): x for x in r["rows"]}
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    w = 0.8 / len(variants)
    for i, v in enumerate(variants):
        xs = [j + (i - (len(variants) - 1) / 2) * w for j in range(len(models))]
        axes[0].bar(xs, [by[m, v]["prefill_tok_s"] if (m, v) in by else 0 for m in models], w, label=v)
        axes[1].bar(xs, [by[m, v]["decode_ms"] if (m, v) in by else 0 for m in models], w, label=v)
    for ax, title in zip(axes, ("prefill tokens/s (higher is better)", "decode ms/token (lower is better)")):
        ax.set_xticks(range(len(models)), [m.replace("-Instruct", "") for m in models], fontsize=8)
        ax.set_title(title)
    axes[0].legend(fontsize=8)
    fig.suptitle(f"c2c runtimes, {r['threads']} threads, {r['prompt_tokens']}-token prompt")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


if __name__ == "__main__":
    sys.exit(main())
