"""Fuzz the artifact parser and the signed-artifact loader; count crashes (must be 0).

    .venv/bin/python benchmarks/trust_fuzz.py               # 10,000 + 10,000 field-level inputs, every bit flip
    .venv/bin/python benchmarks/trust_fuzz.py --examples 1000

Outputs benchmarks/results/trust_fuzz.{json,md} (or --out PREFIX).

Three parts, all on artifacts generated in memory (``c2c.testing.hostile``):

1. *hypothesis*: byte mutations (bit flips, byte sets, truncation, insertion,
   deletion, splices, rewritten header length), JSON-level edits of the table
   and the c2c header (framing kept valid, so deep validation is reached) and
   raw junk, over six valid bases (signed fp32/bf16/slice/withheld/sliding, and
   unsigned). Every input must give an artifact or a ``C2CError``; any other
   exception is a crash. Every mutated signed artifact must also be refused by
   ``load_signed``.
2. *every bit flip* of one signed artifact, each through ``load_signed``.
3. *the hostile corpus*: each named bad artifact and the error it got.
4. *field-level*: hostile values in every header and table field, re-signed by
   a trusted key, through every model-free consumer (``hostile.consume``).

Time per input and the process's peak RSS bound hangs and allocations.
"""

from __future__ import annotations

import argparse
import hashlib
import resource
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

from hypothesis import HealthCheck, Phase, given, seed, settings  # noqa: E402

from c2c.artifact import Artifact  # noqa: E402
from c2c.bench import results  # noqa: E402
from c2c.errors import C2CError  # noqa: E402
from c2c.testing import hostile  # noqa: E402
from c2c.trust.signing import load_signed  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"


def rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--examples", type=int, default=10_000, help="hypothesis inputs")
    ap.add_argument("--field-examples", type=int, default=10_000,
                    help="field-level inputs (hostile header fields re-signed by a trusted key)")
    ap.add_argument("--seed", type=int, default=0, help="hypothesis seed")
    ap.add_argument("--out", default=str(RESULTS / "trust_fuzz"), help="output path prefix")
    args = ap.parse_args()

    ring, key, other, revoked = hostile.keys_for_corpus(Path(tempfile.mkdtemp()) / "keys")
    bases = hostile.base_artifacts(key)
    raw = [a.encode() for _, a in bases]
    signed = [name.startswith("signed") for name, _ in bases]
    rss0 = rss_mb()

    # ---------------------------------------------------------- 1. hypothesis
    stats = {"inputs": 0, "decoded": 0, "mutated_signed": 0, "mutated_signed_accepted": 0, "max_seconds": 0.0,
             "max_input_bytes": 0}
    errors: Counter = Counter()
    crashes: list[dict] = []

    @settings(max_examples=args.examples, deadline=None, database=None, phases=[Phase.generate],
              suppress_health_check=list(HealthCheck))
    @seed(args.seed)
    @given(hostile.fuzz_inputs(raw))
    def fuzz(case):
        i, data = case
        stats["inputs"] += 1
        stats["max_input_bytes"] = max(stats["max_input_bytes"], len(data))
        t = time.perf_counter()
        try:
            Artifact.decode(data)
            stats["decoded"] += 1
            errors["(decoded)"] += 1
        except C2CError as e:
            errors[type(e).__name__] += 1
        except BaseException as e:  # noqa: BLE001 - a crash is what we count
            crashes.append({"stage": "decode", "error": f"{type(e).__name__}: {e}"[:300],
                            "input_sha256": hashlib.sha256(data).hexdigest(), "input_head": data[:64].hex()})
        if i >= 0 and signed[i] and data != raw[i]:
            stats["mutated_signed"] += 1
            try:
                load_signed(data, ring, domain=hostile.DOMAIN)
                stats["mutated_signed_accepted"] += 1
            except C2CError:
                pass
            except BaseException as e:  # noqa: BLE001
                crashes.append({"stage": "load_signed", "error": f"{type(e).__name__}: {e}"[:300],
                                "input_sha256": hashlib.sha256(data).hexdigest()})
        stats["max_seconds"] = max(stats["max_seconds"], time.perf_counter() - t)

    t0 = time.perf_counter()
    fuzz()
    stats["seconds"] = time.perf_counter() - t0

    # ------------------------------------------------------- 2. every bit flip
    data = hostile.sign(hostile.synthetic_artifact(T=3), key).encode()
    flips = {"bytes": len(data), "flips": 0, "refused": 0, "by_error": Counter()}
    for i in range(len(data)):
        for bit in range(8):
            b = bytearray(data)
            b[i] ^= 1 << bit
            flips["flips"] += 1
            try:
                load_signed(bytes(b), ring, domain=hostile.DOMAIN)
            except C2CError as e:
                flips["refused"] += 1
                flips["by_error"][type(e).__name__] += 1
            except BaseException as e:  # noqa: BLE001
                crashes.append({"stage": "bit flip", "error": f"{type(e).__name__}: {e}"[:300], "byte": i, "bit": bit})

    # --------------------------------------------- 4. field-level, re-signed by a trusted key
    from c2c.store import open_store

    field = {"inputs": 0, "max_seconds": 0.0, "outcomes": Counter()}
    store = open_store(f"sqlite:///{Path(tempfile.mkdtemp()) / 'store'}")

    @settings(max_examples=args.field_examples, deadline=None, database=None, phases=[Phase.generate],
              suppress_health_check=list(HealthCheck))
    @seed(args.seed)
    @given(hostile.field_fuzz_inputs(key, [a for _, a in bases]))
    def field_fuzz(data):
        field["inputs"] += 1
        t = time.perf_counter()
        try:
            field["outcomes"][hostile.consume(data, ring, store)] += 1
        except BaseException as e:  # noqa: BLE001 - a crash is what we count
            field["outcomes"]["CRASH"] += 1
            crashes.append({"stage": "field-level", "error": f"{type(e).__name__}: {e}"[:300],
                            "input_sha256": hashlib.sha256(data).hexdigest()})
        field["max_seconds"] = max(field["max_seconds"], time.perf_counter() - t)

    t0 = time.perf_counter()
    field_fuzz()
    field["seconds"] = time.perf_counter() - t0
    store.close()

    # ---------------------------------------------------------- 3. the corpus
    corpus = []
    for name, blob, err, stage in hostile.corpus(key, other, revoked):
        try:
            if stage == "decode":
                Artifact.decode(blob)
            elif stage == "decode-small":
                Artifact.decode(blob, max_bytes=len(blob) - 1)
            else:
                load_signed(blob, ring, domain=hostile.DOMAIN)
            got = "(accepted)"
        except C2CError as e:
            got = type(e).__name__
        except BaseException as e:  # noqa: BLE001
            got = f"CRASH {type(e).__name__}"
            crashes.append({"stage": f"corpus: {name}", "error": f"{type(e).__name__}: {e}"[:300]})
        want = "(accepted)" if err is type(None) else err.__name__
        corpus.append({"name": name, "stage": stage, "expected": want, "got": got,
                       "ok": got == want or (got != "(accepted)" and not got.startswith("CRASH")
                                             and issubclass(_cls(got), err))})

    result = {
        "command": ("python benchmarks/trust_fuzz.py " + " ".join(sys.argv[1:])).strip(),
        "hypothesis": {**stats, "errors": dict(errors.most_common()), "seed": args.seed},
        "bit_flips": {**flips, "by_error": dict(flips["by_error"])},
        "field_level": {**field, "outcomes": dict(field["outcomes"].most_common())},
        "corpus": corpus,
        "crashes": crashes,
        "peak_rss_mb": {"before": rss0, "after": rss_mb()},
        "acceptance": {"inputs>=10000": stats["inputs"] >= 10_000,
                       "field-level inputs>=10000": field["inputs"] >= 10_000, "crashes==0": not crashes,
                       "every modified signed artifact refused": stats["mutated_signed_accepted"] == 0
                       and flips["refused"] == flips["flips"],
                       "corpus all specific": all(c["ok"] for c in corpus)},
    }
    return results.write(args.out, result, table(result))


