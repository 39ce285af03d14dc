"""What a log line may say of a request: its path and parameter names, never a query's values.

A token sent in a URL (``?api_key=...``, refused with 401) must not reach an access log either.
Every value is redacted, not a list of credential names: a token may ride under any name or
spelling (``auth_token``, ``jwt``, ``api%5Fkey``), and a list always misses the next one.
``c2c serve`` installs :class:`RedactQueries` on uvicorn's access log, and so does the vLLM
middleware in ``vllm serve``'s process.
"""

from __future__ import annotations

import logging
import re

REDACTED = "[redacted]"
_QUERY = re.compile(r'\?[^\s"]*')  # a request target's query: from its "?" to the end of the target


def redact_query(text: str) -> str:
    """``text`` with the value of every query parameter replaced by ``[redacted]``, names kept
    (``?after=0&api_key=...`` -> ``?after=[redacted]&api_key=[redacted]``), and a parameter without a
    name (``?TOKEN``) replaced whole. Every value, not a list of credential names: a token sent in the
    URL (refused, 401) may ride under any name or spelling (``auth_token``, ``jwt``, ``api%5Fkey``),
    and a list always misses the next one."""
    return _QUERY.sub(lambda m: "?" + "&".join(_redact_param(p) for p in m.group()[1:].split("&")), text)


def _redact_param(param: str) -> str:
    """One ``name=value`` of a query as ``name=[redacted]``; a bare one (no ``=``) as ``[redacted]``."""
    name, eq, _ = param.partition("=")
    return f"{name}={REDACTED}" if eq else REDACTED if param else param


class RedactQueries(logging.Filter):
    """A filter for uvicorn's access log: a request line's query values (where a token sent in the URL
    rides) never reach the log; its path, method, status and parameter names do."""

    def filter(self, record: logging.LogRecord) -> bool:
        if isinstance(record.args, tuple):
            record.args = tuple(redact_query(a) if isinstance(a, str) else a for a in record.args)
        elif isinstance(record.msg, str):
            record.msg = redact_query(record.msg)
        return True


def redact_access_log(logger: str = "uvicorn.access") -> None:
    """Install :class:`RedactQueries` on ``logger`` (once: a second call adds nothing)."""
    log = logging.getLogger(logger)
    if not any(isinstance(f, RedactQueries) for f in log.filters):
        log.addFilter(RedactQueries())
