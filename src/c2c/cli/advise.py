"""`c2c advise`: will a cache handoff pay off for this hop?"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from c2c.cli.main import add_runtime_flags, add_json_flag, command, emit


def register(sub) -> None:
    p = command(sub, "advise", help="predict text vs cache latency for a hop and decide it (c2c.decide's rules)",
                example="c2c advise --model Qwen2.5-Coder-0.5B-Instruct --message-tokens 256 --context-tokens 2048\n"
                        "c2c advise --model Qwen2.5-Coder-0.5B-Instruct --message-tokens 64 --context-tokens 512 "
                        "--bandwidth-gbps 1 --hops 4 --json\n"
                        "c2c advise --model Qwen2.5-Coder-1.5B-Instruct --message-tokens 64 --context-tokens 1024 "
                        "--map checkpoints/xmodel/Qwen2.5-Coder-0.5B-Instruct--Qwen2.5-Coder-1.5B-Instruct.c2cmap",
                func=_advise)
    p.add_argument("--model", default="Qwen2.5-Coder-0.5B-Instruct", help="zoo model name or model directory")
    add_runtime_flags(p)
    p.add_argument("--message-tokens", type=int, required=True, help="length of the message the hop carries")
    p.add_argument("--context-tokens", type=int, default=0, help="context the sender holds besides the message")
    p.add_argument("--hops", type=int, default=1, help="position of this hop in the chain (1 = first)")
    p.add_argument("--hop-limit", type=int, default=None,
                   help="longest chain allowed before falling back to text (default $C2C_MAX_HOPS, else 3)")
    p.add_argument("--bandwidth-gbps", type=float, default=None,
                   help="network bandwidth between the agents in Gbit/s (default: same machine)")
    p.add_argument("--cross-domain", action="store_true", help="sender and receiver are in different trust domains")
    p.add_argument("--other-model", action="store_true", help="the receiver runs a different model")
    p.add_argument("--fuser", action="store_true", help="a trained fuser exists for the model pair")
    p.add_argument("--map", default=None, metavar="FILE",
                   help="a cross-model map (c2c map fit): the hop goes from its source model to its target, "
                        "mapped if its calibration record (FILE's .calibration.json) says it beats the source alone")
    p.add_argument("--recalibrate", action="store_true", help="measure this machine again (else cached)")
    add_json_flag(p)


def _advise(args: argparse.Namespace) -> int:
    from c2c import advise
    from c2c.bench.calibrate import calibrate
    from c2c.handoff import forecast
    from c2c.runtime import zoo

    from c2c.runtime.dtype import resolve as resolve_dtype

    xmap = _offer(args.map)  # a bad map file fails before a calibration is measured
    base = args.model if Path(args.model).is_dir() else zoo.resolve(args.model).name
    backend = args.backend or "transformers"
    name = advise.calibration_name(base, "float16" if backend == "llama.cpp" else resolve_dtype(args.dtype), backend)
    cal = None if args.recalibrate else advise.load_calibration(name)
    if cal is None:
        print(f"calibrating {name} on this machine (once; about a minute)...", file=sys.stderr)
        cal = calibrate(zoo.load(args.model, dtype=args.dtype, backend=args.backend))
        advise.save_calibration(cal)
    d = forecast(cal, message_tokens=args.message_tokens, context_tokens=args.context_tokens, hops=args.hops,
                 hop_limit=args.hop_limit, bandwidth_gbps=args.bandwidth_gbps, cross_domain=args.cross_domain,
                 other_model=args.other_model, fuser_available=args.fuser, xmap=xmap)
    a = d.advice
    text = (f"decision: {d.path.upper()}: {d.reason}\n"
            f"  text  handoff {a['text_handoff_s']:8.3f}s   pipeline {a['text_pipeline_s']:8.2f}s\n"
            f"  cache handoff {a['cache_handoff_s']:8.3f}s   pipeline {a['cache_pipeline_s']:8.2f}s   "
            f"({a['artifact_bytes'] / 1e6:.1f} MB)\n" + "\n".join(f"  - {c.name}: {c.detail}" for c in d.checks
                                                                   if c.ok is not None))
    emit(args, {"decision": d.path, "reason": d.reason, "map_id": d.map_id,
                "checks": [c.to_dict() for c in d.checks], **a, "calibration": cal.__dict__}, text)
    return 0


def _offer(path: str | None):
    """The map of ``--map`` and its record, as :func:`c2c.handoff.forecast` takes it (None without the flag)."""
    if path is None:
        return None
    from c2c.xmodel import MapOffer

    return MapOffer.load(path)
