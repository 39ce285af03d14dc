"""Publish tickets: how a reply learns the commit id of a cache that is saved after the reply was made.

vLLM writes a request's reply (and its ``kv_transfer_params``) the moment the request
finishes, but the request's K/V only leave the paged memory on the next engine step,
and become a commit once they are hashed, signed and stored, off the engine loop. So the
connector answers with a ticket, and the worker writes the outcome under it once the
commit is in the store. :class:`~c2c.vllm.api_middleware.C2CMiddleware`, in the HTTP
server, waits for the ticket and puts the commit into the reply.

A ticket is 32 hex characters (random); its outcome is one small JSON file, 0600, in
``<run dir>/tickets``, removed by whoever reads it.
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
STALE_AFTER_S = 3600.0     # outcomes nobody collected are removed after this long


def new_ticket() -> str:
    return secrets.token_hex(16)


def _path(root: Path, ticket: str) -> Path:
    if not isinstance(ticket, str) or not _TICKET.fullmatch(ticket):
        raise ConfigError(f"{str(ticket)[:40]!r} is not a c2c publish ticket")
    return root / "tickets" / f"{ticket}.json"


def settle(root: Path, ticket: str, outcome: dict[str, Any]) -> None:
    """Record ``outcome`` (the commit, or ``{"error": ...}``) under ``ticket``."""
    write_atomic(_path(root, ticket), json.dumps(outcome).encode(), durable=False, error=ConfigError)


def collect(root: Path, ticket: str, *, timeout_s: float, poll_s: float = 0.01) -> dict[str, Any] | None:
    """The outcome of ``ticket`` once settled (the file is removed), or None after ``timeout_s``."""
    path = _path(root, ticket)
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
