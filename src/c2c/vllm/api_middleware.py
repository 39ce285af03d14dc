"""`C2CMiddleware`: the HTTP half of the connector, for ``vllm serve --middleware``.

::

    vllm serve MODEL --kv-transfer-config '{"kv_connector": "C2CConnector", ...}' \\
        --middleware c2c.vllm.api_middleware.C2CMiddleware

For ``/v1/chat/completions`` and ``/v1/completions`` it

- **takes both request shapes**: ``c2c serve``'s ``extra_body={"c2c": {...}}`` and vLLM's
  ``extra_body={"kv_transfer_params": {"c2c": {...}}}``, and answers in the one it was asked
  in (:mod:`c2c.vllm.shape`); a bad ``c2c`` field is a 400 before vLLM sees the request;
- **publish**: waits (off the engine, in the HTTP server) for the request's ticket to
  settle and puts the commit into the reply's ``publish``: ``commit``, ``stream``,
  ``version``, ``tokens``, ``bytes``, ``signed_by``, ``share`` (or, when the store refused
  it, ``error`` in the one error shape and ``status``, what ``c2c serve`` would answer; the
  reply itself stands);
- **error** (a bad or invisible commit id, a tampered commit, a refusal in ``full``):
  answers with c2c's error shape instead of the one-token reply, with the status
  ``c2c serve`` gives that error::

      {"error": {"message", "type", "code", "param", "c2c_error": "PrefixMismatchError"},
       "kv_transfer_params": {"c2c": {...}}}        # or "c2c": {...}, as asked

- **vLLM's own refusals that c2c's error table names**: a model the instance does not serve
  (vLLM's 404 ``NotFoundError``, ``param: "model"``) becomes c2c serve's 404
  ``model_not_found`` (``c2c_error: "UnknownModelError"``), vLLM's message kept
  (:data:`NATIVE_REFUSALS`). Every other refusal of vLLM's own keeps vLLM's shape;
- **streams** (``stream=True``): vLLM puts no ``kv_transfer_params`` in a stream, so the
  middleware names the request's ticket and holds the stream until the connector says
  the request passed its checks (an error is then an HTTP error, as from ``c2c serve``),
  and the chunk that carries ``finish_reason`` until the commit is in the store: that
  chunk carries the ``c2c`` record (``publish.commit`` among it), as ``c2c serve``'s does.

It also keeps query values out of vLLM's access log (:mod:`c2c.trust.redact`, as ``c2c serve``
does). It also names them in headers of a whole reply, for clients that keep no unknown reply
fields (LangChain's ``ChatOpenAI(include_response_headers=True)``): ``x-c2c-commit`` (the
published commit), ``x-c2c-handoffs`` (``<commit id, 12 chars>:<used>``, ``full`` or ``text``, as
``c2c serve`` names it) and ``x-c2c-attach`` (``<commit id, 12 chars>:<path>``, the path ``cache``
or ``text``).

Without it, a reply carries ``publish.ticket`` and ``c2c.error`` as the connector wrote
them, and only the native shape is understood.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
from typing import Any

from c2c import errors as c2c_errors
from c2c.trust.redact import redact_access_log
from c2c.vllm import shape as shapes
from c2c.vllm import tickets
from c2c.vllm.connector_config import run_dir

log = logging.getLogger("vllm.c2c")  # a child of vLLM's logger: its lines reach vLLM's log, with its format
PATHS = ("/v1/chat/completions", "/v1/completions")
TICKET_WAIT_ENV = "C2C_VLLM_TICKET_WAIT_S"

# vLLM's own refusals that c2c's one error table names: (status, vLLM's ``type``, ``param``) -> the c2c class.
# NOTE: vLLM's reply is rewritten rather than the model checked here first: vLLM's --api-key middleware runs
# inside this one, so a caller without the key learns nothing of the served names, and vLLM's own rule (its
# aliases, LoRA adapters, VLLM_SKIP_MODEL_NAME_VALIDATION) stays the only one.
NATIVE_REFUSALS: dict[tuple[int, str, str | None], type[c2c_errors.C2CError]] = {
    (404, "NotFoundError", "model"): c2c_errors.UnknownModelError,
}


def native_refusal(status: int, doc: Any) -> tuple[int, dict[str, Any]] | None:
    """(status, body) in the one error shape for a reply of vLLM's own that :data:`NATIVE_REFUSALS` names
    (``{"error": {"message", "type", "param", "code": <int>}}``), as ``c2c serve`` answers the same refusal;
    None for any other reply, which passes as vLLM made it."""
    err = doc.get("error") if isinstance(doc, dict) else None
    if not isinstance(err, dict) or "c2c_error" in err:
        return None
    param = err.get("param")
    cls = NATIVE_REFUSALS.get((status, str(err.get("type")), param if isinstance(param, str) else None))
    if cls is None:
        return None
    return c2c_errors.error_payload(cls(str(err.get("message") or "refused by vLLM")))


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
        redact_access_log()  # vLLM's uvicorn access log: no query value (a token sent in the URL) reaches it
        self.wait_s = float(os.environ.get(TICKET_WAIT_ENV, "60"))
        self.root = run_dir()

    async def __call__(self, scope, receive, send):
        if scope.get("type") != "http" or scope.get("method") != "POST" or scope.get("path") not in PATHS:
            return await self.app(scope, receive, send)
        raw, gone = await _read_body(receive)
        if gone:
            return
        shape = None
        if b"c2c" in raw or b"\\u" in raw:  # (a key may be written with escapes: then it is parsed to be sure)
            try:
                doc = json.loads(raw)
                shape = shapes.read(doc) if isinstance(doc, dict) else None
            except ValueError:
                pass  # not JSON: vLLM answers it
            except c2c_errors.C2CError as e:
                status, body = c2c_errors.error_payload(e)
                return await _send_json(send, status, json.dumps(body).encode())
            if shape is not None:
                raw = json.dumps(doc).encode()
                scope = {**scope, "headers": [(k, v) for k, v in scope.get("headers", [])
                                              if k.lower() != b"content-length"]
                         + [(b"content-length", str(len(raw)).encode())]}
        replayed = False

        async def replay():
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": raw, "more_body": False}
            return await receive()

        if shape is None:  # nothing of c2c's: only a whole reply the connector wrote into is read
            return await self.app(scope, replay, _Whole(self, send, None).send)
        await self.app(scope, replay, (_Stream(self, send, shape) if shape.ticket else _Whole(self, send, shape)).send)

    async def settle_publish(self, out: dict[str, Any]) -> list[tuple[bytes, bytes]]:
        """Replace ``out["publish"]``'s ticket by the commit (or the error); the headers that name it."""
        headers = []
        att = out.get("attach")
        if isinstance(att, dict) and isinstance(att.get("commit"), str):
            headers.append((b"x-c2c-attach", f"{att['commit'][:12]}:{att.get('path')}".encode("ascii", "replace")))
            headers.append((b"x-c2c-handoffs", f"{att['commit'][:12]}:{att.get('used', att.get('path'))}"
                            .encode("ascii", "replace")))   # as c2c serve names it: <id>:full or <id>:text
        pub = out.get("publish")
        if not (isinstance(pub, dict) and pub.get("ticket")):
            return headers
        try:
            outcome = await asyncio.to_thread(tickets.collect, self.root, pub["ticket"], timeout_s=self.wait_s)
        except c2c_errors.C2CError as e:
            outcome = {"error": {"type": type(e).__name__, "message": str(e)}}
        if outcome is None:
            outcome = {"pending": True, "error": {"type": "StoreError",
                                                  "message": f"the commit was not in the store within "
                                                             f"{self.wait_s:g} s; look for it on the stream later"}}
        if isinstance(outcome.get("error"), dict) and "c2c_error" not in outcome["error"]:
            # the one error shape, and the status c2c serve would answer (the reply itself stands)
            status_of, shaped = error_response(outcome["error"])
            outcome = {**outcome, "error": shaped["error"], "status": status_of}
        out["publish"] = {**{k: v for k, v in pub.items() if k not in ("status", "ticket")}, **outcome}
        if isinstance(outcome.get("commit"), str):
            headers.append((b"x-c2c-commit", outcome["commit"].encode("ascii", "replace")))
        return headers

    async def collect(self, ticket: str, kind: str) -> dict[str, Any] | None:
        try:
            return await asyncio.to_thread(tickets.collect, self.root, ticket, timeout_s=self.wait_s, kind=kind)
        except c2c_errors.C2CError:
            return None


