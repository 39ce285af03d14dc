"""`c2c` command line: a thin veneer over the library.

Each command group lives in its own module with a ``register(subparsers)``
function; each command builds one library object and calls one method. Every
command's help ends with an example (a test enforces it). Errors derived from
:class:`~c2c.errors.C2CError` are printed as one line and exit with status 2
(1 is kept for "ran fine, answer is no", e.g. a failed verification).

NOTE: commands import what they need (torch, transformers, the store backends)
inside their functions, so that ``c2c --help`` and ``c2c models list`` start
in a fraction of a second; this is the one place in-function imports are the rule.
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys
from typing import Any, Callable

# Command-group modules, in help order. Each defines register(subparsers).
GROUPS = ["models", "artifact", "demo", "bench", "fuser", "map", "keys", "verify", "store", "advise", "serve"]


class Formatter(argparse.RawDescriptionHelpFormatter):
    pass


def command(sub, name: str, *, help: str, example: str, func: Callable[[argparse.Namespace], int]) -> argparse.ArgumentParser:
    """Add one subcommand whose help ends with ``example``."""
    p = sub.add_parser(name, help=help, description=help, formatter_class=Formatter,
                       epilog="Example:\n  " + example.strip().replace("\n", "\n  "))
    p.set_defaults(func=func)
    return p


def add_runtime_flags(p: argparse.ArgumentParser) -> None:
    """``--dtype`` and ``--backend``: how a model command runs its model."""
    from c2c.config import DTYPES

    p.add_argument("--dtype", choices=list(DTYPES), default=None,
                   help="how the model runs: auto picks bfloat16 where the CPU has AVX512-BF16 or AMX "
                        "(and on CUDA), else float32 (default $C2C_DTYPE, else auto)")
    p.add_argument("--backend", choices=["transformers", "llama.cpp"], default=None,
                   help="the engine: transformers (default), or llama.cpp on the model's GGUF as shipped "
                        "(the default for a .gguf path; f16 KV cache, full handoffs only)")


def add_json_flag(p: argparse.ArgumentParser) -> None:
    p.add_argument("--json", action="store_true", help="print machine-readable JSON instead of a table")


def emit(args: argparse.Namespace, data: Any, text: str) -> None:
    """Print ``data`` as JSON when ``--json`` was given, else ``text``."""
    if getattr(args, "json", False):
        print(json.dumps(data, indent=2, sort_keys=True, default=str))
    else:
        print(text)


def build_parser() -> argparse.ArgumentParser:
    from c2c import __version__
    from c2c.config import VARIABLES

    env = "\n".join(f"  {name:<24}{meaning}" for name, meaning in VARIABLES)
    parser = argparse.ArgumentParser(
        prog="c2c", formatter_class=Formatter,
        description="Hand KV-caches between LLM agents instead of text, with text as the fallback.",
        epilog="Example:\n  c2c demo            # analyst -> writer handoff, by text and by cache\n"
               f"  c2c models list\n\nEnvironment:\n{env}")
    parser.add_argument("--version", action="version", version=f"c2c {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for group in GROUPS:
        importlib.import_module(f"c2c.cli.{group}").register(sub)
    return parser


def configure_process() -> None:
    """What the ``c2c`` command sets for its own process, and the library never does.

    - ``HF_HUB_OFFLINE=1`` and ``TRANSFORMERS_NO_ADVISORY_WARNINGS=1`` unless already set
      (c2c never asks a hub: every load is ``local_files_only``; this is defence in depth);
    - glibc malloc keeps large buffers in the heap (:mod:`c2c.runtime.alloc`), unless
      ``C2C_MALLOC_TUNE=0``;
    - log records of the ``c2c`` logger at INFO and above go to stderr (progress notes of
      long steps, such as a model pull).
    """
    import logging
    import os

    from c2c.config import settings
    from c2c.runtime import alloc

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")
    if settings().malloc_tune:
        alloc.keep_large_buffers()
    log = logging.getLogger("c2c")
    if not log.handlers:
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("c2c: %(message)s"))
        log.addHandler(handler)
        log.setLevel(logging.INFO)


def main(argv: list[str] | None = None) -> int:
    from c2c.errors import C2CError

    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 0
    try:
        configure_process()
        return int(args.func(args) or 0)
    except C2CError as e:
        if getattr(args, "json", False):
            print(json.dumps({"error": type(e).__name__, "message": str(e)}))
        else:
            print(f"c2c: {type(e).__name__}: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("c2c: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
