"""Sweep the handoff benchmark over message lengths; write JSON, a markdown table and a plot.

    .venv/bin/python benchmarks/handoff_sweep.py                       # Qwen 0.5B, N = 32..256
    .venv/bin/python benchmarks/handoff_sweep.py --model SmolLM2-135M-Instruct --lengths 256

    .venv/bin/python benchmarks/handoff_sweep.py --dtype bfloat16 --text-engine llama.cpp --lengths 64,128,256

Outputs benchmarks/results/handoff.{json,md,png} (or --out PREFIX). Every point runs
text, full and slice in the same process, one after the other, so their ratio is
measured under the same machine load. With ``--text-engine llama.cpp`` every point
also runs the text pipeline on llama.cpp (the zoo's GGUF as shipped; see
``llama_text.py``): the honest comparison, c2c's cache pipeline against the text
pipeline on the fastest engine we have here.

The compute bound. Every point also computes the least time the cache pipeline could take on this
machine (:mod:`c2c.bench.limits`): for each forward pass it cannot avoid (the analyst's reads after
the shared prefix, the writer's own tokens after the received cache, the answer's decode steps), the
larger of its FLOPs at the best matrix-product rate (a 512x896 by 896x4864 product, bf16 packed
where the CPU packs) and its bytes (weights as the runtime stores them, plus the K/V it reads) at
the best read bandwidth, each the best of the measurements taken in this run before every point and
at the end (a shared machine reads low at times); the bound is their sum (the handoff's own
bytes are left out: tens of milliseconds). ``of bound`` is that bound over the measured cache
pipeline: 100% would be a pipeline with no overhead, every pass at the measured kernel and
bandwidth rates (the best of one GEMM shape and of torch's reductions, not the hardware's peak).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from tqdm import tqdm

from c2c import advise
from c2c.bench import handoff, limits, results
from c2c.bench.calibrate import calibrate
from c2c.runtime import alloc, zoo

RESULTS = Path(__file__).resolve().parent / "results"


def main() -> int:
    alloc.keep_large_buffers()  # as the c2c command does (see c2c.runtime.alloc)
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", action="append", help="zoo model (repeatable); default Qwen2.5-Coder-0.5B-Instruct "
                                                      "and SmolLM2-135M-Instruct")
    ap.add_argument("--lengths", default="32,64,128,256", help="message lengths in tokens, comma separated")
    ap.add_argument("--context-tokens", type=int, default=512, help="document length the analyst reads")
    ap.add_argument("--repeats", type=int, default=1, help="run each point this many times and report the "
                                                          "median of every timing (pipelines are single runs "
                                                          "otherwise; cache handoffs are always median of 5)")
    ap.add_argument("--dtype", default=None, choices=["auto", "float32", "bfloat16", "int8"],
                    help="c2c's runtime dtype (default $C2C_DTYPE, else auto: bf16 where the CPU has it)")
    ap.add_argument("--text-engine", choices=["transformers", "llama.cpp"], action="append", default=None,
                    help="also run the text pipeline on llama.cpp (repeatable; transformers always runs)")
    ap.add_argument("--threads", type=int, default=2, help="torch and llama.cpp threads (default 2)")
    ap.add_argument("--out", default=str(RESULTS / "handoff"), help="output path prefix")
    args = ap.parse_args()
    import torch

    torch.set_num_threads(args.threads)
    models = args.model or ["Qwen2.5-Coder-0.5B-Instruct", "SmolLM2-135M-Instruct"]
    measured = [limits.Limits.measure()]  # in this run, on these threads, before every point and at the end
    lengths = [int(x) for x in args.lengths.split(",")]
    rows = []
    for name in models:
        rt = zoo.load(name, dtype=args.dtype)
        llm = _llama(name, args.threads) if "llama.cpp" in (args.text_engine or ()) else None
        cal = calibrate(rt)  # the advisor's inputs, measured in this same run
        label = "int8" if getattr(rt, "int8", 0) else str(rt.dtype).replace("torch.", "")  # int8: bf16 activations
        for n in tqdm(lengths, desc=name, file=sys.stderr):
            measured.append(limits.Limits.measure())
            cfg = handoff.HandoffBenchConfig(message_tokens=n, context_tokens=args.context_tokens)
            r = median_run([_point(rt, llm, cfg) for _ in range(args.repeats)])
            a = advise.advise(cal, message_tokens=n, context_tokens=args.context_tokens,
                              answer_tokens=r["answer_tokens"],
                              prefix_tokens=len(rt.encode(rt.render_turn("system", handoff.SYSTEM))) + 30)
            for key in ("text_pipeline_s", "cache_pipeline_s", "text_handoff_s", "cache_handoff_s"):
                r[f"predicted_{key}"] = getattr(a, key)
                r[f"prediction_error_{key}"] = getattr(a, key) / r[key] - 1
            r["advisor_decision"] = "cache" if a.cache_is_faster else "text"
            r["dtype"] = label
            r["cache_pass_costs"] = _costs(rt, r["cache_passes"])
            r["calibration"] = cal.__dict__
            rows.append(r)
    measured.append(limits.Limits.measure())
    best = limits.Limits.best(measured)
    for r in rows:
        r.update(_bound(best, r))
    cmd = "python benchmarks/handoff_sweep.py " + " ".join(sys.argv[1:])
    return results.write(args.out, {"command": cmd.strip(), "results": rows}, table(rows, cmd.strip()),
                         plot=lambda path: plot(rows, path))


def _costs(rt, passes: dict) -> dict:
    """The FLOPs and bytes of the cache pipeline's unavoidable passes (``handoff.run``'s ``cache_passes``)."""
    step = limits.pass_cost(rt, 1, passes["decode_context"])
    return {"prefill": [limits.pass_cost(rt, n, past).__dict__ for n, past in passes["prefill"]],
            "decode": [step.__dict__] * passes["decode_steps"]}


def _bound(best: limits.Limits, r: dict) -> dict:
    """The cache pipeline's compute bound at the run's best limits, and how close the measured pipeline runs."""
    c = r["cache_pass_costs"]
    b = limits.Bound.of([limits.PassCost(**x) for x in c["prefill"]], [limits.PassCost(**x) for x in c["decode"]],
                        best)
    out = {"limits": best.__dict__, "cache_bound_s": b.seconds, "cache_bound_prefill_s": b.prefill_s,
           "cache_bound_decode_s": b.decode_s, "cache_of_bound": b.seconds / r["cache_pipeline_s"]}
    if "llama_text_pipeline_s" in r:
        out["speedup_bound_vs_llama_text"] = r["llama_text_pipeline_s"] / b.seconds
    return out


def _llama(name: str, threads: int):
    import llama_cpp  # the user's fast engine, the baseline (built by scripts/setup.sh)

    return llama_cpp.Llama(model_path=str(zoo.gguf(name)), n_ctx=2048, n_threads=threads, n_threads_batch=threads,
                           n_batch=512, verbose=False)


def _point(rt, llm, cfg) -> dict:
    """One run of the three c2c pipelines, then (with ``llm``) the text pipeline on llama.cpp."""
    r = handoff.run(rt, cfg)
    r["backend"] = "transformers"
    if llm is not None:
        import llama_cpp
        from llama_text import text_pipeline

        text = handoff.corpus_text()
        document = handoff.take_tokens(rt, text, cfg.context_tokens)
        notes = handoff.take_tokens(rt, text[len(document) + 1:], cfg.message_tokens)
        r.update(text_pipeline(llm, rt, system=handoff.SYSTEM, analyst_role=handoff.ANALYST_ROLE,
                               writer_role=handoff.WRITER_ROLE, document=document, notes=notes,
                               message_prompt="Write the notes above as a message for the writer.",
                               question=handoff.QUESTION, message_tokens=cfg.message_tokens,
                               answer_tokens=cfg.answer_tokens))
        r["llama_cpp_python"] = llama_cpp.__version__
        r["speedup_vs_llama_text"] = r["llama_text_pipeline_s"] / r["cache_pipeline_s"]
    return r


def median_run(runs: list[dict]) -> dict:
    """The first run, with every ``*_s`` timing replaced by its median over ``runs`` (ratios recomputed) and
    every run's kept in ``each_run``."""
    import statistics

    r = dict(runs[0])
    each = {}
    for k, v in r.items():
        if k.endswith("_s") and isinstance(v, float):
            each[k] = [x[k] for x in runs]      # every run's, so a noisy machine shows as the spread
            r[k] = statistics.median(each[k])
    r["each_run"] = each
    if "llama_text_pipeline_s" in r:
        r["speedup_vs_llama_text"] = r["llama_text_pipeline_s"] / r["cache_pipeline_s"]
    r.update(speedup_full=r["text_pipeline_s"] / r["cache_pipeline_s"],
             speedup_slice=r["text_pipeline_s"] / r["slice_pipeline_s"],
             handoff_ratio=r["cache_handoff_s"] / r["text_handoff_s"], repeats=len(runs),
             exact=all(x["exact"] for x in runs),
             exact_vs_one_prefill=all(x.get("exact_vs_one_prefill", x["exact"]) for x in runs))
    return r


