"""Every refusal as an HTTP status and OpenAI's error shape ``{"error": {"message", "type", "code"}}``.

``type`` is the :class:`~c2c.errors.C2CError` class name (``invalid_request_error``
for a request that does not match the schema), so a client can tell a stale
commit from a tampered one without parsing the message. The first matching row
decides:

==========================  ======  ===========================================
error                       status  when
==========================  ======  ===========================================
AuthError                   401     no or unknown bearer token
RequestTooLargeError        413     body over ``--max-body-mb``
QueueFullError              429     the model's queue, or the tenant's share, is full (``Retry-After``)
RequestTimeoutError         504     past the request's deadline
ClientTimeoutError          408     the body did not arrive within ``--read-timeout`` (then closed)
ContextLengthError          400     prompt (+ max_tokens) over the model's context
ServeError                  503     the server is shutting down
UnknownModelError           404     a model the server does not serve
CommitNotFoundError         404     an unknown commit id
DomainMismatchError         403     a cache from another trust domain, asked for explicitly
StaleCommitError            409     a stale commit, asked for as a cache
IncompatibleCacheError      409     another model, or another shared prefix
HandoffError                409     the hop limit, or a commit without its tokens / text
KeyringError                500     the server's own keyring is unusable
TrustError, ArtifactError   422     tampered, unsigned or untrusted artifact
StoreCorruptError           422     stored bytes that no longer hash to their id
ConfigError                 400     a bad value (stream name, label, id, sampling)
StoreError, ModelError      503     the store or a model failed
C2CError                    500     anything else c2c refused
==========================  ======  ===========================================
"""

from __future__ import annotations

from typing import Any

from c2c.errors import (ArtifactError, AuthError, C2CError, ClientTimeoutError, CommitNotFoundError, ConfigError,
                        ContextLengthError,
                        DomainMismatchError, HandoffError, IncompatibleCacheError, KeyringError, ModelError,
                        QueueFullError, RequestTimeoutError, RequestTooLargeError, RuntimeUnsupportedError, ServeError,
                        StaleCommitError,
                        StoreCorruptError, StoreError, TrustError, UnknownModelError)

_TABLE: tuple[tuple[type[C2CError], int, str], ...] = (
    (AuthError, 401, "invalid_api_key"),
    (RequestTooLargeError, 413, "request_too_large"),
    (QueueFullError, 429, "rate_limit_exceeded"),
    (RequestTimeoutError, 504, "timeout"),
    (ClientTimeoutError, 408, "request_timeout"),
    (ContextLengthError, 400, "context_length_exceeded"),
    (ServeError, 503, "unavailable"),
    (UnknownModelError, 404, "model_not_found"),
    (CommitNotFoundError, 404, "commit_not_found"),
    (DomainMismatchError, 403, "wrong_domain"),
    (StaleCommitError, 409, "stale_commit"),
    (IncompatibleCacheError, 409, "incompatible_cache"),
    (RuntimeUnsupportedError, 409, "runtime_unsupported"),
    (HandoffError, 409, "handoff_refused"),
    (KeyringError, 500, "keyring_error"),
    (TrustError, 422, "untrusted_artifact"),
    (ArtifactError, 422, "bad_artifact"),
    (StoreCorruptError, 422, "store_corrupt"),
    (ConfigError, 400, "invalid_value"),
    (StoreError, 503, "store_unavailable"),
    (ModelError, 503, "model_unavailable"),
    (C2CError, 500, "c2c_error"),
)


def status_of(e: C2CError) -> tuple[int, str]:
    """(HTTP status, error code) for ``e``."""
    for cls, status, code in _TABLE:
        if isinstance(e, cls):
            return status, code
    return 500, "c2c_error"


def body(message: str, type_: str, code: str | None = None, param: str | None = None) -> dict[str, Any]:
    return {"error": {"message": message, "type": type_, "code": code, "param": param}}


def error_body(e: C2CError) -> tuple[int, dict[str, Any], dict[str, str]]:
    """(status, OpenAI-shaped body, extra headers) for a c2c error."""
    status, code = status_of(e)
    headers = {}
    if isinstance(e, QueueFullError):
        headers["Retry-After"] = str(max(1, round(e.retry_after_s)))
    if isinstance(e, AuthError):
        headers["WWW-Authenticate"] = "Bearer"
    if isinstance(e, ClientTimeoutError):
        headers["Connection"] = "close"  # what is left of the body is never read
    return status, body(str(e), type(e).__name__, code), headers