async def _read_body(receive) -> tuple[bytes, bool]:
    """The whole request body, and whether the client left first."""
    parts = []
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return b"".join(parts), True
        parts.append(message.get("body", b""))
        if not message.get("more_body"):
            return b"".join(parts), False


async def _send_json(send, status: int, body: bytes, headers: list[tuple[bytes, bytes]] = ()) -> None:
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                            *headers]})
    await send({"type": "http.response.body", "body": body})


def _error_reply(err: dict, field: str, value: dict) -> tuple[int, bytes]:
    status, body = error_response(err)
    body[field] = value
    return status, json.dumps(body).encode()


class _Whole:
    """A JSON reply: read whole, its c2c record settled and put in the shape asked; anything else passes."""

    def __init__(self, mw: C2CMiddleware, send, shape: "shapes.Shape | None"):
        self.mw, self.downstream, self.shape = mw, send, shape
        self.start: dict | None = None
        self.chunks: list[bytes] = []
        self.passthrough = False

    async def send(self, message):
        if self.passthrough:
            return await self.downstream(message)
        if message["type"] == "http.response.start":
            headers = dict(message.get("headers") or [])
            if b"application/json" not in headers.get(b"content-type", b""):
                self.passthrough = True
                return await self.downstream(message)
            self.start = message
            return
        if message["type"] != "http.response.body":
            return await self.downstream(message)
        self.chunks.append(message.get("body", b""))
        if message.get("more_body"):
            return
        status, body, extra = await self.rewrite(self.start["status"], b"".join(self.chunks))
        headers = [(k, v) for k, v in self.start.get("headers", []) if k.lower() != b"content-length"]
        await self.downstream({**self.start, "status": status,
                               "headers": headers + [(b"content-length", str(len(body)).encode()), *extra]})
        await self.downstream({"type": "http.response.body", "body": body})

    async def rewrite(self, status: int, body: bytes) -> tuple[int, bytes, list[tuple[bytes, bytes]]]:
        try:
            doc = json.loads(body)
        except ValueError:
            return status, body, []
        refusal = native_refusal(status, doc)
        if refusal is not None:
            return refusal[0], json.dumps(refusal[1]).encode(), []
        try:
            out = doc[shapes.NATIVE]["c2c"]
            assert isinstance(out, dict)
        except (KeyError, TypeError, AssertionError):
            return status, body, []
        shape = self.shape or shapes.Shape(name=shapes.NATIVE, ask=None)
        if isinstance(out.get("error"), dict):
            field, value = shapes.reply(out, shape)
            return (*_error_reply(out["error"], field, value), [])
        headers = await self.mw.settle_publish(out)
        field, value = shapes.reply(out, shape, doc.get("usage"))
        if field != shapes.NATIVE:
            doc.pop(shapes.NATIVE, None)
        doc[field] = value
        return status, json.dumps(doc).encode(), headers


