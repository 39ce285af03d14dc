"""KV verification against a compromised signer: detection probability vs k, and cost vs a strict re-prefill.

    .venv/bin/python benchmarks/trust_verify.py                  # Qwen2.5-Coder-0.5B, both parts (~14 min, 2 CPUs)
    .venv/bin/python benchmarks/trust_verify.py --part slices    # slices only, merged into the saved results
    .venv/bin/python benchmarks/trust_verify.py --tokens 256 --reps 1 --slice-trials-per-layer 2   # quick look

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

Slices (``--part slices``). A sender with a private role exports its evidence
with isolation "recompute" (``Agent.export``): the slice is re-prefilled after
the team's shared prefix only, at ``[prefix_len, prefix_len + n)``, so every
receiver can verify it against its own prefix cache. For each layer in turn,
``--slice-trials-per-layer`` trials each tamper 10% of the slice's positions of
that layer (K and V copied from other positions: plausible values, wrong
place), re-sign with the trusted key, and run the receiver's real check
(``c2c.trust.check``, sample k=48, ``context`` = the prefix cache). Reported:
the detected count with a one-sided 95% Clopper-Pearson lower bound, the exact
k=48 detection probability of one tampering per layer (computed as above),
the honest false-positive count, and the cost of sampled vs strict checks of
the slice. A slice whose layers 1..N-1 are noise is shown three ways: with
the context (refused), without it (refused as unverifiable), and with
``allow_partial`` (layer 0 only: it passes, which is why that is opt-in).
"""

from __future__ import annotations

import argparse
import json
import math
import random
import statistics
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import torch

from c2c.artifact import Artifact
from c2c.artifact.fingerprint import Fingerprint
from c2c.artifact.prefix import PrefixRef
from c2c.bench import results
from c2c.errors import UnverifiableError, VerificationFailedError
from c2c.runtime import zoo
from c2c.runtime.kvcache import KVCache
from c2c.trust.keys import Keyring, SigningKey
from c2c.trust.verify_policy import VerifyPolicy, check_received
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


def full_part(args, rt, fp: Fingerprint, key: SigningKey, ks: list[int], rng: random.Random, log) -> dict:
    """The full-cache part: detection of every tampering vs k, exact and Monte-Carlo, and cost."""
    ids = corpus_ids(rt, args.tokens)
    _, cache = rt.prefill(ids)
    T = cache.seq_len
    tol = default_tolerance(rt.dtype, rt.device)

    def art_of(c: KVCache) -> Artifact:  # the compromised signer re-signs whatever it made
        return sign(Artifact.build(c, fingerprint=fp, prefix=PrefixRef.of(list(c.token_ids[:32]))), key)

    honest = art_of(cache)

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
    return {"summary": summary, "cost": cost, "calibration": calib, "detection": rows, "ks": ks}


# --------------------------------------------------------------- slices
SLICE_SYSTEM = "You are one agent of a team that reviews the c2c code base. Be precise and brief."
SLICE_ROLE = "You are the reviewer. Private: the release is blocked until the audit passes; never say so."


def tamper_positions(cache: KVCache, layer: int, fraction: float, rng: random.Random) -> KVCache:
    """``fraction`` of the positions of ``layer``: K and V copied from other positions (wrong place)."""
    n = cache.seq_len
    hit = rng.sample(range(n), max(1, round(n * fraction)))
    src = [(p + rng.randrange(1, n)) % n for p in hit]
    k, v = cache.keys[layer].clone(), cache.values[layer].clone()
    k[:, :, hit], v[:, :, hit] = cache.keys[layer][:, :, src], cache.values[layer][:, :, src]
    return edit(cache, layer, k, v)


def lower_bound_95(detected: int, trials: int) -> float:
    """One-sided 95% Clopper-Pearson lower bound of a rate seen ``detected`` times in ``trials``."""
    if detected == 0:
        return 0.0

    def tail(p: float) -> float:  # P(X >= detected) for X ~ Binomial(trials, p); increasing in p
        return sum(math.comb(trials, x) * p ** x * (1 - p) ** (trials - x) for x in range(detected, trials + 1))

    lo, hi = 0.0, 1.0
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if tail(mid) < 0.05 else (lo, mid)
    return lo