def _cls(name: str):
    import c2c.errors as E

    return getattr(E, name)


def table(r: dict) -> str:
    h, f = r["hypothesis"], r["bit_flips"]
    lines = ["# Fuzzing the artifact parser and the signed-artifact loader", "", f"Command: `{r['command']}`", "",
             "| check | result |", "|---|---|",
             f"| hypothesis inputs | {h['inputs']:,} in {h['seconds']:.0f} s (max {h['max_seconds'] * 1000:.1f} ms per input, "
             f"inputs up to {h['max_input_bytes']:,} bytes) |",
             f"| crashes (non-C2CError exceptions) | {len(r['crashes'])} |",
             f"| fuzzed inputs that decoded | {h['decoded']:,} (mutations that kept a valid artifact) |",
             f"| mutated signed artifacts refused by load_signed | {h['mutated_signed'] - h['mutated_signed_accepted']:,}"
             f" / {h['mutated_signed']:,} |",
             f"| single-bit flips of a signed artifact refused | {f['refused']:,} / {f['flips']:,} |",
             f"| hostile corpus entries with their specific error | {sum(c['ok'] for c in r['corpus'])} / {len(r['corpus'])} |",
             f"| peak RSS | {r['peak_rss_mb']['before']:.0f} MB before, {r['peak_rss_mb']['after']:.0f} MB after |",
             "", "## Errors raised for fuzzed inputs", "", "| error | count |", "|---|---:|"]
    lines += [f"| {k} | {v:,} |" for k, v in h["errors"].items()]
    fl = r["field_level"]
    lines += ["", "## Field-level fuzzing, re-signed by a trusted key", "",
              "Every field of the c2c header and of the tensor table is set (1-3 edits per input) to values chosen",
              "for its type and bounds: boundary integers, wrong types, NaN/inf, lone surrogates, strings, lists",
              "and maps just past their limits; digests are fixed up in half the inputs so that deeper checks are",
              "reached. Each input is then signed by a *trusted* key (a compromised agent) and goes through",
              "everything a receiver does without a model: byte-exact decode, signature, prefix match, slicing,",
              "re-encoding and a commit to a SQLite store.", "",
              f"{fl['inputs']:,} inputs in {fl['seconds']:.0f} s (max {fl['max_seconds'] * 1000:.1f} ms per input).", "",
              "| outcome | count |", "|---|---:|"]
    lines += [f"| {k} | {v:,} |" for k, v in fl["outcomes"].items()]
    lines += ["", "## Bit flips by error", "", "| error | count |", "|---|---:|"]
    lines += [f"| {k} | {v:,} |" for k, v in sorted(f["by_error"].items(), key=lambda kv: -kv[1])]
    lines += ["", "## Hostile corpus", "", "| input | stage | expected | got |", "|---|---|---|---|"]
    lines += [f"| {c['name']} | {c['stage']} | {c['expected']} | {c['got']}{'' if c['ok'] else ' **WRONG**'} |"
              for c in r["corpus"]]
    lines += ["", "Acceptance: " + ", ".join(f"{k}: {'PASS' if v else 'FAIL'}" for k, v in r["acceptance"].items()), ""]
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