def table(rows: list[dict], cmd: str) -> str:
    lines = [f"# Handoff: text vs full cache vs slice\n\nProduced by `{cmd}` on "
             f"{rows[0]['machine']['cpus']} CPU cores, {rows[0]['machine']['torch_threads']} threads, median of "
             f"{rows[0].get('repeats', 1)} run(s) per point. Context "
             f"{rows[0]['context_tokens']} tokens; writer answers {rows[0]['answer_tokens']} tokens.\n",
             "| model | backend | dtype | message tokens | text pipeline s | full pipeline s | slice pipeline s | "
             "speedup full | text handoff s | cache handoff s | cache/text handoff | artifact MB | exact | "
             "= one prefill |",
             "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---|"]
    for r in rows:
        lines.append(f"| {r['model']} | {r.get('backend', 'transformers')} | {r.get('dtype', r['machine']['dtype'])} | "
                     f"{r['message_tokens']} | {r['text_pipeline_s']:.2f} | "
                     f"{r['cache_pipeline_s']:.2f} | {r['slice_pipeline_s']:.2f} | {r['speedup_full']:.1f}x | "
                     f"{r['text_handoff_s']:.2f} | {r['cache_handoff_s']:.3f} | {100 * r['handoff_ratio']:.2f}% | "
                     f"{r['artifact_bytes'] / 1e6:.1f} | {r['exact']} | {r.get('exact_vs_one_prefill', '')} |")
    lines += ["", "`exact`: the writer's answer after the full handoff through artifact bytes equals the answer of a "
              "writer handed the analyst's very tensors in memory (the bytes change nothing). `= one prefill`: it "
              "also equals prefilling all the writer's tokens in one pass, which needs the runtime to round a split "
              "prefill as it rounds one pass: true in fp32, not always in bf16."]
    honest = [r for r in rows if "llama_text_pipeline_s" in r]
    if honest:
        lines += ["", "## The honest comparison: c2c's cache pipeline against the text pipeline on llama.cpp", "",
                  f"Text on llama.cpp: llama-cpp-python {honest[0]['llama_cpp_python']} built from source "
                  "(flags in the README), the zoo's GGUF as shipped, the same prompts and token counts "
                  "(`benchmarks/llama_text.py`), in the same run as the c2c pipelines.", "",
                  "| model | message tokens | c2c cache pipeline s (backend, dtype) | llama.cpp text pipeline s | "
                  "analyst read / message / writer read / answer s | cache speedup |",
                  "|---|---:|---:|---:|---|---:|"]
        for r in honest:
            lines.append(f"| {r['model']} | {r['message_tokens']} | {r['cache_pipeline_s']:.2f} "
                         f"({r.get('backend', 'transformers')}, {r.get('dtype', r['machine']['dtype'])}) | "
                         f"{r['llama_text_pipeline_s']:.2f} | {r['llama_analyst_read_s']:.2f} / "
                         f"{r['llama_message_s']:.2f} / {r['llama_writer_read_s']:.2f} / {r['llama_answer_s']:.2f} | "
                         f"**{r['speedup_vs_llama_text']:.1f}x** |")
    bounded = [r for r in rows if "cache_bound_s" in r]
    if bounded:
        lim = bounded[0]["limits"]
        lines += ["", "## The compute bound", "",
                  f"Measured in this run, before every point and at the end, the best of each: matrix products at "
                  f"**{lim['gemm_gflops']:.0f} GFLOPS**, memory read at **{lim['read_gb_s']:.1f} GB/s**. The bound of "
                  "each forward pass is the larger of its FLOPs and its bytes at those rates (module doc of "
                  "`benchmarks/handoff_sweep.py`).", "",
                  "| model | dtype | message tokens | cache pipeline s | bound s (prefill + decode) | of bound | "
                  "llama.cpp text / bound |",
                  "|---|---|---:|---:|---|---:|---:|"]
        for r in bounded:
            vs = f"{r['speedup_bound_vs_llama_text']:.1f}x" if "speedup_bound_vs_llama_text" in r else "—"
            lines.append(f"| {r['model']} | {r.get('dtype', r['machine']['dtype'])} | {r['message_tokens']} | "
                         f"{r['cache_pipeline_s']:.2f} | {r['cache_bound_s']:.2f} ({r['cache_bound_prefill_s']:.2f} + "
                         f"{r['cache_bound_decode_s']:.2f}) | {100 * r['cache_of_bound']:.0f}% | {vs} |")
    keys = ("text_pipeline_s", "cache_pipeline_s", "text_handoff_s", "cache_handoff_s")
    lines += ["", "## Advisor: predicted vs measured (calibrated in the same run)", "",
              "| model | message tokens | " + " | ".join(f"{k} pred / meas (err)" for k in keys) + " | decision |",
              "|---|---:|" + "---:|" * len(keys) + "---|"]
    for r in rows:
        cells = [f"{r['predicted_' + k]:.2f} / {r[k]:.2f} ({100 * r['prediction_error_' + k]:+.0f}%)" for k in keys]
        lines.append(f"| {r['model']} | {r['message_tokens']} | " + " | ".join(cells) + f" | {r['advisor_decision']} |")
    worst = {k: max(abs(r["prediction_error_" + k]) for r in rows) for k in keys}
    lines += ["", "Worst absolute prediction error: " + ", ".join(f"{k} {100 * v:.0f}%" for k, v in worst.items())]
    return "\n".join(lines) + "\n"


def plot(rows: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    models = sorted({r["model"] for r in rows})
    fig, axes = plt.subplots(1, len(models), figsize=(6 * len(models), 4.2), squeeze=False)
    for ax, m in zip(axes[0], models):
        rs = [r for r in rows if r["model"] == m]
        xs = [r["message_tokens"] for r in rs]
        for key, label in [("text_pipeline_s", "text"), ("cache_pipeline_s", "full cache"),
                           ("slice_pipeline_s", "slice"), ("llama_text_pipeline_s", "text on llama.cpp")]:
            if all(key in r for r in rs):
                ax.plot(xs, [r[key] for r in rs], marker="o", label=label)
        ax.set_title(m)
        ax.set_xlabel("message tokens")
        ax.set_ylabel("two-agent pipeline (s)")
        ax.grid(alpha=0.3)
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    raise SystemExit(main())