def slice_part(args, rt, fp: Fingerprint, key: SigningKey, log) -> dict:
    """Recomputed slices after the shared prefix: detection per layer, honest false positives, cost."""
    from c2c.artifact.prefix import SharedPrefix
    from c2c.team.agent import Agent, Team

    k, n = args.slice_k, args.slice_tokens
    team = Team(shared=SharedPrefix.build(SLICE_SYSTEM), domain="bench")
    prefix = team.prefix_cache(rt)  # what every receiver of the team holds: the context a slice is checked after
    P, tol = prefix.end, default_tolerance(rt.dtype, rt.device)
    ring = Keyring(Path(tempfile.mkdtemp()) / "keys")
    ring.trust(key.public)  # the compromised signer's key is trusted
    policy = VerifyPolicy(kv="sample", samples=k)
    ids = corpus_ids(rt, n * args.honest_slices)
    honest = []
    for i in range(args.honest_slices):
        log(f"slices: honest sender {i} reads {n} tokens after a private role and exports (recompute)...")
        sender = Agent(f"sender{i}", rt, team, role=SLICE_ROLE)
        sender.read(rt.decode(ids[i * n:(i + 1) * n]), label="evidence")
        art = sign(sender.export(labels=("evidence",)), key)
        if art.header.labels.get("isolation") != "recompute" or art.header.start != P:
            raise SystemExit(f"expected a recomputed slice at {P}, got {art.header.labels} at {art.header.start}")
        honest.append(art)
    base = honest[0]
    c, L = base.cache, base.cache.num_layers

    def signed(cache: KVCache) -> Artifact:  # what the compromised signer sends instead
        h = base.header
        return sign(Artifact.build(cache, fingerprint=fp, prefix=h.prefix, producer=dict(h.producer),
                                   labels=dict(h.labels)), key)

    def refused(art: Artifact, seed: int) -> bool:
        """The receiver's real check (signature, prefix context, k probes); True when it refuses."""
        try:
            check_received(art, ring, "bench", policy, runtime=rt, context=prefix, rng=random.Random(seed))
        except VerificationFailedError:
            return True
        return False

    # ------------------------------------------------- honest errors and false positives
    log("slices: honest errors at every position, then sampled checks of honest slices...")
    calib = []
    for art in honest:
        full = prefix.append(art.cache)
        e = probe_errors(rt, full, list(range(P, full.end)))
        calib.append({"slice_tokens": art.header.seq_len, "max_error_deep": float(e.max()),
                      "max_error_layer0": float(layer0_errors(rt, art.cache).max()), "tolerance": tol})
    honest_refused = sum(refused(honest[t % len(honest)], 20_000 + t) for t in range(args.honest_trials))

    # ------------------------------------------------- 10% of one layer's positions, each layer in turn
    trng = random.Random(args.seed + 1)
    per_layer = []
    for layer in range(L):
        caught = 0
        for trial in range(args.slice_trials_per_layer):
            bad = tamper_positions(c, layer, 0.1, trng)
            if trial == 0:  # exact k-probe detection of this tampering (all positions probed once)
                full = prefix.append(bad)
                deep = probe_errors(rt, full, list(range(P, full.end))).amax(dim=(0, 1))
                flags = [bool(not (e <= tol)) for e in deep.tolist()]
                l0 = bool(not (layer0_errors(rt, bad).max() <= tol))
                exact = 1.0 if l0 else detection_vs_k(flags, 0, len(flags), [k])[k]
                flagged = sum(flags)
            caught += refused(signed(bad), 30_000 + 1000 * layer + trial)
        per_layer.append({"layer": layer, "trials": args.slice_trials_per_layer, "detected": caught,
                          "exact_detection": exact, "flagged_positions": flagged, "layer0_sweep": l0,
                          "edited_positions": max(1, round(c.seq_len * 0.1))})
        log(f"slices: layer {layer}: {caught}/{args.slice_trials_per_layer} detected, exact k={k} {exact:.4f}")

    # ------------------------------------------------- the finding: layers 1..N-1 replaced by noise
    g = torch.Generator().manual_seed(args.seed)
    noise = lambda t: torch.randn(t.shape, generator=g, dtype=t.dtype) * t.std() + t.mean()  # noqa: E731
    noisy = signed(replace(c, keys=c.keys[:1] + tuple(noise(t) for t in c.keys[1:]),
                           values=c.values[:1] + tuple(noise(t) for t in c.values[1:])))
    try:
        check_received(noisy, ring, "bench", policy, runtime=rt)
        without = "passed"
    except (UnverifiableError, VerificationFailedError) as e:
        without = f"refused ({type(e).__name__})"
    partial = check_received(noisy, ring, "bench", replace(policy, allow_partial=True), runtime=rt).kv
    noise_row = {"with_context": "refused (VerificationFailedError)" if refused(noisy, 1) else "passed",
                 "without_context": without,
                 "allow_partial": f"passed (layers {partial.layers}, {partial.layer0_positions} positions)"}

    # ------------------------------------------------- cost, interleaved
    log(f"slices: timing strict vs sampled checks of a {c.seq_len}-token slice ({args.reps} reps)...")
    timings: dict[str, list[float]] = {"strict (context)": [], f"sample k={k} (context)": [],
                                       "layer 0 only (allow_partial)": []}
    for _ in range(args.reps):
        for name in timings:
            t = time.perf_counter()
            if name.startswith("strict"):
                verify_kv(base, rt, mode="strict", context=prefix)
            elif name.startswith("sample"):
                verify_kv(base, rt, mode="sample", samples=k, context=prefix)
            else:
                verify_kv(base, rt, mode="sample", allow_partial=True)
            timings[name].append(time.perf_counter() - t)
    strict_s = statistics.median(timings["strict (context)"])
    cost = [{"mode": name, "seconds": statistics.median(v), "relative_to_strict": statistics.median(v) / strict_s,
             "all_runs_s": v} for name, v in timings.items()]

    detected, trials = sum(r["detected"] for r in per_layer), sum(r["trials"] for r in per_layer)
    lb = lower_bound_95(detected, trials)
    min_exact = min(r["exact_detection"] for r in per_layer)
    ratio = statistics.median(timings[f"sample k={k} (context)"]) / strict_s
    summary = {"model": rt.name, "prefix_tokens": P, "slice_tokens": c.seq_len, "layers": L, "k": k,
               "tolerance": tol, "threads": args.threads, "detected": detected, "trials": trials,
               "detection_rate": detected / trials, "detection_lower_95": lb,
               "min_exact_detection_over_layers": min_exact,
               "honest_refused": honest_refused, "honest_trials": args.honest_trials,
               "sample_cost_relative_to_strict": ratio,
               "acceptance": {"detection>=0.99": lb >= 0.99 and min_exact >= 0.99, "honest_refused==0":
                              honest_refused == 0}}
    return {"summary": summary, "per_layer": per_layer, "noise_above_layer0": noise_row, "cost": cost,
            "calibration": calib}


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
    ap.add_argument("--part", choices=["all", "full", "slices"], default="all",
                    help="full caches, slices, or both; 'slices' keeps the saved full-cache results")
    ap.add_argument("--slice-tokens", type=int, default=512, help="evidence tokens per honest slice")
    ap.add_argument("--honest-slices", type=int, default=2, help="honest slices (distinct evidence)")
    ap.add_argument("--slice-trials-per-layer", type=int, default=25,
                    help="tampered slices per layer, each layer in turn (24 x 25 = 600 trials: 600/600 "
                         "bounds the detection rate >= 99.5%%, 599/600 >= 99.2%%, one-sided 95%%)")
    ap.add_argument("--honest-trials", type=int, default=100, help="sampled checks of honest slices")
    ap.add_argument("--slice-k", type=int, default=48, help="deep probes k for the slice checks")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    ks = [int(x) for x in args.ks.split(",")]
    rng = random.Random(args.seed)
    torch.manual_seed(args.seed)

    rt = zoo.load(args.model)
    fp = Fingerprint.of(rt)  # computes the weights digest once, outside every timing
    key = SigningKey.generate("bench")
    log = lambda *a: print(*a, file=sys.stderr, flush=True)  # noqa: E731
    cmd = ("python benchmarks/trust_verify.py " + " ".join(sys.argv[1:])).strip()
    if args.part == "slices":  # keep the saved full-cache results, replace the slice part
        saved = Path(args.out).with_suffix(".json")
        if not saved.is_file():
            raise SystemExit(f"--part slices merges into {saved}, which does not exist; run --part all")
        result = json.loads(saved.read_text())
    else:
        result = {"command": cmd, **full_part(args, rt, fp, key, ks, rng, log)}
    if args.part != "full":
        result["slices"] = {"command": cmd, **slice_part(args, rt, fp, key, log)}
    return results.write(args.out, result, table(result), plot=lambda path: plot(result, path))


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
    if "slices" in r:
        lines += slice_table(r["slices"])
    return "\n".join(lines)


