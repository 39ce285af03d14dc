"""Three ASGI middlewares: loopback ``Host`` names only in open access (400), a bounded, timely request
body (413, 408), and request metrics (count, status, latency).

All are plain ASGI (not Starlette's ``BaseHTTPMiddleware``), so that streamed
responses and client disconnects pass through untouched.
"""

from __future__ import annotations

import asyncio
import re
import time

from c2c.errors import ClientTimeoutError, HostNotAllowedError, RequestTooLargeError
from c2c.serve.http_errors import error_body, error_bytes
from c2c.serve.metrics import Metrics
from c2c.serve.config import MB, is_loopback

_ROUTES = ("/v1/models", "/v1/chat/completions", "/v1/c2c/events", "/v1/c2c/advise", "/healthz", "/metrics",
           "/docs", "/openapi.json")
_COMMIT = re.compile(r"/v1/c2c/commits/[^/]+(/invalidate)?")
_MODEL = re.compile(r"/v1/models/[^/]+")
_HOST = re.compile(r"(?:\[(?P<v6>[0-9a-f:.]+)\]|(?P<name>[^:\[\]]+))(?::[0-9]{1,5})?")  # name[:port], [v6][:port]


def route_of(path: str) -> str:
    """A low-cardinality name for ``path`` (ids replaced by placeholders, unknown paths as ``other``)."""
    if path in _ROUTES:
        return path
    m = _COMMIT.fullmatch(path)
    if m:
        return "/v1/c2c/commits/{id}" + (m.group(1) or "")
    return "/v1/models/{model}" if _MODEL.fullmatch(path) else "other"


async def send_error(send, e) -> None:
    status, body, headers = error_body(e)
    payload = error_bytes(body)
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(payload)).encode())]
                + [(k.lower().encode(), v.encode()) for k, v in headers.items()]})
    await send({"type": "http.response.body", "body": payload})


def is_loopback_host(value: str) -> bool:
    """True for a ``Host`` header naming this machine's loopback: ``localhost``, ``127.x.y.z`` or
    ``[::1]``, with or without a port."""
    m = _HOST.fullmatch(value.lower())
    return m is not None and is_loopback(m["v6"] or m["name"])


class LoopbackHostOnly:
    """Refuse, with 400, every request whose ``Host`` is not a loopback name (:func:`is_loopback_host`).

    For a server without tokens: anyone who reaches it is trusted, so a web page on
    another origin must not reach it through DNS rebinding (its name resolved to
    127.0.0.1), and such a page always sends its own name as ``Host``.

    NOTE: a request with no ``Host`` at all (HTTP/1.0) passes; browsers always send one.
    """

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http":
            host = dict(scope["headers"]).get(b"host")
            if host is not None and not is_loopback_host(host.decode("latin-1")):
                shown = host.decode("latin-1")[:100]
                return await send_error(send, HostNotAllowedError(
                    f"this server runs without --tokens, so it answers only requests addressed to a loopback "
                    f"name (127.0.0.1, localhost or [::1]), not Host {shown!r}; call it at one of those, or "
                    "restart it with --tokens FILE to serve other names"))
        return await self.app(scope, receive, send)


class BodyLimit:
    """Refuse a body over ``max_bytes`` with 413, by its ``Content-Length`` or as it arrives; and a
    body that has not all arrived ``read_timeout_s`` after the headers with 408, closing the
    connection (a client that dribbles its body holds no connection for long).

    The body is read here in full (it is at most ``max_bytes``) and replayed to the app;
    later messages (the disconnect) pass through.
    """

    def __init__(self, app, max_bytes: int, read_timeout_s: float = 30.0):
        self.app = app
        self.max_bytes = max_bytes
        self.read_timeout_s = read_timeout_s

    def _too_large(self, n: int | str) -> RequestTooLargeError:
        return RequestTooLargeError(f"the request body is {n} bytes, over this server's limit of "
                                    f"{self.max_bytes} bytes (--max-body-mb {self.max_bytes / MB:g}); send less")

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or scope["method"] in ("GET", "HEAD", "OPTIONS"):
            return await self.app(scope, receive, send)
        length = dict(scope["headers"]).get(b"content-length")
        if length is not None and length.isdigit() and int(length) > self.max_bytes:
            return await send_error(send, self._too_large(int(length)))
        body, more = bytearray(), True
        deadline = time.monotonic() + self.read_timeout_s
        while more:
            try:
                message = await asyncio.wait_for(receive(), max(deadline - time.monotonic(), 0.0))
            except asyncio.TimeoutError:
                return await send_error(send, ClientTimeoutError(
                    f"the request body did not arrive within {self.read_timeout_s:g} s (--read-timeout; "
                    f"{len(body)} bytes came); send it at once"))
            if message["type"] == "http.disconnect":
                return
            body += message.get("body", b"")
            more = message.get("more_body", False)
            if len(body) > self.max_bytes:
                return await send_error(send, self._too_large(f"more than {self.max_bytes}"))
        replayed = False

        async def replay():
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": bytes(body), "more_body": False}
            return await receive()

        await self.app(scope, replay, send)


class RequestMetrics:
    """Count every HTTP request by route and status, and time it until its last byte."""

    def __init__(self, app, metrics: Metrics):
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        t0, status = time.perf_counter(), [500]

        async def sending(message):
            if message["type"] == "http.response.start":
                status[0] = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, sending)
        finally:
            route = route_of(scope["path"])
            self.metrics.requests.labels(route=route, status=str(status[0])).inc()
            self.metrics.latency.labels(route=route).observe(time.perf_counter() - t0)
