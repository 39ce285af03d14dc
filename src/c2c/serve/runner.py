"""`run`: start a :class:`~c2c.serve.server.Server` and serve it with uvicorn until a signal stops it.

Models are loaded, the store opened and the tokens read *before* the port is
bound, so a server that accepts connections is ready. A graceful shutdown
(SIGTERM or Ctrl-C): ``/healthz`` turns 503 and event streams end at once, new
connections are refused, running requests finish (up to ``shutdown_timeout_s``),
then the workers stop and the store is closed.
"""

from __future__ import annotations

import uvicorn

from c2c.serve.app import build_app
from c2c.serve.serve_config import ServeConfig
from c2c.serve.server import Server


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
                                 server_header=False, proxy_headers=False))
    uv.run()
