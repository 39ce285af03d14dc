"""KV verification against a compromised signer: detection probability vs k, and cost vs a strict re-prefill.

    .venv/bin/python benchmarks/trust_verify.py                  # Qwen2.5-Coder-0.5B, 1024 tokens (~6 min, 2 CPUs)
    .venv/bin/python benchmarks/trust_verify.py --tokens 256 --reps 1   # quick look

Outputs benchmarks/results/trust_verify.{json,md,png} (or --out PREFIX).

How detection is measured. The attacker is a compromised signer: it edits the
cache (or the claimed tokens), rebuilds and re-signs the artifact, so the
signature check always passes (detection 0). For every tampering we probe *all*
T positions once (each probe is independent of which others are probed: it
attends only to the artifact's own cache), flag the positions whose recomputed
K/V differ beyond the tolerance, and run the layer-0 sweep. Sampled
verification draws one position from each of k equal strata, so its detection
probability is exactly ``1 - prod_s (1 - flagged_s / size_s)``, or 1 when the
layer-0 sweep already fires. A Monte-Carlo run of the real ``verify_kv`` checks
that formula. Strict detection compares against a fresh prefill of the claimed
tokens.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import torch

from c2c.artifact import Artifact
from c2c.fingerprint import Fingerprint
from c2c.prefix import PrefixRef
from c2c.runtime import zoo
from c2c.runtime.kvcache import KVCache
from c2c.trust.keys import Keyring, SigningKey
from c2c.trust.signing import sign, verify_signature
from c2c.trust.verify import default_tolerance, layer0_errors, probe_errors, relative_errors, verify_kv

RESULTS = Path(__file__).resolve().parent / "results"
SRC = Path(__file__).resolve().parents[1] / "src" / "c2c"


def corpus_ids(rt, n: int) -> list[int]:
    text = "\n\n".join(p.read_text() for p in sorted(SRC.rglob("*.py")))
    ids = rt.encode(text)
    if len(ids) < n:
        raise SystemExit(f"only {len(ids)} tokens of text; lower --tokens")
    return ids[:n]


# ------------------------------------------------------------- tamperings
def edit(cache: KVCache, layer: int, keys=None, values=None) -> KVCache:
    ks, vs = list(cache.keys), list(cache.values)
    if keys is not None:
        ks[layer] = keys
    if values is not None:
        vs[layer] = values
    return replace(cache, keys=tuple(ks), values=tuple(vs))


def tamperings(cache: KVCache, rng: random.Random) -> list[tuple[str, str, float, KVCache]]:
    """``(name, family, fraction of one layer's positions edited, tampered cache)``.

    Token swaps change ``token_ids`` only (fraction 0: no K/V edited)."""
    T, L = cache.seq_len, cache.num_layers
    last, mid = L - 1, L // 2
    out = []
    for layer in (1, mid, last):
        out.append((f"whole layer {layer} shifted by one position", "layer_shift", 1.0,
                    edit(cache, layer, torch.roll(cache.keys[layer], 1, 2), torch.roll(cache.values[layer], 1, 2))))
    for layer in (0, mid, last):
        hit = rng.sample(range(T), T // 10)
        src = [rng.randrange(T) for _ in hit]
        k, v = cache.keys[layer].clone(), cache.values[layer].clone()
        k[:, :, hit], v[:, :, hit] = cache.keys[layer][:, :, src], cache.values[layer][:, :, src]
        out.append((f"10% of positions of layer {layer} (random)", "positions_10pct", 0.1, edit(cache, layer, k, v)))
    a = rng.randrange(T - T // 10)
    k, v = cache.keys[last].clone(), cache.values[last].clone()
    k[:, :, a:a + T // 10] = torch.roll(k[:, :, a:a + T // 10], 7, 2)
    v[:, :, a:a + T // 10] = torch.roll(v[:, :, a:a + T // 10], 7, 2)
    out.append((f"10% of positions of layer {last} (one block)", "positions_10pct", 0.1, edit(cache, last, k, v)))
    for layer in (mid, last):
        p, q = rng.sample(range(T), 2)
        k, v = cache.keys[layer].clone(), cache.values[layer].clone()
        k[:, :, p], v[:, :, p] = cache.keys[layer][:, :, q], cache.values[layer][:, :, q]
        out.append((f"single position of layer {layer}", "single_position", 1 / T, edit(cache, layer, k, v)))
    g = torch.Generator().manual_seed(rng.randrange(2**31))
    for layer, span, strength, what in ((mid, (0, T), 0.1, "all positions"),
                                        (last, (T - 64, T), 0.5, "last 64 positions")):
        v = cache.values[layer].clone()                                    # (1, H, T, D)
        d = torch.randn(1, v.shape[1], 1, v.shape[3], generator=g)
        d = d / d.norm(dim=-1, keepdim=True)                               # one unit direction per head
        rms = v.pow(2).mean(dim=(2, 3), keepdim=True).sqrt() * v.shape[3] ** 0.5  # per-head vector norm
        v[:, :, span[0]:span[1]] += strength * rms * d
        out.append((f"poison vector (+{strength} x norm) on {what} of layer {layer}", "poison",
                    (span[1] - span[0]) / T, edit(cache, layer, values=v)))
    for n_pairs in (1, 8):
        ids = list(cache.token_ids)
        for p in rng.sample(range(T - 1), n_pairs):
            ids[p], ids[p + 1] = ids[p + 1], ids[p]
        if ids == list(cache.token_ids):
            continue
        out.append((f"{n_pairs} adjacent token pair(s) swapped in the header", "token_swap", 0.0,
                    replace(cache, token_ids=tuple(ids))))
    return out


def detection_vs_k(flags: list[bool], start: int, end: int, ks: list[int]) -> dict[int, float]:
    """Exact probability that stratified sampling of k positions hits a flagged one."""
    out = {}
    for k in ks:
        n = end - start
        if k >= n:
            out[k] = 1.0 if any(flags) else 0.0
            continue
        bounds = [(i * n) // k for i in range(k + 1)]
        miss = 1.0
        for i in range(k):
            seg = flags[bounds[i]:bounds[i + 1]]
            miss *= 1 - sum(seg) / len(seg)
        out[k] = 1 - miss
    return out


def median_time(fn, reps: int) -> float:
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


# ---------------------------------------------------------------- main
def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="Qwen2.5-Coder-0.5B-Instruct", help="zoo model")
    ap.add_argument("--tokens", type=int, default=1024, help="cache length T")
    ap.add_argument("--ks", default="1,2,4,8,16,32,48,64,128", help="deep-probe counts k to report")
    ap.add_argument("--cost-ks", default="16,48,64", help="k values whose cost is timed")
    ap.add_argument("--reps", type=int, default=3, help="timing repetitions (median)")
    ap.add_argument("--mc-trials", type=int, default=20, help="Monte-Carlo runs of verify_kv per checked tampering")
    ap.add_argument("--bf16-tokens", type=int, default=256, help="tokens for the bf16 honest-error calibration (0: skip)")
    ap.add_argument("--seed", type=int, default=0, help="seed of the tamperings")
    ap.add_argument("--threads", type=int, default=1,
                    help="torch CPU threads (1: the 2-core machine is shared, and 2 OpenMP threads spin under load)")
    ap.add_argument("--out", default=str(RESULTS / "trust_verify"), help="output path prefix")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    ks = [int(x) for x in args.ks.split(",")]
    rng = random.Random(args.seed)
    torch.manual_seed(args.seed)

    rt = zoo.load(args.model)
    fp = Fingerprint.of(rt)  # computes the weights digest once, outside every timing
    ids = corpus_ids(rt, args.tokens)
    _, cache = rt.prefill(ids)
    T = cache.seq_len
    tol = default_tolerance(rt.dtype, rt.device)
    key = SigningKey.generate("bench")

    def art_of(c: KVCache) -> Artifact:  # the compromised signer re-signs whatever it made
        return sign(Artifact.build(c, fingerprint=fp, prefix=PrefixRef.of(list(c.token_ids[:32]))), key)

    honest = art_of(cache)
    log = lambda *a: print(*a, file=sys.stderr, flush=True)  # noqa: E731

    # -------------------------------------------------------------- cost
    log(f"timing strict and sampled verification of {T} tokens ({args.reps} reps, interleaved)...")
    timings: dict[str, list[float]] = {"prefill": [], "strict": [], "layer0 sweep only": []}
    for k in [int(x) for x in args.cost_ks.split(",")]:
        timings[f"sample k={k}"] = []
    for _ in range(args.reps):
        for name in timings:
            t = time.perf_counter()
            if name == "prefill":
                rt.prefill(ids)
            elif name == "strict":
                verify_kv(honest, rt, mode="strict")
            elif name == "layer0 sweep only":
                layer0_errors(rt, honest.cache)
            else:
                verify_kv(honest, rt, mode="sample", samples=int(name.split("=")[1]))
            timings[name].append(time.perf_counter() - t)
    ring = Keyring(Path(tempfile.mkdtemp()) / "keys")  # signature only: the artifact is in memory
    ring.trust(key.public)
    sig_s = median_time(lambda: verify_signature(honest, ring, domain="bench"), 20)
    strict_s = statistics.median(timings["strict"])
    cost = [{"mode": "signature only", "seconds": sig_s, "relative_to_strict": sig_s / strict_s}]
    cost += [{"mode": name, "seconds": statistics.median(v), "relative_to_strict": statistics.median(v) / strict_s,
              "all_runs_s": v} for name, v in timings.items()]

    # ------------------------------------------------------ honest errors
    log("honest errors at every position...")
    all_pos = list(range(T))
    honest_deep = probe_errors(rt, cache, all_pos)           # (L, 2, T)
    honest_l0 = layer0_errors(rt, cache)                      # (2, T)
    calib = [{"dtype": "float32", "device": "cpu", "tokens": T, "max_error_deep": float(honest_deep.max()),
              "p99_error_deep": float(honest_deep.amax(dim=(0, 1)).quantile(0.99)),
              "max_error_layer0": float(honest_l0.max()), "tolerance": tol}]
    if args.bf16_tokens:
        log("bf16 calibration...")
        rb = zoo.load(args.model, dtype="bfloat16")
        _, cb = rb.prefill(ids[:args.bf16_tokens])
        eb = probe_errors(rb, cb, list(range(cb.seq_len)))
        calib.append({"dtype": "bfloat16", "device": "cpu", "tokens": cb.seq_len, "max_error_deep": float(eb.max()),
                      "p99_error_deep": float(eb.amax(dim=(0, 1)).quantile(0.99)),
                      "max_error_layer0": float(layer0_errors(rb, cb).max()),
                      "tolerance": default_tolerance(torch.bfloat16, "cpu")})
        del rb, cb

    # ---------------------------------------------------------- tampering
    rows = []
    mc_targets = {"10% of positions of layer 23 (random)", "10% of positions of layer 23 (one block)",
                  f"single position of layer {cache.num_layers // 2}"}
    for name, family, fraction, bad in tamperings(cache, rng):
        log(f"tampering: {name}")
        deep = probe_errors(rt, bad, all_pos).amax(dim=(0, 1))               # (T,)
        flags = [bool(not (e <= tol)) for e in deep.tolist()]
        l0 = bool(not (layer0_errors(rt, bad).max() <= tol))
        if bad.token_ids != cache.token_ids:
            _, ref = rt.prefill(list(bad.token_ids))
        else:
            ref = cache
        strict_err = relative_errors(ref.keys, ref.values, bad.keys, bad.values).max()
        probes = detection_vs_k(flags, 0, T, ks)
        row = {"tampering": name, "family": family, "edited_fraction": fraction, "flagged_positions": sum(flags), "layer0_sweep": l0,
               "strict": bool(not (strict_err <= tol)), "signature": False,
               "probes_only": {str(k): p for k, p in probes.items()},
               "sample": {str(k): 1.0 if l0 else p for k, p in probes.items()}}
        if name in mc_targets and args.mc_trials:
            bad_art = art_of(bad)
            caught = 0
            for trial in range(args.mc_trials):
                try:
                    verify_kv(bad_art, rt, mode="sample", samples=48, rng=random.Random(1000 + trial))
                except Exception as e:  # noqa: BLE001 - only VerificationFailedError is expected
                    if type(e).__name__ != "VerificationFailedError":
                        raise
                    caught += 1
            row["monte_carlo_k48"] = {"trials": args.mc_trials, "detected": caught}
        rows.append(row)

    worst_10pct = min(r["sample"]["48"] for r in rows if r["edited_fraction"] >= 0.1)
    s48 = next(c for c in cost if c["mode"] == "sample k=48")
    summary = {"tokens": T, "model": rt.name, "tolerance": tol, "threads": args.threads,
               "min_detection_k48_over_10pct_of_a_layer": worst_10pct,
               "sample_k48_cost_relative_to_strict": s48["relative_to_strict"],
               "acceptance": {"detection>=0.99": worst_10pct >= 0.99, "cost<=0.10": s48["relative_to_strict"] <= 0.10}}
    cmd = ("python benchmarks/trust_verify.py " + " ".join(sys.argv[1:])).strip()
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    result = {"command": cmd, "summary": summary, "cost": cost, "calibration": calib, "detection": rows, "ks": ks}
    out.with_suffix(".json").write_text(json.dumps(result, indent=2))
    md = table(result)
    out.with_suffix(".md").write_text(md)
    plot(result, out.with_suffix(".png"))
    print(md)
    return 0


def table(r: dict) -> str:
    s, ks = r["summary"], r["ks"]
    lines = [f"# KV verification: {s['model']}, {s['tokens']}-token cache, fp32 CPU", "",
             f"Command: `{r['command']}`", "",
             f"Tolerance (relative, max over heads/dims / layer rms): {s['tolerance']:g}. "
             f"torch threads: {s.get('threads', 'default')} (the 2-core machine is shared; see --threads).", "",
             "## Detection probability (compromised signer: tampered, then re-signed)", "",
             "`sample k` = layer-0 sweep at every position + k stratified deep probes (what `--mode sample` runs); "
             "signature-only detection is 0 for every row, strict is shown last.", "",
             "| tampering | flagged positions | layer-0 sweep | " + " | ".join(f"k={k}" for k in ks) + " | strict | MC k=48 |",
             "|---|---:|:---:|" + "---:|" * len(ks) + ":---:|---:|"]
    for row in r["detection"]:
        mc = row.get("monte_carlo_k48")
        lines.append(f"| {row['tampering']} | {row['flagged_positions']} | {'yes' if row['layer0_sweep'] else 'no'} | "
                     + " | ".join(f"{row['sample'][str(k)]:.3f}" for k in ks)
                     + f" | {'yes' if row['strict'] else 'no'} | {mc['detected']}/{mc['trials'] if mc else ''} |"
                     if mc else
                     f"| {row['tampering']} | {row['flagged_positions']} | {'yes' if row['layer0_sweep'] else 'no'} | "
                     + " | ".join(f"{row['sample'][str(k)]:.3f}" for k in ks)
                     + f" | {'yes' if row['strict'] else 'no'} | |")
    lines += ["", "## Cost (median wall time, same process, interleaved)", "",
              "| mode | seconds | relative to strict |", "|---|---:|---:|"]
    lines += [f"| {c['mode']} | {c['seconds']:.4f} | {c['relative_to_strict']:.3f} |" for c in r["cost"]]
    lines += ["", "## Honest recomputation error (sets the tolerance)", "",
              "| dtype | device | tokens | max deep | p99 deep | max layer 0 | tolerance |", "|---|---|---:|---:|---:|---:|---:|"]
    lines += [f"| {c['dtype']} | {c['device']} | {c['tokens']} | {c['max_error_deep']:.2e} | {c['p99_error_deep']:.2e} "
              f"| {c['max_error_layer0']:.2e} | {c['tolerance']:g} |" for c in r["calibration"]]
    acc = s["acceptance"]
    lines += ["", "## Acceptance", "",
              f"- min detection at k=48 over tamperings of >= 10% of one layer's positions: "
              f"{s['min_detection_k48_over_10pct_of_a_layer']:.4f} ({'PASS' if acc['detection>=0.99'] else 'FAIL'}, need >= 0.99)",
              f"- cost of sample k=48 relative to strict: {s['sample_k48_cost_relative_to_strict']:.3f} "
              f"({'PASS' if acc['cost<=0.10'] else 'FAIL'}, need <= 0.10)", ""]
    return "\n".join(lines)


def plot(r: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(1, 2, figsize=(12, 4.5))
    ks = r["ks"]
    ax[0].set_prop_cycle(color=plt.cm.tab20.colors[: len(r["detection"])])
    for row in r["detection"]:
        ax[0].plot(ks, [row["probes_only"][str(k)] for k in ks], marker="o", ms=3, label=row["tampering"])
    ax[0].set_xscale("log", base=2)
    ax[0].set_xlabel("deep probes k")
    ax[0].set_ylabel("detection probability (probes only, no layer-0 sweep)")
    ax[0].axhline(0.99, color="grey", ls=":", lw=1)
    ax[0].legend(fontsize=6)
    ax[0].set_title(f"{r['summary']['model']}, T={r['summary']['tokens']}")
    modes = [c for c in r["cost"] if c["mode"] != "prefill"]
    ax[1].barh([c["mode"] for c in modes], [c["relative_to_strict"] for c in modes])
    ax[1].axvline(0.10, color="red", ls=":", lw=1)
    ax[1].set_xlabel("cost relative to strict re-prefill")
    fig.tight_layout()
    fig.savefig(path, dpi=120)


if __name__ == "__main__":
    sys.exit(main())
