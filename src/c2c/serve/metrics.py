"""Prometheus metrics of one server (its own registry: two servers in a process never mix).

============================================  ==========================================================
``c2c_requests_total{route,status}``          HTTP requests answered
``c2c_request_seconds{route}``                latency histogram, until the last byte
``c2c_handoffs_total{path,reason}``           attachments by path (``cache``/``text``) and why: ``ok``
                                              for a cache, else the first failed check or error type
``c2c_handoff_bytes_total{direction}``        artifact (or text) bytes published and attached
``c2c_queue_depth{model}``                    requests on a model beyond the one running
``c2c_tokens_total{kind}``                    ``prompt``, ``cached`` and ``completion`` tokens
``c2c_sessions`` / ``c2c_session_bytes``      sessions held and the K/V bytes they hold
``c2c_session_evictions_total``               session caches dropped to stay within the budgets
============================================  ==========================================================
"""

from __future__ import annotations

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram, generate_latest

CONTENT_TYPE = CONTENT_TYPE_LATEST
_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter("c2c_requests", "HTTP requests answered", ["route", "status"], registry=r)
        self.latency = Histogram("c2c_request_seconds", "request latency until the last byte", ["route"],
                                 buckets=_BUCKETS, registry=r)
        self.handoffs = Counter("c2c_handoffs", "attachments by path and reason", ["path", "reason"], registry=r)
        self.handoff_bytes = Counter("c2c_handoff_bytes", "bytes published and attached", ["direction"], registry=r)
        self.queue_depth = Gauge("c2c_queue_depth", "requests waiting for a model's worker", ["model"], registry=r)
        self.tokens = Counter("c2c_tokens", "prompt, cached and completion tokens", ["kind"], registry=r)
        self.batch = Histogram("c2c_decode_batch", "requests per batched forward pass (decode steps and a prompt chunk)", ["model"],
                               buckets=(1, 2, 4, 8, 16, 32), registry=r)
        self.sessions = Gauge("c2c_sessions", "sessions held", registry=r)
        self.session_bytes = Gauge("c2c_session_bytes", "K/V bytes held by sessions", registry=r)
        self.evictions = Counter("c2c_session_evictions", "session caches dropped for the budget", registry=r)

    def render(self) -> bytes:
        return generate_latest(self.registry)
