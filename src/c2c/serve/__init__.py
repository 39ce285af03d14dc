"""`c2c serve`: an OpenAI-compatible HTTP server whose agents hand each other KV caches.

Needs the ``serve`` extra (``pip install 'c2c[serve]'``: fastapi, uvicorn,
prometheus-client). Start it with ``c2c serve`` or :func:`run`; talk to it with
any OpenAI client, and use :mod:`c2c.client` for the native endpoints.

Modules, one idea each (the HTTP layer is thin; the conversation engine, how messages become tokens and a
cache, is :mod:`c2c.conversation`: ``render``, ``reuse``, ``decode``, ``editing``, ``tools``):

================  ==============================================================
``config``        :class:`ServeConfig`, every option, frozen
``auth``          bearer tokens -> (agent, trust domain), compared in constant time
``sessions``      a session: its rendered conversation and cache, under K/V byte budgets per tenant and overall
``exchange``      publish to the store; attach commits through the gate (``c2c.handoff.gate``)
``service``       :class:`ChatService`: one completion, on its model's worker
``worker``        one forward pass at a time per model, shared fairly between tenants;
                  bounded admission, overall and per tenant (429)
``fairness``      who goes next: the tenant with the least recent use
``stream``        the asyncio side: wait for a job, or stream it as SSE
``schema``        pydantic models mirroring OpenAI's, plus the ``c2c`` field
``http_errors``   each refusal as an HTTP status in one error shape (OpenAI's)
``middleware``    loopback Host only if open (400), body limit (413) and read timeout (408), metrics
``metrics``       the Prometheus metrics of one server
``server``        :class:`Server`: the loaded pieces of one server
``app``           :func:`build_app`: the FastAPI routes
``runner``        :func:`run`: a :class:`Server` under uvicorn, with graceful shutdown
================  ==============================================================
"""

from __future__ import annotations

from c2c.serve.config import ServeConfig

__all__ = ["ServeConfig", "run"]


def run(config: ServeConfig) -> None:
    """Serve ``config`` until SIGTERM or Ctrl-C (see :func:`c2c.serve.runner.run`)."""
    from c2c.serve.runner import run as _run  # lazy: fastapi, uvicorn and torch load only to serve

    _run(config)