def slice_table(r: dict) -> list[str]:
    s, k = r["summary"], r["summary"]["k"]
    acc = s["acceptance"]
    lines = [f"# Slices: recomputed after the shared prefix ({s['model']}, {s['slice_tokens']}-token slice after a "
             f"{s['prefix_tokens']}-token prefix, fp32 CPU)", "",
             f"Command: `{r['command']}`", "",
             "A sender with a private role exports its evidence with isolation `recompute`, signs it with a trusted "
             "key, then tampers with it. The receiver runs its real check (`c2c.trust.check`: signature, then "
             f"sample k={k} with `context` = its own shared-prefix cache). Each layer in turn: "
             f"{r['per_layer'][0]['trials']} trials, each editing 10% of the slice's positions of that layer "
             "(K and V copied from other positions), fresh random positions per trial; probe positions from a seeded "
             "`random.Random` per trial (receivers use `SystemRandom`).", "",
             "## Detection", "",
             f"- detected **{s['detected']}/{s['trials']}** = {s['detection_rate']:.4f}; one-sided 95% lower bound "
             f"(Clopper-Pearson) {s['detection_lower_95']:.4f}",
             f"- exact k={k} detection probability of one such tampering per layer: min over layers "
             f"{s['min_exact_detection_over_layers']:.4f}",
             f"- honest slices refused: {s['honest_refused']}/{s['honest_trials']} sampled checks", "",
             f"| layer | detected | exact k={k} | flagged positions (of {s['slice_tokens']}) | layer-0 sweep |",
             "|---:|---:|---:|---:|:---:|"]
    lines += [f"| {row['layer']} | {row['detected']}/{row['trials']} | {row['exact_detection']:.4f} | "
              f"{row['flagged_positions']} | {'yes' if row['layer0_sweep'] else 'no'} |" for row in r["per_layer"]]
    nz = r["noise_above_layer0"]
    lines += ["", "## A slice whose layers 1..N-1 are noise (signed by the trusted key)", "",
              "| receiver's check | outcome |", "|---|---|",
              f"| sample k={k}, context = prefix cache | {nz['with_context']} |",
              f"| sample k={k}, no context | {nz['without_context']} |",
              f"| sample, no context, `allow_partial` | {nz['allow_partial']} |",
              "", "## Cost of checking the slice (median wall time, interleaved)", "",
              "| mode | seconds | relative to strict |", "|---|---:|---:|"]
    lines += [f"| {c['mode']} | {c['seconds']:.4f} | {c['relative_to_strict']:.3f} |" for c in r["cost"]]
    lines += ["", "Honest recomputation error of the slices (every position, every layer):", "",
              "| slice tokens | max deep | max layer 0 | tolerance |", "|---:|---:|---:|---:|"]
    lines += [f"| {c['slice_tokens']} | {c['max_error_deep']:.2e} | {c['max_error_layer0']:.2e} | {c['tolerance']:g} |"
              for c in r["calibration"]]
    lines += ["", "## Acceptance (slices)", "",
              f"- detection of 10% of one layer's positions, any layer, k={k}: {s['detected']}/{s['trials']}, "
              f"lower bound {s['detection_lower_95']:.4f}, exact min {s['min_exact_detection_over_layers']:.4f} "
              f"({'PASS' if acc['detection>=0.99'] else 'FAIL'}, need >= 0.99)",
              f"- honest false positives: {s['honest_refused']}/{s['honest_trials']} "
              f"({'PASS' if acc['honest_refused==0'] else 'FAIL'})",
              f"- cost of sample k={k} relative to strict: {s['sample_cost_relative_to_strict']:.3f}", ""]
    return lines


def plot(r: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sl = r.get("slices")
    fig, ax = plt.subplots(1, 3 if sl else 2, figsize=(18 if sl else 12, 4.5))
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
    if sl:
        rows, k = sl["per_layer"], sl["summary"]["k"]
        layers = [row["layer"] for row in rows]
        ax[2].bar(layers, [row["detected"] / row["trials"] for row in rows], color="tab:blue", alpha=0.6,
                  label="detected / trials (real check)")
        ax[2].plot(layers, [row["exact_detection"] for row in rows], "o-", color="tab:red", ms=3,
                   label=f"exact k={k} probability")
        ax[2].axhline(0.99, color="grey", ls=":", lw=1)
        ax[2].set_ylim(0.9, 1.005)
        ax[2].set_xlabel("tampered layer (10% of the slice's positions)")
        ax[2].set_ylabel("detection")
        ax[2].legend(fontsize=7, loc="lower left")
        ss = sl["summary"]
        ax[2].set_title(f"slices after the prefix: {ss['detected']}/{ss['trials']} detected, "
                        f"cost {ss['sample_cost_relative_to_strict']:.3f} of strict", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


if __name__ == "__main__":
    sys.exit(main())
