"""`ServeConfig`: everything `c2c serve` is started with, in one frozen value."""

from __future__ import annotations

import ipaddress
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from c2c.errors import ConfigError
from c2c.runtime.zoo import DEFAULT_MODEL

MB = 1 << 20
PREFILL_CHUNK = 64  # tokens per prefill pass (see ServeConfig.prefill_chunk)
MAX_BATCH = 16      # decode steps per forward pass (see ServeConfig.max_batch)


@dataclass(frozen=True, kw_only=True)
class ServeConfig:
    """How the server runs.

    Attributes:
        models: zoo names or model directories; one worker thread each.
        store_url: the commit store (``None``: ``C2C_STORE``, else SQLite under ``C2C_HOME``).
        host, port: where to listen. Loopback by default.
        tokens_file: JSON ``{token: {"agent": A, "domain": D}}``; ``None`` is open access in the
            one domain ``"default"``, which is refused off loopback unless ``allow_open``.
        max_queue: requests waiting per model beyond the one running; more get 429.
        max_queue_per_tenant: requests one tenant (trust domain) may have on a model, running or
            waiting; more get 429. ``None``: an even share, ``(max_queue + 1) // domains``.
        fair_half_life_s: a model's next forward pass goes to the tenant (then the agent) that
            used it least recently; use this long ago counts half (:mod:`c2c.serve.fairness`).
        prefill_chunk: a prompt is prefilled in forward passes of at most this many tokens, and the
            model's turn may pass to another tenant between two of them (0: one pass, which holds
            the model for the whole prompt). The default was measured (``benchmarks/serve_load.py
            --two-tenant --flood-prompt-words 760``, SmolLM2-135M, 2 cores: another tenant's ~1.9k-token
            prompts put a short tenant's p99 at 8.15x its p99 alone in one pass, 1.99x at 256, 1.76x at
            128, 1.08x at 64); it costs a lone long prompt 23-35% of its prefill speed, so a server with
            one tenant may set 0.
        max_batch: decode steps of this many requests run in one forward pass (the weights read once for all of
            them; :mod:`c2c.serve.worker`); 1 decodes one request per pass. An engine without batched decode
            (llama.cpp) runs one per pass whatever this says, and ``/v1/models`` says so.
        session_budget_bytes: KV bytes all sessions may hold together; past it the least
            recently used lose their cache (and are rebuilt from their messages when used).
        session_budget_per_tenant_bytes: KV bytes one tenant's sessions may hold; past it that
            tenant's least recently used lose theirs. ``None``: ``session_budget_bytes // domains``.
        max_sessions: session records kept (a record without its cache is a few token ids).
        max_sessions_per_tenant: session records one tenant may keep; past it its least
            recently used are forgotten. ``None``: ``max_sessions // domains``.
        max_body_bytes: largest request body; larger ones get 413.
        read_timeout_s: how long a request's body may take to arrive once its headers have;
            past it 408 and the connection is closed (a slow client holds no connection long).
        request_timeout_s: the longest a request may take, queueing included (504 past it).
        default_max_tokens: completion tokens when a request names none (capped by the context).
        verify_kv: the KV check on an attached cache besides its signature (``c2c.trust.verify_policy``):
            ``none`` (signature, fingerprint and prefix only), ``sample`` or ``strict``.
        allow_open: serve without tokens on a non-loopback address, to any ``Host`` name (without it,
            open access answers only requests addressed to a loopback name, see
            :attr:`loopback_hosts_only`).
        dtype, device, backend: how models are loaded (``c2c.runtime.zoo.load``).
        maps: cross-model map files (``c2c map fit``), each between two served models, with its
            calibration record beside it: a commit of the map's source model attached by a request to
            its target takes the mapped path when ``decide()`` accepts the map (:mod:`c2c.serve.mapped`).
        shutdown_timeout_s: how long a graceful shutdown waits for running requests.
    """

    models: tuple[str, ...] = (DEFAULT_MODEL,)
    store_url: str | None = None
    host: str = "127.0.0.1"
    port: int = 8000
    tokens_file: Path | None = None
    max_queue: int = 16
    max_queue_per_tenant: int | None = None
    fair_half_life_s: float = 5.0
    prefill_chunk: int = PREFILL_CHUNK
    max_batch: int = MAX_BATCH
    session_budget_bytes: int = 1024 * MB
    session_budget_per_tenant_bytes: int | None = None
    max_sessions: int = 4096
    max_sessions_per_tenant: int | None = None
    max_body_bytes: int = 8 * MB
    read_timeout_s: float = 30.0
    request_timeout_s: float = 300.0
    default_max_tokens: int = 512
    verify_kv: Literal["none", "sample", "strict"] = "none"
    allow_open: bool = False
    dtype: str | None = None       # None: $C2C_DTYPE, else auto (c2c.runtime.dtype)
    backend: str | None = None     # None: transformers (llama.cpp for a .gguf path)
    device: str = "cpu"
    shutdown_timeout_s: float = 10.0
    maps: tuple[Path, ...] = ()

    def __post_init__(self) -> None:
        if not self.models or not all(isinstance(m, str) and m for m in self.models):
            raise ConfigError("serve needs at least one model (--model NAME)")
        if not 0 <= self.port <= 65535:
            raise ConfigError(f"--port {self.port}: give 0-65535")
        for name, value, lo, unit in (("--max-queue", self.max_queue, 0, 1),
                                      ("--max-sessions", self.max_sessions, 1, 1),
                                      ("--max-body-mb", self.max_body_bytes, 1024, MB),
                                      ("--default-max-tokens", self.default_max_tokens, 1, 1),
                                      ("--prefill-chunk", self.prefill_chunk, 0, 1),
                                      ("--max-batch", self.max_batch, 1, 1),
                                      ("--session-budget-mb", self.session_budget_bytes, 0, MB),
                                      ("--max-queue-per-tenant", self.max_queue_per_tenant, 1, 1),
                                      ("--max-sessions-per-tenant", self.max_sessions_per_tenant, 1, 1),
                                      ("--session-budget-per-tenant-mb", self.session_budget_per_tenant_bytes, 0, MB)):
            if value is None and name.endswith(("-per-tenant", "-per-tenant-mb")):
                continue
            if not isinstance(value, int) or value < lo:  # said in the flag's unit (MB for the -mb flags)
                raise ConfigError(f"{name} is too small ({_in(value, unit)}); "
                                  f"give at least {_in(lo, unit, up=True)}")
        if not self.request_timeout_s > 0 or not self.shutdown_timeout_s >= 0:
            raise ConfigError("--request-timeout must be > 0 and the shutdown timeout >= 0")
        if not self.read_timeout_s > 0 or not self.fair_half_life_s > 0:
            raise ConfigError("--read-timeout and --fair-half-life must be > 0")
        if not isinstance(self.maps, tuple) or not all(isinstance(m, Path) for m in self.maps):
            raise ConfigError(f"maps must be a tuple of paths, got {self.maps!r}")
        if self.verify_kv not in ("none", "sample", "strict"):
            raise ConfigError(f"--verify-kv {self.verify_kv!r}: use none, sample or strict")
        if self.tokens_file is None and not self.allow_open and not is_loopback(self.host):
            raise ConfigError(f"serving on {self.host} without --tokens would give anyone who can reach it your "
                              "models and caches; pass --tokens FILE, or --allow-open if that is what you want")

    @property
    def open_access(self) -> bool:
        return self.tokens_file is None

    def shares(self, tenants: int) -> "Shares":
        """What one of ``tenants`` tenants (trust domains) may hold: the ``*_per_tenant`` fields,
        else an even split of the whole (so that no tenant can take another's share)."""
        n = max(tenants, 1)
        return Shares(queue=self.max_queue_per_tenant or max((self.max_queue + 1) // n, 1),
                      session_bytes=(self.session_budget_bytes // n if self.session_budget_per_tenant_bytes is None
                                     else self.session_budget_per_tenant_bytes),
                      sessions=self.max_sessions_per_tenant or max(self.max_sessions // n, 1))

    @property
    def loopback_hosts_only(self) -> bool:
        """Whether requests must name a loopback ``Host`` (open access, unless ``allow_open``): a web page
        rebound to 127.0.0.1 by DNS names its own host, so it cannot use a server that trusts anyone."""
        return self.open_access and not self.allow_open


@dataclass(frozen=True, kw_only=True)
class Shares:
    """One tenant's share of a server: requests on each model, session K/V bytes, session records."""

    queue: int
    session_bytes: int
    sessions: int


def _in(value, unit: int, *, up: bool = False) -> str:
    """``value`` in the flag's unit: bytes as megabytes for the ``-mb`` flags (``up``: rounded up to 0.001)."""
    if unit == 1 or not isinstance(value, (int, float)):
        return str(value)
    return f"{math.ceil(value / unit * 1000) / 1000:g}" if up else f"{value / unit:g}"


def is_loopback(host: str) -> bool:
    """True for ``localhost`` and loopback addresses (127.0.0.0/8, ::1)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
