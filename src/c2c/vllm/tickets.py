"""Publish tickets: how a reply learns the commit id of a cache that is saved after the reply was made.

vLLM writes a request's reply (and its ``kv_transfer_params``) the moment the request
finishes, but the request's K/V only leave the paged memory on the next engine step,
and become a commit once they are hashed, signed and stored, off the engine loop. So the
connector answers with a ticket, and the worker writes the outcome under it once the
commit is in the store. :class:`~c2c.vllm.api_middleware.C2CMiddleware`, in the HTTP
server, waits for the ticket and puts the commit into the reply.

A ticket is 32 hex characters (random); its outcome is one small JSON file, 0600, in
``<run dir>/tickets``, removed by whoever reads it.

A streamed reply carries no ``kv_transfer_params``, so for a stream the middleware names the
ticket itself (in the request) and the connector reports under it three times, one file
per ``kind``: ``start`` (the request passed its checks, or the error it must fail with,
before its first token), ``reply`` (what a whole reply's ``kv_transfer_params.c2c`` would
say) and ``commit`` (the published commit).
"""

from __future__ import annotations

import json
import re
import secrets
import time
from pathlib import Path
from typing import Any

from c2c._io import write_atomic
from c2c.errors import ConfigError

_TICKET = re.compile(r"[0-9a-f]{32}")
KINDS = ("commit", "start", "reply")
STALE_AFTER_S = 3600.0     # outcomes nobody collected are removed after this long


def new_ticket() -> str:
    return secrets.token_hex(16)


def check_ticket(ticket: Any) -> str:
    """``ticket`` if it is one.

    Raises:
        ConfigError: it is not 32 lowercase hex characters.
    """
    if not isinstance(ticket, str) or not _TICKET.fullmatch(ticket):
        raise ConfigError(f"{str(ticket)[:40]!r} is not a c2c ticket (32 lowercase hex characters)")
    return ticket


def _path(root: Path, ticket: str, kind: str) -> Path:
    if kind not in KINDS:
        raise ConfigError(f"a ticket's kind is one of {KINDS}, not {kind!r}")
    return root / "tickets" / (f"{check_ticket(ticket)}.json" if kind == "commit" else f"{ticket}.{kind}.json")


def settle(root: Path, ticket: str, outcome: dict[str, Any], *, kind: str = "commit") -> None:
    """Record ``outcome`` (the commit, or ``{"error": ...}``) under ``ticket``."""
    write_atomic(_path(root, ticket, kind), json.dumps(outcome).encode(), durable=False, error=ConfigError)


def collect(root: Path, ticket: str, *, timeout_s: float, poll_s: float = 0.01,
            kind: str = "commit") -> dict[str, Any] | None:
    """The outcome of ``ticket`` once settled (the file is removed), or None after ``timeout_s``."""
    path = _path(root, ticket, kind)
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            if time.monotonic() >= deadline:
                return None
            time.sleep(poll_s)
            continue
        path.unlink(missing_ok=True)
        return json.loads(data)


def sweep(root: Path, *, older_than_s: float = STALE_AFTER_S) -> int:
    """Remove outcomes and staged files nobody collected; returns how many."""
    cutoff, n = time.time() - older_than_s, 0
    for folder in (root / "tickets", root / "staging"):
        for p in folder.glob("*"):
            try:
                if p.stat().st_mtime < cutoff:
                    p.unlink()
                    n += 1
            except FileNotFoundError:
                pass
    return n
