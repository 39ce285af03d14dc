"""`c2c verify FILE`: is this artifact signed by a trusted key, and does its KV encode its tokens?

Exit status 0: it passed. 1: it did not, or it could not be verified as asked
(the reason is printed). 2: the check could not run (bad flag, unknown model).

No work before trust: the signature and domain are checked first, and only
then is a model loaded (lazily, by :func:`c2c.trust.verify_policy.check_received`). The model
comes from ``--model`` or, without it, from the header's model name resolved as
a *zoo name*; an unverified header can never make this command load a local
directory. A slice is checked at every layer against the shared prefix it
follows (``--context``); without it a sampled check refuses (it would verify
layer 0 only) unless ``--allow-partial``.
"""

from __future__ import annotations

import argparse
import random
from pathlib import Path

from c2c.cli.main import add_json_flag, command, emit
from c2c.config import DTYPES
from c2c.errors import (
    ArtifactError,
    ConfigError,
    IncompatibleCacheError,
    ModelError,
    TrustError,
    UnknownModelError,
    UnverifiableError,
)


def register(sub) -> None:
    p = command(sub, "verify",
                help="check an artifact's signature, and optionally that its KV encodes its claimed tokens",
                example="c2c verify notes.c2c --domain research\n"
                        "c2c verify notes.c2c --mode sample --samples 48 --json\n"
                        "c2c verify slice.c2c --mode sample --context 'You are a helpful assistant.'\n"
                        "c2c verify notes.c2c.sealed --domain research --mode strict --model Qwen2.5-Coder-0.5B-Instruct",
                func=_verify)
    p.add_argument("file", type=Path, help="artifact file, or a sealed envelope of one (`c2c keys seal`)")
    p.add_argument("--mode", choices=["signature", "sample", "strict"], default="signature",
                   help="signature: signer only; sample: + layer-0 sweep and K deep probes; strict: + full re-prefill")
    p.add_argument("--samples", type=int, default=48, help="deep probes K for --mode sample")
    p.add_argument("--model", default=None,
                   help="receiver's model for sample/strict, a zoo name or local directory (default: the zoo "
                        "model the artifact names, loaded only after its signature checked; never a directory)")
    p.add_argument("--dtype", choices=list(DTYPES), default=None,
                   help="the dtype the model recomputes in (default: the artifact's own)")
    p.add_argument("--context", metavar="SYSTEM_PROMPT", default=None,
                   help="the shared system prompt a slice follows (as in `c2c export --system`): its prefix is "
                        "checked against the artifact's and prefilled, and the slice is checked after it")
    p.add_argument("--allow-partial", action="store_true",
                   help="accept a sampled check of a slice without --context at layer 0 only (its deeper "
                        "layers stay unverified); without it such a check is refused")
    p.add_argument("--domain", default=None,
                   help="trust domain the artifact must be signed for (default: the one its signature names)")
    p.add_argument("--keyring", type=Path, default=None, help="keyring folder (default: $C2C_HOME/keys)")
    p.add_argument("--unsigned-ok", action="store_true", help="do not require a signature (KV checks only)")
    p.add_argument("--tolerance", type=float, default=None, help="relative tolerance (default per dtype/device)")
    p.add_argument("--seed", type=int, default=None, help="fix the probe positions (default: unpredictable)")
    add_json_flag(p)


