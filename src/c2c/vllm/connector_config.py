"""The connector's settings, from ``kv_connector_extra_config``, and where its local files live.

::

    --kv-transfer-config '{"kv_connector": "C2CConnector",
                           "kv_connector_module_path": "c2c.vllm.connector",
                           "kv_role": "kv_both",
                           "kv_connector_extra_config": {"store": "redis://127.0.0.1:6379/0",
                                                         "domain": "research"}}'

Keys of ``kv_connector_extra_config`` (all optional):

``store``     the commit store's URL (:func:`c2c.store.open_store`); default ``C2C_STORE``, else
              the embedded SQLite store under ``C2C_HOME``.
``domain``    the instance's trust domain: it signs what it publishes for this domain and
              attaches what a key trusted here signed (default ``default``).
``keys``      the keyring folder (default ``C2C_HOME/keys``); a signing key for ``domain``
              is created there on first use, like ``c2c serve`` does.
``agent``     the producer name written into published commits (default ``vllm``).
``prefix``    ``longest`` (default): an ``auto`` attach loads the longest run of whole
              16-token blocks the prompt shares with the commit; ``exact``: the prompt
              must begin with every token of the commit. ``full`` always needs every token.
``max_hops``  the hop limit (default ``C2C_MAX_HOPS``, 3).

Local files (run directory ``C2C_VLLM_RUN_DIR``, default ``C2C_HOME/vllm``, 0700): the
verified artifacts the scheduler stages for the worker to load (``staging/``), and the
outcome of each publish, which the HTTP middleware waits for (``tickets/``). They hold
nothing that is not already in the store, and are removed once used.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

from c2c._io import private_dir
from c2c.config import c2c_home
from c2c.errors import ConfigError
from c2c.trust.keys import check_domain

RUN_DIR_ENV = "C2C_VLLM_RUN_DIR"
PREFIX_POLICIES = ("longest", "exact")
_KEYS = {"store", "domain", "keys", "agent", "prefix", "max_hops"}


@dataclass(frozen=True, kw_only=True)
class ConnectorConfig:
    """What one vLLM instance's connector works with (see the module docstring)."""

    store: str | None = None
    domain: str = "default"
    keys: str | None = None
    agent: str = "vllm"
    prefix: str = "longest"
    max_hops: int | None = None

    @classmethod
    def from_extra(cls, extra: Mapping[str, Any] | None) -> "ConnectorConfig":
        """Validate ``kv_connector_extra_config``; an unknown key or a bad value is a :class:`ConfigError`."""
        extra = dict(extra or {})
        unknown = sorted(set(extra) - _KEYS)
        if unknown:
            raise ConfigError(f"kv_connector_extra_config: unknown key(s) {unknown}; known: {sorted(_KEYS)}")
        for name in ("store", "domain", "keys", "agent", "prefix"):
            if name in extra and not isinstance(extra[name], str):
                raise ConfigError(f"kv_connector_extra_config.{name} must be a string")
        if extra.get("prefix", "longest") not in PREFIX_POLICIES:
            raise ConfigError(f"kv_connector_extra_config.prefix must be one of {PREFIX_POLICIES}")
        hops = extra.get("max_hops")
        if hops is not None and (not isinstance(hops, int) or isinstance(hops, bool) or hops < 0):
            raise ConfigError("kv_connector_extra_config.max_hops must be an integer >= 0")
        check_domain(extra.get("domain", "default"))
        return cls(**extra)


def run_dir() -> Path:
    """The connector's private folder on this machine (``C2C_VLLM_RUN_DIR``, else ``C2C_HOME/vllm``)."""
    root = Path(os.environ.get(RUN_DIR_ENV) or (c2c_home() / "vllm")).expanduser()
    for d in (root, root / "staging", root / "tickets"):
        private_dir(d, error=ConfigError)
    return root
