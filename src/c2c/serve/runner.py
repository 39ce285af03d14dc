"""`run`: start a :class:`~c2c.serve.server.Server` and serve it with uvicorn until a signal stops it.

Models are loaded, the store opened and the tokens read *before* the port is
bound, so a server that accepts connections is ready. A graceful shutdown
(SIGTERM or Ctrl-C): ``/healthz`` turns 503 and event streams end at once, new
connections are refused, running requests finish (up to ``shutdown_timeout_s``),
then the workers stop and the store is closed.

Slow clients: a request's headers must arrive within ``read_timeout_s`` of its
first byte (or of the connection, for the first request), and its body within
``read_timeout_s`` of its headers (:class:`~c2c.serve.middleware.BodyLimit`); past
either, 408 and the connection is closed. Between requests uvicorn's keep-alive
timeout closes an idle connection.
"""

from __future__ import annotations

import asyncio
import json

import uvicorn
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from c2c.errors import ClientTimeoutError
from c2c.serve.app import build_app
from c2c.serve.http_errors import error_body
from c2c.serve.config import ServeConfig
from c2c.serve.server import Server
from c2c.trust.redact import redact_access_log


def header_timeout_protocol(read_timeout_s: float) -> type[asyncio.Protocol]:
    """uvicorn's httptools protocol, with a deadline on each request's headers."""
    status, body, _ = error_body(ClientTimeoutError(
        f"the request headers did not arrive within {read_timeout_s:g} s (--read-timeout); send them at once"))
    payload = json.dumps(body).encode()
    response = (f"HTTP/1.1 {status} Request Timeout\r\ncontent-type: application/json\r\n"
                f"content-length: {len(payload)}\r\nconnection: close\r\n\r\n").encode() + payload

    class HeaderTimeout(HttpToolsProtocol):
        _header_timer: asyncio.TimerHandle | None = None

        def _arm(self) -> None:
            self._disarm()
            self._header_timer = self.loop.call_later(read_timeout_s, self._too_slow)

        def _disarm(self) -> None:
            if self._header_timer is not None:
                self._header_timer.cancel()
                self._header_timer = None

        def _too_slow(self) -> None:
            self._header_timer = None
            if not self.transport.is_closing():
                self.transport.write(response)
                self.transport.close()

        def connection_made(self, transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            self._arm()

        def connection_lost(self, exc) -> None:
            self._disarm()
            super().connection_lost(exc)

        def on_message_begin(self) -> None:
            super().on_message_begin()
            self._arm()

        def on_headers_complete(self) -> None:
            self._disarm()
            super().on_headers_complete()

    return HeaderTimeout


def run(config: ServeConfig) -> None:
    """Start a :class:`Server` and serve it on ``config.host:config.port`` until a signal stops it."""
    server = Server.start(config)
    app = build_app(server)

    class _Uvicorn(uvicorn.Server):
        def handle_exit(self, sig, frame) -> None:  # first signal: drain (healthz 503, event streams end)
            server.draining.set()
            super().handle_exit(sig, frame)

    uv = _Uvicorn(uvicorn.Config(app, host=config.host, port=config.port, log_level="info", access_log=True,
                                 timeout_graceful_shutdown=config.shutdown_timeout_s or None,
                                 http=header_timeout_protocol(config.read_timeout_s),
                                 server_header=False, proxy_headers=False))
    redact_access_log()  # after uvicorn set up its logging: no query value reaches the access log
    uv.run()
