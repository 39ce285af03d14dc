"""`C2CMiddleware`: the HTTP half of the connector, for ``vllm serve --middleware``.

::

    vllm serve MODEL --kv-transfer-config '{"kv_connector": "C2CConnector", ...}' \\
        --middleware c2c.vllm.api_middleware.C2CMiddleware

It reads each non-streamed ``/v1/chat/completions`` and ``/v1/completions`` reply that
carries ``kv_transfer_params.c2c`` and

- **publish**: waits (off the engine, in the HTTP server) for the request's ticket to
  settle and puts the commit into ``kv_transfer_params.c2c.publish``: ``commit``,
  ``stream``, ``version``, ``tokens``, ``bytes``, ``signed_by``, ``share`` (or, when the store
  refused it, ``error`` in the one error shape and ``status``, what ``c2c serve`` would answer;
  the reply itself stands);
- **error** (a bad or invisible commit id, a tampered commit, a refusal in ``full``):
  answers with c2c's error shape instead of the one-token reply, with the status
  ``c2c serve`` gives that error::

      {"error": {"message", "type", "code", "param", "c2c_error": "PrefixMismatchError"},
       "kv_transfer_params": {"c2c": {...}}}

It also names them in headers, for clients that keep no unknown reply fields (LangChain's
``ChatOpenAI(include_response_headers=True)``): ``x-c2c-commit`` (the published commit) and
``x-c2c-attach`` (``<commit id, 12 chars>:<path>``, the path ``cache`` or ``text``).

Without it, a reply carries ``publish.ticket`` and ``c2c.error`` as the connector wrote them.
Streamed replies pass through untouched (vLLM does not put ``kv_transfer_params`` in them).
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
from typing import Any

from c2c import errors as c2c_errors
from c2c.vllm import tickets
from c2c.vllm.connector_config import run_dir

log = logging.getLogger("vllm.c2c")  # a child of vLLM's logger: its lines reach vLLM's log, with its format
PATHS = ("/v1/chat/completions", "/v1/completions")
TICKET_WAIT_ENV = "C2C_VLLM_TICKET_WAIT_S"

def error_response(err: dict[str, str]) -> tuple[int, dict[str, Any]]:
    """(status, body) for a connector error ``{"type": class name, "message": ...}``: the one error table's
    (:func:`c2c.errors.error_payload`), as ``c2c serve`` answers the same error. A name that is no c2c error
    class is a 500 whose ``c2c_error`` is null."""
    name = str(err.get("type"))
    status, body = c2c_errors.error_payload(c2c_errors.error_named(name, str(err.get("message", ""))))
    if body["error"]["c2c_error"] != name:
        body["error"]["c2c_error"] = None
    return status, body


class C2CMiddleware:
    """ASGI middleware: see the module docstring."""

    def __init__(self, app):
        self.app = app
        self.wait_s = float(os.environ.get(TICKET_WAIT_ENV, "60"))
        self.root = run_dir()

    async def __call__(self, scope, receive, send):
        if scope.get("type") != "http" or scope.get("method") != "POST" or scope.get("path") not in PATHS:
            return await self.app(scope, receive, send)
        start: dict | None = None
        chunks: list[bytes] = []
        passthrough = False

        async def capture(message):
            nonlocal start, passthrough
            if passthrough:
                return await send(message)
            if message["type"] == "http.response.start":
                headers = dict(message.get("headers") or [])
                if b"application/json" not in headers.get(b"content-type", b""):
                    passthrough = True
                    return await send(message)
                start = message
                return
            if message["type"] == "http.response.body":
                chunks.append(message.get("body", b""))
                if not message.get("more_body"):
                    status, body, extra = await self._rewrite(start["status"], b"".join(chunks))
                    headers = [(k, v) for k, v in start.get("headers", []) if k.lower() != b"content-length"]
                    headers += [(b"content-length", str(len(body)).encode()), *extra]
                    await send({**start, "status": status, "headers": headers})
                    await send({"type": "http.response.body", "body": body})
                return
            await send(message)

        await self.app(scope, receive, capture)

    async def _rewrite(self, status: int, body: bytes) -> tuple[int, bytes, list[tuple[bytes, bytes]]]:
        try:
            doc = json.loads(body)
            c2c = doc["kv_transfer_params"]["c2c"]
            assert isinstance(c2c, dict)
        except (ValueError, KeyError, TypeError, AssertionError):
            return status, body, []
        if isinstance(c2c.get("error"), dict):
            status, err = error_response(c2c["error"])
            err["kv_transfer_params"] = {"c2c": c2c}
            return status, json.dumps(err).encode(), []
        headers = []
        att = c2c.get("attach")
        if isinstance(att, dict) and isinstance(att.get("commit"), str):
            headers.append((b"x-c2c-attach", f"{att['commit'][:12]}:{att.get('path')}".encode("ascii", "replace")))
        pub = c2c.get("publish")
        if isinstance(pub, dict) and pub.get("ticket"):
            try:
                outcome = await asyncio.to_thread(tickets.collect, self.root, pub["ticket"], timeout_s=self.wait_s)
            except c2c_errors.C2CError as e:
                outcome = {"error": {"type": type(e).__name__, "message": str(e)}}
            if outcome is None:
                outcome = {"pending": True, "error": {"type": "StoreError",
                                     "message": f"the commit was not in the store within {self.wait_s:g} s; "
                                                "look for it on the stream later"}}
            if isinstance(outcome.get("error"), dict) and "c2c_error" not in outcome["error"]:
                # the one error shape, and the status c2c serve would answer (the reply itself stands)
                status_of, shaped = error_response(outcome["error"])
                outcome = {**outcome, "error": shaped["error"], "status": status_of}
            c2c["publish"] = {**{k: v for k, v in pub.items() if k not in ("status",)}, **outcome}
            if isinstance(outcome.get("commit"), str):
                headers.append((b"x-c2c-commit", outcome["commit"].encode("ascii", "replace")))
            return status, json.dumps(doc).encode(), headers
        return status, body, headers
