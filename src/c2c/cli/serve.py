"""`c2c serve`: an OpenAI-compatible HTTP server over the library (see :mod:`c2c.serve`)."""

from __future__ import annotations

import argparse
from pathlib import Path

from c2c.cli.main import add_runtime_flags, command

EXAMPLE = """c2c serve                                   # the default model on http://127.0.0.1:8000/v1, open access
c2c serve --model Qwen2.5-Coder-0.5B-Instruct --model SmolLM2-135M-Instruct --port 8080 --tokens tokens.json
c2c serve --model Qwen2.5-Coder-0.5B-Instruct --model Qwen2.5-Coder-1.5B-Instruct \
    --map checkpoints/xmodel/Qwen2.5-Coder-0.5B-Instruct--Qwen2.5-Coder-1.5B-Instruct.c2cmap
# then, from Python:
#   from openai import OpenAI
#   client = OpenAI(base_url="http://127.0.0.1:8000/v1", api_key="TOKEN")
#   client.chat.completions.create(model="Qwen2.5-Coder-0.5B-Instruct",
#       messages=[{"role": "user", "content": "hi"}], extra_body={"c2c": {"session": "analyst-1"}})"""


def register(sub) -> None:
    p = command(sub, "serve", help="serve models over an OpenAI-compatible HTTP API, with cache handoffs",
                example=EXAMPLE, func=_serve)
    p.add_argument("--model", action="append", default=None, metavar="NAME",
                   help="zoo model name or model directory to serve (repeatable; default "
                        "Qwen2.5-Coder-0.5B-Instruct)")
    add_runtime_flags(p)
    p.add_argument("--store", default=None, metavar="URL",
                   help="commit store URL (default $C2C_STORE, else SQLite under $C2C_HOME)")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1, loopback only)")
    p.add_argument("--port", type=int, default=8000, help="port to listen on (default 8000)")
    p.add_argument("--tokens", type=Path, default=None, metavar="FILE",
                   help='JSON {token: {"agent": A, "domain": D}} (mode 0600); without it, open access in '
                        'domain "default" (refused off loopback unless --allow-open)')
    p.add_argument("--max-queue", type=int, default=16, metavar="N",
                   help="requests that may wait per model; more get 429 with Retry-After (default 16)")
    p.add_argument("--max-queue-per-tenant", type=int, default=None, metavar="N",
                   help="requests one tenant (trust domain) may have on a model, running or waiting; more get "
                        "429 (default: an even share, (--max-queue + 1) / domains in --tokens)")
    p.add_argument("--fair-half-life", type=float, default=5.0, metavar="S",
                   help="a model's next forward pass goes to the tenant that used it least recently; use S "
                        "seconds ago counts half (default 5)")
    p.add_argument("--prefill-chunk", type=int, default=None, metavar="N",
                   help="prefill a prompt in forward passes of at most N tokens, so that another tenant's "
                        "request can run between two of them (0: one pass, fastest for a lone prompt; "
                        "default 64, measured)")
    p.add_argument("--max-batch", type=int, default=None, metavar="N",
                   help="decode steps of up to N concurrent requests run in one forward pass, so that many agents "
                        "decode at once for about the cost of one (1: one request per pass; default 16)")
    p.add_argument("--session-budget-mb", type=float, default=1024, metavar="M",
                   help="K/V megabytes all sessions may hold; past it the least recently used are evicted "
                        "(and rebuilt from their messages when used again; default 1024)")
    p.add_argument("--session-budget-per-tenant-mb", type=float, default=None, metavar="M",
                   help="K/V megabytes one tenant's sessions may hold; past it that tenant's least recently used "
                        "are evicted, never another's (default: --session-budget-mb / domains)")
    p.add_argument("--max-sessions", type=int, default=4096, metavar="N",
                   help="session records kept; past it the least recently used of the tenant keeping the most "
                        "are forgotten (default 4096)")
    p.add_argument("--max-sessions-per-tenant", type=int, default=None, metavar="N",
                   help="session records one tenant may keep; past it its least recently used are forgotten "
                        "(default: --max-sessions / domains)")
    p.add_argument("--max-body-mb", type=float, default=8, metavar="M",
                   help="largest request body in megabytes; larger ones get 413 (default 8)")
    p.add_argument("--read-timeout", type=float, default=30, metavar="S",
                   help="seconds a request's headers and body may take to arrive; past it 408 and the "
                        "connection is closed (default 30)")
    p.add_argument("--request-timeout", type=float, default=300, metavar="S",
                   help="seconds a request may take, queueing included; past it 504 (default 300)")
    p.add_argument("--default-max-tokens", type=int, default=512, metavar="N",
                   help="completion tokens when a request sets no max_tokens (default 512)")
    p.add_argument("--verify-kv", choices=["none", "sample", "strict"], default="none",
                   help="KV check of an attached cache besides signature, fingerprint and prefix (default none)")
    p.add_argument("--map", action="append", default=None, type=Path, metavar="FILE",
                   help="a cross-model map (c2c map fit) between two models served here: a commit of its source "
                        "model attached by a request to its target is mapped (no prefill of it) when the map's "
                        "calibration record, FILE's .calibration.json beside it, says it beats the source alone "
                        "(else text); repeatable")
    p.add_argument("--allow-open", action="store_true",
                   help="allow open access (no --tokens) on a non-loopback address, for any Host name "
                        "(without it, open access answers only requests to 127.0.0.1, localhost or [::1])")


def config_from(args: argparse.Namespace):
    """The :class:`~c2c.serve.ServeConfig` the flags describe."""
    from c2c.serve.config import DEFAULT_MODEL, MAX_BATCH, MB, PREFILL_CHUNK, ServeConfig

    per_tenant_mb = args.session_budget_per_tenant_mb
    return ServeConfig(models=tuple(args.model or (DEFAULT_MODEL,)), store_url=args.store, host=args.host,
                       port=args.port, tokens_file=args.tokens, max_queue=args.max_queue,
                       max_queue_per_tenant=args.max_queue_per_tenant, fair_half_life_s=args.fair_half_life,
                       prefill_chunk=PREFILL_CHUNK if args.prefill_chunk is None else args.prefill_chunk,
                       max_batch=MAX_BATCH if args.max_batch is None else args.max_batch,
                       session_budget_bytes=int(args.session_budget_mb * MB),
                       session_budget_per_tenant_bytes=None if per_tenant_mb is None else int(per_tenant_mb * MB),
                       max_sessions=args.max_sessions, max_sessions_per_tenant=args.max_sessions_per_tenant,
                       max_body_bytes=int(args.max_body_mb * MB), read_timeout_s=args.read_timeout,
                       request_timeout_s=args.request_timeout, default_max_tokens=args.default_max_tokens,
                       verify_kv=args.verify_kv, allow_open=args.allow_open, dtype=args.dtype,
                       backend=args.backend, maps=tuple(args.map or ()))


def _serve(args: argparse.Namespace) -> int:
    from c2c.config import settings
    from c2c.serve import run

    config = config_from(args)
    if settings().threads:  # C2C_THREADS: this process's torch threads (1 on a shared, busy machine)
        import torch

        torch.set_num_threads(settings().threads)
    run(config)
    return 0