def _verify(args: argparse.Namespace) -> int:
    from c2c.trust.keys import Keyring
    from c2c.trust.verify_policy import VerifyPolicy, check_received
    from c2c.trust.seal import MAGIC, envelope_info, open_sealed
    from c2c.trust.signing import decode_exact

    if args.samples < 1:
        raise ConfigError(f"--samples {args.samples}: give a positive number")
    ring = Keyring(args.keyring)
    result: dict = {"file": str(args.file), "mode": args.mode}
    try:
        data = _read(args.file, MAGIC)
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
        runtime = context = None
        if args.mode != "signature":  # both run only once check_received() has verified the signature
            fp = artifact.header.fingerprint
            runtime = _runtime_loader(args.model, fp.model_name, args.dtype or _known_dtype(fp.dtype),
                                      fp.backend.kind)
            if args.context is not None and artifact.header.start > 0:
                context = _context_builder(args.context, artifact)
        policy = VerifyPolicy(kv="none" if args.mode == "signature" else args.mode, samples=args.samples,
                              require_signature=not args.unsigned_ok, tolerance=args.tolerance,
                              allow_partial=args.allow_partial)
        report = check_received(artifact, ring, domain or "", policy, runtime=runtime, context=context,
                       rng=random.Random(args.seed) if args.seed is not None else None, exact=False)
    except (ArtifactError, TrustError, IncompatibleCacheError) as e:
        result.update(ok=False, error=type(e).__name__, reason=str(e))
        kv = getattr(e, "report", None)
        if kv is not None:
            result["kv"] = kv.to_dict()
        text = f"REFUSED {args.file}: {type(e).__name__}: {e}"
        if isinstance(e, UnverifiableError) and args.context is None and "layer 0" in str(e):
            text += ("\n  hint: pass --context SYSTEM_PROMPT (the shared prefix the slice follows) to check "
                     "every layer, or --allow-partial to accept layer 0 only")
        emit(args, result, text)
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


def _read(path: Path, seal_magic: bytes) -> bytes | bytearray:
    """A sealed envelope (bounded read), or an artifact (header checked before its body is read)."""
    from c2c._io import read_bounded
    from c2c.artifact.codec import max_artifact_bytes, read_file

    try:
        with open(path, "rb") as f:
            sealed = f.read(len(seal_magic)) == seal_magic
    except OSError:
        sealed = False  # read_file names the problem
    return read_bounded(path, max_artifact_bytes()) if sealed else read_file(path)


def _known_dtype(name: str) -> str | None:
    """The artifact's dtype if it is one c2c runs models in (the model recomputes in it), else the default."""
    return name if name in DTYPES and name != "auto" else None


def _runtime_loader(model: str | None, header_name: str, dtype: str | None = None, backend: str | None = None):
    """A zero-argument loader of the receiver's model, for ``check_received(runtime=...)`` to call after trust.

    The model runs in ``dtype`` on ``backend`` (by default the artifact's own: a cache is
    compared with K/V recomputed by the engine and in the dtype it was made with).

    ``--model`` is the user's choice (zoo name or directory). The header's name is
    unverified: it must be a zoo name, and the model is read from the zoo's own
    folder (C2C_HOME/models), never from a path the header could name.
    """
    from c2c.runtime import zoo

    if model:
        return lambda: zoo.load(model, pull_if_missing=False, dtype=dtype, backend=backend)

    def load():
        if not header_name:
            raise ConfigError("the artifact does not name its model; pass --model")
        try:
            spec = zoo.resolve(header_name)
        except UnknownModelError:
            raise ConfigError(f"the artifact names model {header_name[:200]!r}, which is not a zoo model; a "
                              "header never picks a local directory: pass --model") from None
        path = zoo.models_dir() / spec.name
        if not (path / "config.json").is_file():
            if not spec.tiny:
                raise ModelError(f"{spec.name} is not pulled yet; run `c2c models pull {spec.name}` or pass --model")
            path = zoo.pull(spec.name, progress=False)  # tiny test models are built locally
        if backend == "llama.cpp":
            return zoo.load(spec.name, pull_if_missing=False, backend=backend)
        return zoo.load(str(path), pull_if_missing=False, dtype=dtype, backend=backend)
    return load


def _context_builder(system: str, artifact):
    """``runtime -> cache`` a slice is verified against (:func:`c2c.trust.verify.slice_context`) for a
    receiver whose shared prefix is ``system``'s, after checking that prefix is the artifact's."""
    def build(runtime):
        from c2c.artifact.prefix import prefix_token_ids
        from c2c.trust.verify import slice_context

        ids = prefix_token_ids(runtime, system)
        artifact.header.prefix.require_match(ids)
        context = slice_context(artifact.header.start, ids)
        return context(runtime) if context is not None else None
    return build
