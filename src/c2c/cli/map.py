"""`c2c map fit|info`: cross-model cache maps (:mod:`c2c.xmodel`)."""

from __future__ import annotations

import argparse

from c2c.cli.main import add_json_flag, command, emit


def register(sub) -> None:
    p = sub.add_parser("map", help="fit and inspect cross-model cache maps (one model's cache -> another's)",
                       description="A closed-form map from a source model's KV-cache to a target model's, so the "
                                   "target continues without prefilling the context (same vocabulary only).")
    s = p.add_subparsers(dest="map_command", metavar="ACTION", required=True)

    c = command(s, "fit", help="fit a map on the training corpora: layer mapping and ridge strength chosen on a "
                               "calibration split, R² per layer on a test split",
                example="nice -n 19 c2c map fit --source Qwen2.5-Coder-0.5B-Instruct \\\n"
                        "    --target Qwen2.5-Coder-1.5B-Instruct --tokens 32768 --threads 1", func=_fit)
    c.add_argument("--source", required=True, help="the model whose caches are mapped (zoo name or directory)")
    c.add_argument("--target", required=True, help="the model that continues from the mapped caches")
    c.add_argument("--tokens", type=int, default=32768,
                   help="train + calibration tokens (test adds an eighth more); both models prefill them all")
    c.add_argument("--seq-len", type=int, default=1024, help="tokens per stream (the longest context you will map)")
    c.add_argument("--layer-window", type=int, default=3,
                   help="source layers within this many of the proportional depth are candidates for each target layer")
    c.add_argument("--seed", type=int, default=0, help="stream order and split")
    c.add_argument("--out", default=None,
                   help="map file to write (default: $C2C_HOME/maps/SOURCE--TARGET.c2cmap)")
    c.add_argument("--dtype", default=None, choices=["auto", "float32", "bfloat16"],
                   help="how the two models run while collecting K/V (default $C2C_DTYPE, else auto)")
    c.add_argument("--threads", type=int, default=None,
                   help="torch CPU threads (default: C2C_THREADS, else torch's choice); 1 on a shared machine")
    c.add_argument("--quiet", action="store_true", help="no progress bar")
    add_json_flag(c)

    c = command(s, "info", help="check a map file and print its pair, layer mapping and R² per layer",
                example="c2c map info checkpoints/xmodel/Qwen2.5-Coder-0.5B-Instruct--Qwen2.5-Coder-1.5B-Instruct.c2cmap",
                func=_info)
    c.add_argument("path", help="the map file")
    add_json_flag(c)


def _set_threads(args: argparse.Namespace) -> None:
    import torch

    from c2c.config import settings

    n = args.threads or settings().threads
    if n > 0:
        torch.set_num_threads(n)


def _fit(args: argparse.Namespace) -> int:
    from pathlib import Path

    from c2c.config import c2c_home
    from c2c.runtime import zoo
    from c2c.xmodel import FitConfig, fit

    _set_threads(args)
    config = FitConfig(tokens=args.tokens, seq_len=args.seq_len, layer_window=args.layer_window, seed=args.seed)
    source, target = zoo.load(args.source, dtype=args.dtype), zoo.load(args.target, dtype=args.dtype)
    xmap = fit(source, target, config, progress=not args.quiet)
    out = Path(args.out) if args.out else c2c_home() / "maps" / f"{source.name}--{target.name}.c2cmap"
    out.parent.mkdir(parents=True, exist_ok=True)
    xmap.save(out)
    emit(args, _summary(xmap) | {"path": str(out)}, _table(xmap) + f"\nwritten to {out}")
    return 0


def _info(args: argparse.Namespace) -> int:
    from c2c.xmodel import load

    xmap = load(args.path)
    emit(args, _summary(xmap) | {"path": args.path}, _table(xmap))
    return 0


def _summary(xmap) -> dict:
    return {"id": xmap.id, "source": xmap.source.model_name, "target": xmap.target.model_name,
            "source_weights_digest": xmap.source.weights_digest, "target_weights_digest": xmap.target.weights_digest,
            "bytes": xmap.nbytes, "layers": [{k: f.to_dict() for k, f in lf.items()} for lf in xmap.layers],
            "fit": xmap.fit}


def _table(xmap) -> str:
    lines = [f"map {xmap.id[:16]}...  {xmap.source.model_name} -> {xmap.target.model_name}  "
             f"({xmap.nbytes / 1e6:.1f} MB, fitted {xmap.created})",
             f"tokens: {xmap.fit.get('tokens')}", "",
             "R² on held-out test tokens, of the map as stored (and of the ridge before its spread was matched)", "",
             "target layer | K from | K alpha | K R² (ridge) | V from | V alpha | V R² (ridge)"]
    for t, lf in enumerate(xmap.layers):
        k, v = lf["k"], lf["v"]
        lines.append(f"{t:12d} | {k.source:6d} | {k.alpha:7.0e} | {k.r2:5.3f} ({k.r2_ridge:5.3f}) | {v.source:6d} | "
                     f"{v.alpha:7.0e} | {v.r2:5.3f} ({v.r2_ridge:5.3f})")
    return "\n".join(lines)
