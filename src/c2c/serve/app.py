"""`build_app`: the FastAPI application of `c2c serve`.

Routes are thin: each validates (the pydantic models of :mod:`c2c.serve.schema`,
the bearer token), calls the library once (:class:`~c2c.serve.service.ChatService`
or :class:`~c2c.serve.exchange.Exchange`) and serializes. Every refusal is
answered in OpenAI's error shape (:mod:`c2c.serve.http_errors`).

=====================================  ===============================================
``GET  /v1/models``                    the served models
``POST /v1/chat/completions``          OpenAI chat completions (+ ``stream``), with ``c2c``
``GET  /v1/c2c/commits/{id}``          a commit: stream, version, parents, staleness, hops
``POST /v1/c2c/commits/{id}/invalidate``  mark it (and its dependents) stale
``GET  /v1/c2c/events``                SSE of invalidation events (``?after=&limit=&timeout_s=``)
``POST /v1/c2c/advise``                the advisor's decision and costs for a hop
``GET  /healthz`` ``/metrics`` ``/docs``  health, Prometheus metrics, OpenAPI docs
=====================================  ===============================================
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time

import anyio
from fastapi import Depends, FastAPI, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from starlette.exceptions import HTTPException as StarletteHTTPException

from c2c import __version__
from c2c.errors import C2CError
from c2c.serve import stream
from c2c.serve.auth import Principal
from c2c.serve.exchange import advise_hop
from c2c.serve.http_errors import ErrorResponse, body as error_shape, error_body, http_code, schema_error_body
from c2c.serve.metrics import CONTENT_TYPE
from c2c.serve.middleware import BodyLimit, LoopbackHostOnly, RequestMetrics
from c2c.serve.schema import (MAX_TIMEOUT_S, AdviseIn, ChatCompletionIn, ChatCompletionOut, ErrorOut, InvalidateIn,
                              c2c_headers, completion_body, event_cursor)
from c2c.serve.server import Server
from c2c.serve.worker import Channel

log = logging.getLogger("c2c")
_ERRORS = {s: {"model": ErrorOut} for s in (400, 401, 403, 404, 408, 409, 413, 422, 429, 503, 504)}
_SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


def build_app(server: Server) -> FastAPI:
    service, exchange, tokens = server.service, server.service.exchange, server.tokens

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI):
        yield
        server.draining.set()
        await anyio.to_thread.run_sync(server.close)

    app = FastAPI(title="c2c serve", version=__version__, lifespan=lifespan,
                  description="OpenAI-compatible chat completions whose agents hand each other KV caches. "
                              "Extensions ride in the `c2c` field of requests and responses.")
    bearer = HTTPBearer(auto_error=False, description="a token from the server's --tokens file")

    def principal(cred: HTTPAuthorizationCredentials | None = Depends(bearer)) -> Principal:
        return tokens.authenticate(f"Bearer {cred.credentials}" if cred is not None else None)

    # ------------------------------------------------------------------ errors
    @app.exception_handler(C2CError)
    async def on_c2c_error(request: Request, e: C2CError):
        status, body, headers = error_body(e)
        return ErrorResponse(body, status_code=status, headers=headers)

    @app.exception_handler(RequestValidationError)
    async def on_invalid(request: Request, e: RequestValidationError):
        return ErrorResponse(schema_error_body(e.errors()), status_code=400)

    @app.exception_handler(StarletteHTTPException)
    async def on_http(request: Request, e: StarletteHTTPException):
        return ErrorResponse(error_shape(str(e.detail), e.status_code, http_code(e.status_code)),
                             status_code=e.status_code, headers=getattr(e, "headers", None))

    @app.exception_handler(Exception)
    async def on_bug(request: Request, e: Exception):
        log.exception("internal error on %s", request.url.path)
        return ErrorResponse(error_shape(f"internal error ({type(e).__name__}); see the server log", 500,
                                         "internal_error"), status_code=500)

    # ------------------------------------------------------------------ OpenAI
    @app.get("/v1/models", responses=_ERRORS)
    def models(who: Principal = Depends(principal)):
        return {"object": "list", "data": service.models()}

    @app.get("/v1/models/{model}", responses=_ERRORS)
    def model(model: str, who: Principal = Depends(principal)):
        name = service.model_name(model)
        return next(m for m in service.models() if m["id"] == name)

    @app.post("/v1/chat/completions", response_model=ChatCompletionOut, responses=_ERRORS)
    async def chat_completions(body: ChatCompletionIn, request: Request, who: Principal = Depends(principal)):
        channel = Channel(asyncio.get_running_loop())
        asked = body.to_request()
        job = service.submit(who, asked, channel)
        try:
            if body.stream:
                started = await stream.until_ready(job, channel, request.receive)
                include = bool(body.stream_options and body.stream_options.include_usage)
                calls = asked.tools is not None and asked.tools.calls
                return StreamingResponse(stream.chunks(job, channel, started, include_usage=include,
                                                       logprobs=bool(body.logprobs), tool_calls=calls),
                                         media_type="text/event-stream", headers=_SSE_HEADERS)
            done = await stream.result(job, channel, request.receive)
            return JSONResponse(completion_body(done), headers=c2c_headers(done))
        except stream.ClientGone:
            return Response(status_code=499)

    # ------------------------------------------------------------------ native
    @app.get("/v1/c2c/commits/{commit_id}", responses=_ERRORS)
    def show_commit(commit_id: str, who: Principal = Depends(principal)):
        return exchange.show(who, commit_id)

    @app.post("/v1/c2c/commits/{commit_id}/invalidate", responses=_ERRORS)
    def invalidate_commit(commit_id: str, body: InvalidateIn, who: Principal = Depends(principal)):
        return {"commit": commit_id, "events": exchange.invalidate(who, commit_id, body.reason)}

    @app.get("/v1/c2c/events", responses=_ERRORS)
    async def events(request: Request, after: str = Query("0", max_length=64),
                     limit: int = Query(0, ge=0, le=100000, description="end after this many events (0: never)"),
                     timeout_s: float = Query(0, ge=0, le=MAX_TIMEOUT_S, allow_inf_nan=False,
                                              description="end after this many seconds (0: never)"),
                     who: Principal = Depends(principal)):
        cursor = event_cursor(request.headers.get("last-event-id") or after)
        # a bad cursor is refused here, before the stream starts
        await anyio.to_thread.run_sync(functools.partial(exchange.events, who, cursor, limit=1))

        async def lines():
            sent, t_end, cur = 0, time.monotonic() + timeout_s if timeout_s else None, cursor
            yield ": c2c invalidation events\n\n"
            while not server.draining.is_set() and (t_end is None or time.monotonic() < t_end):
                got, cur = await anyio.to_thread.run_sync(functools.partial(exchange.events, who, cur, limit=100))
                for ev in got:
                    yield f"id: {ev['seq']}\nevent: stale\n{stream.sse(ev)}"
                    sent += 1
                    if limit and sent >= limit:
                        return
                if not got:
                    yield ": keep-alive\n\n"
                    await asyncio.sleep(0.25)

        return StreamingResponse(lines(), media_type="text/event-stream", headers=_SSE_HEADERS)

    @app.post("/v1/c2c/advise", responses=_ERRORS)
    def advise(body: AdviseIn, who: Principal = Depends(principal)):
        target = service.runtimes[service.model_name(body.model)]
        args = body.model_dump(exclude={"model", "from_model"})
        if body.from_model is not None:  # the sender's model: the same, or another one a held map may bridge
            source = service.runtimes[service.model_name(body.from_model)]
            args |= {"same_model": source is target, "xmap": service.exchange.map_offer(source, target)}
        return advise_hop(target, **args)

    # ------------------------------------------------------------------ operations
    @app.get("/healthz")
    def healthz():
        state = "draining" if server.draining.is_set() else "ok"
        body = {"status": state, "models": list(service.runtimes),
                "queue": {name: w.depth for name, w in service.workers.items()},
                "requests": {name: w.size for name, w in service.workers.items()},
                "sessions": service.pool.stats.sessions, "session_bytes": service.pool.stats.held_bytes}
        return JSONResponse(body, status_code=200 if state == "ok" else 503)

    @app.get("/metrics")
    def metrics():
        return Response(server.metrics.render(), media_type=CONTENT_TYPE)

    app.add_middleware(BodyLimit, max_bytes=server.config.max_body_bytes, read_timeout_s=server.config.read_timeout_s)
    if server.config.loopback_hosts_only:
        app.add_middleware(LoopbackHostOnly)  # before the body is read
    app.add_middleware(RequestMetrics, metrics=server.metrics)
    return app