class _Stream:
    """A streamed reply of a request with c2c fields (a ticket named): held until the connector reports the
    request passed its checks (or answered as the error it failed with), and its finishing chunk held until
    the commit is in the store, then given the c2c record."""

    def __init__(self, mw: C2CMiddleware, send, shape: "shapes.Shape"):
        self.mw, self.downstream, self.shape = mw, send, shape
        self.whole: _Whole | None = None   # vLLM answered JSON (an error before the stream began)
        self.dropped = False               # answered as an error: the rest of vLLM's stream is not sent
        self.plain = False                 # no report came: the stream passes as vLLM made it
        self.buffer = b""
        self.held: list[bytes] = []        # from the chunk with finish_reason on
        self.start: dict | None = None     # the response's start, until the connector's start report
        self.cleanup: asyncio.Task | None = None

    async def send(self, message):
        if self.whole is not None:
            return await self.whole.send(message)
        if self.dropped:
            return
        if message["type"] == "http.response.start":
            headers = dict(message.get("headers") or [])
            if b"text/event-stream" not in headers.get(b"content-type", b""):
                self.whole = _Whole(self.mw, self.downstream, self.shape)
                return await self.whole.send(message)
            # NOTE: held, not waited on here: vLLM hands its request to the engine only after this start is sent
            self.start = message
            return
        if self.start is not None:  # the first event: the engine has scheduled the request, so its report is there
            start, self.start = self.start, None
            report = await self.mw.collect(self.shape.ticket, "start")
            if report is None:
                log.warning("c2c: no start report for a streamed request within %g s; it streams without c2c's "
                            "record", self.mw.wait_s)
                self.plain = True
            elif isinstance(report.get("error"), dict):
                self.dropped = True
                # its reply report is read (and removed) when it comes, whether or not the client stays
                self.cleanup = asyncio.create_task(self.mw.collect(self.shape.ticket, "reply"))
                status, body = _error_reply(report["error"], *shapes.reply({"error": report["error"]}, self.shape))
                return await _send_json(self.downstream, status, body)
            await self.downstream(start)
        if message["type"] != "http.response.body" or self.plain:
            return await self.downstream(message)
        self.buffer += message.get("body", b"")
        more = bool(message.get("more_body"))
        events = self.buffer.split(b"\n\n")
        self.buffer = events.pop() if more else b""
        out = []
        for ev in (e for e in events if e.strip()):
            if self.held or _finishes(ev):
                self.held.append(ev)
                if ev.strip() == b"data: [DONE]":
                    out += await self._release()
            else:
                out.append(ev)
        if not more and self.held:
            out += await self._release()
        body = b"".join(e + b"\n\n" for e in out)
        if body or not more:
            await self.downstream({"type": "http.response.body", "body": body, "more_body": more})

    async def _release(self) -> list[bytes]:
        """The held events, the first given the c2c record."""
        held, self.held = self.held, []
        report = await self.mw.collect(self.shape.ticket, "reply")
        out = (report or {}).get("c2c")
        if not isinstance(out, dict):
            return held
        await self.mw.settle_publish(out)
        usage = next((u for u in map(_usage, held) if u), None)  # stream_options.include_usage's chunk
        field, value = shapes.reply(out, self.shape, usage)
        chunk = json.loads(held[0].strip()[len(b"data:"):])
        chunk[field] = value
        return [b"data: " + json.dumps(chunk).encode(), *held[1:]]


def _chunk(event: bytes) -> dict:
    """An SSE event's JSON chunk ({} for ``[DONE]`` or anything else)."""
    line = event.strip()
    if not line.startswith(b"data:") or line == b"data: [DONE]":
        return {}
    try:
        chunk = json.loads(line[len(b"data:"):])
    except ValueError:
        return {}
    return chunk if isinstance(chunk, dict) else {}


def _finishes(event: bytes) -> bool:
    """Whether an SSE event is a chunk in which a choice finishes."""
    return any(isinstance(c, dict) and c.get("finish_reason") for c in _chunk(event).get("choices") or [])


def _usage(event: bytes) -> dict | None:
    u = _chunk(event).get("usage")
    return u if isinstance(u, dict) else None
