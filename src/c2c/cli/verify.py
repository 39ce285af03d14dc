"""`c2c verify FILE`: is this artifact signed by a trusted key, and does its KV encode its tokens?

Exit status 0: it passed. 1: it did not (the reason is printed). 2: the check
could not run (bad flag, unknown model).
"""

from __future__ import annotations

import argparse
import random
from pathlib import Path

from c2c.cli.main import add_json_flag, command, emit
from c2c.errors import ArtifactError, ConfigError, IncompatibleCacheError, TrustError


def register(sub) -> None:
    p = command(sub, "verify",
                help="check an artifact's signature, and optionally that its KV encodes its claimed tokens",
                example="c2c verify notes.c2c --domain research\n"
                        "c2c verify notes.c2c --mode sample --samples 48 --json\n"
                        "c2c verify notes.c2c.sealed --domain research --mode strict --model Qwen2.5-Coder-0.5B-Instruct",
                func=_verify)
    p.add_argument("file", type=Path, help="artifact file, or a sealed envelope of one (`c2c keys seal`)")
    p.add_argument("--mode", choices=["signature", "sample", "strict"], default="signature",
                   help="signature: signer only; sample: + layer-0 sweep and K deep probes; strict: + full re-prefill")
    p.add_argument("--samples", type=int, default=48, help="deep probes K for --mode sample")
    p.add_argument("--model", default=None,
                   help="receiver's model for sample/strict (default: the model named in the artifact)")
    p.add_argument("--domain", default=None,
                   help="trust domain the artifact must be signed for (default: the one its signature names)")
    p.add_argument("--keyring", type=Path, default=None, help="keyring folder (default: $C2C_HOME/keys)")
    p.add_argument("--unsigned-ok", action="store_true", help="do not require a signature (KV checks only)")
    p.add_argument("--tolerance", type=float, default=None, help="relative tolerance (default per dtype/device)")
    p.add_argument("--seed", type=int, default=None, help="fix the probe positions (default: unpredictable)")
    add_json_flag(p)


def _verify(args: argparse.Namespace) -> int:
    from c2c.artifact.codec import DEFAULT_MAX_BYTES, read_bounded
    from c2c.trust.keys import Keyring
    from c2c.trust.policy import VerifyPolicy, check
    from c2c.trust.seal import MAGIC, envelope_info, open_sealed
    from c2c.trust.signing import decode_exact

    if args.samples < 1:
        raise ConfigError(f"--samples {args.samples}: give a positive number")
    ring = Keyring(args.keyring)
    result: dict = {"file": str(args.file), "mode": args.mode}
    try:
        data = read_bounded(args.file, DEFAULT_MAX_BYTES)
        if data[:len(MAGIC)] == MAGIC:
            domain = args.domain or envelope_info(data)["domain"]
            data = open_sealed(data, ring, domain=domain)
            result["sealed_for"] = domain
        artifact = decode_exact(data)
        result["id"] = artifact.id
        sig = artifact.signature if isinstance(artifact.signature, dict) else {}
        domain = args.domain or (sig.get("domain") if isinstance(sig.get("domain"), str) else None)
        if domain is None and not args.unsigned_ok:
            domain = ""  # no domain to check against: the signature check reports it unsigned/malformed
        runtime = None
        if args.mode != "signature":
            runtime = _load_runtime(args.model or artifact.header.fingerprint.model_name)
        policy = VerifyPolicy(kv="none" if args.mode == "signature" else args.mode, samples=args.samples,
                              require_signature=not args.unsigned_ok, tolerance=args.tolerance)
        report = check(artifact, ring, domain or "", policy, runtime=runtime,
                       rng=random.Random(args.seed) if args.seed is not None else None)
    except (ArtifactError, TrustError, IncompatibleCacheError) as e:
        result.update(ok=False, error=type(e).__name__, reason=str(e))
        kv = getattr(e, "report", None)
        if kv is not None:
            result["kv"] = kv.to_dict()
        emit(args, result, f"REFUSED {args.file}: {type(e).__name__}: {e}")
        return 1
    result.update(ok=True, **report.to_dict())
    lines = [f"OK {args.file} (id {artifact.id[:16]})"]
    if report.signer:
        lines.append(f"  signed for {report.signer.domain!r} by key {report.signer.key_id[:16]} "
                     f"{report.signer.label} at {report.signer.signed_at}")
    if report.kv:
        k = report.kv
        lines.append(f"  KV {k.mode}: {k.deep_positions} positions x all layers, {k.layer0_positions} at layer 0; "
                     f"max relative error {k.max_error:.2e} <= {k.tolerance:.0e} ({k.seconds:.2f} s)")
        if k.note:
            lines.append(f"  note: {k.note}")
    emit(args, result, "\n".join(lines))
    return 0


def _load_runtime(name: str):
    from c2c.runtime import zoo

    if not name:
        raise ConfigError("the artifact does not name its model; pass --model")
    return zoo.load(name, pull_if_missing=False)
