"""Every refusal as an HTTP status and one error shape, OpenAI's plus one field::

    {"error": {"message": "...", "type": "invalid_request_error", "code": "stale_commit",
               "param": null, "c2c_error": "StaleCommitError"}}

- ``type`` is OpenAI's vocabulary, decided by the status alone (:func:`type_of`):
  ``invalid_request_error`` (400, 409, 413, 422), ``authentication_error`` (401),
  ``permission_error`` (403), ``not_found_error`` (404), ``rate_limit_error`` (429),
  ``server_error`` (5xx). Clients written for OpenAI read it as they always do.
- ``code`` is c2c's stable, machine-readable reason (the table below, plus
  ``json_invalid`` and ``invalid_request`` for a body that is not JSON or does not
  match the schema, ``route_not_found``, ``method_not_allowed`` and ``internal_error``).
- ``c2c_error`` is the :class:`~c2c.errors.C2CError` class raised (``null`` when the
  refusal came from the schema or the router), so a client can tell a stale commit
  from a tampered one without parsing the message (:func:`c2c.client.error_from`).
- ``param`` names the offending field of a schema error.

The first matching row decides:

=======================  ======  =======================  ======================================================
error                    status  code                     when
=======================  ======  =======================  ======================================================
AuthError                401     invalid_api_key          no or unknown bearer token
HostNotAllowedError      400     host_not_allowed         open access, called with a non-loopback ``Host``
RequestTooLargeError     413     request_too_large        body over ``--max-body-mb``
QueueFullError           429     rate_limit_exceeded      the model's queue, or the tenant's share, is full
                                                          (``Retry-After``)
RequestTimeoutError      504     timeout                  past the request's deadline
ClientTimeoutError       408     request_timeout          the body did not arrive within ``--read-timeout``
ContextLengthError       400     context_length_exceeded  prompt (+ max_tokens) over the model's context
ServeError               503     unavailable              the server is shutting down
UnknownModelError        404     model_not_found          a model the server does not serve
CommitNotVisibleError    403     commit_not_visible       an id the caller's domain may not see (or none: one answer)
CommitNotFoundError      404     commit_not_found         an unknown commit id
DomainMismatchError      403     wrong_domain             another domain's cache, asked for explicitly
StaleCommitError         409     stale_commit             a stale commit, asked for as a cache
IncompatibleCacheError   409     incompatible_cache       another model, or another shared prefix
RuntimeUnsupportedError  409     runtime_unsupported      the runtime cannot do this exactly
HandoffError             409     handoff_refused          the hop limit, or a commit without its tokens / text
KeyringError             500     keyring_error            the server's own keyring is unusable
TrustError               422     untrusted_artifact       tampered, unsigned or untrusted artifact
ArtifactError            422     bad_artifact             an artifact that does not parse
StoreCorruptError        422     store_corrupt            stored bytes that no longer hash to their id
QuotaExceededError       429     quota_exceeded           a publish would take the caller's domain past its store quota
ConfigError              400     invalid_value            a bad value (stream name, label, id, cursor, sampling)
StoreError               503     store_unavailable        the store failed
ModelError               503     model_unavailable        a model failed
C2CError                 500     c2c_error                anything else c2c refused
=======================  ======  =======================  ======================================================
"""

from __future__ import annotations

import json
from http import HTTPStatus
from typing import Any

from starlette.responses import JSONResponse

from c2c.errors import (ArtifactError, AuthError, C2CError, ClientTimeoutError, CommitNotFoundError, CommitNotVisibleError,
                        ConfigError, ContextLengthError,
                        DomainMismatchError, HandoffError, HostNotAllowedError, IncompatibleCacheError, KeyringError,
                        ModelError, QueueFullError, QuotaExceededError, RequestTimeoutError, RequestTooLargeError,
                        RuntimeUnsupportedError, ServeError, StaleCommitError, StoreCorruptError, StoreError,
                        TrustError, UnknownModelError)

_TABLE: tuple[tuple[type[C2CError], int, str], ...] = (
    (AuthError, 401, "invalid_api_key"),
    (HostNotAllowedError, 400, "host_not_allowed"),
    (RequestTooLargeError, 413, "request_too_large"),
    (QueueFullError, 429, "rate_limit_exceeded"),
    (RequestTimeoutError, 504, "timeout"),
    (ClientTimeoutError, 408, "request_timeout"),
    (ContextLengthError, 400, "context_length_exceeded"),
    (ServeError, 503, "unavailable"),
    (UnknownModelError, 404, "model_not_found"),
    (CommitNotVisibleError, 403, "commit_not_visible"),
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
    (QuotaExceededError, 429, "quota_exceeded"),
    (ConfigError, 400, "invalid_value"),
    (StoreError, 503, "store_unavailable"),
    (ModelError, 503, "model_unavailable"),
    (C2CError, 500, "c2c_error"),
)

# OpenAI's error types, by status; any other 4xx is an invalid request, any 5xx a server error
_TYPES = {401: "authentication_error", 403: "permission_error", 404: "not_found_error", 429: "rate_limit_error"}
_HTTP_CODES = {404: "route_not_found", 405: "method_not_allowed"}  # the router's own refusals


def type_of(status: int) -> str:
    """OpenAI's error ``type`` for an HTTP status."""
    return "server_error" if status >= 500 else _TYPES.get(status, "invalid_request_error")


def http_code(status: int) -> str:
    """The ``code`` of a refusal by the router itself (no such route, method, ...)."""
    try:
        return _HTTP_CODES.get(status) or HTTPStatus(status).phrase.lower().replace(" ", "_").replace("-", "_")
    except ValueError:
        return f"http_{status}"


def status_of(e: C2CError) -> tuple[int, str]:
    """(HTTP status, error code) for ``e``."""
    for cls, status, code in _TABLE:
        if isinstance(e, cls):
            return status, code
    return 500, "c2c_error"


def body(message: str, status: int, code: str, *, param: str | None = None,
         c2c_error: str | None = None) -> dict[str, Any]:
    """The one error shape (see the module docstring)."""
    return {"error": {"message": message, "type": type_of(status), "code": code, "param": param,
                      "c2c_error": c2c_error}}


def error_body(e: C2CError) -> tuple[int, dict[str, Any], dict[str, str]]:
    """(status, body, extra headers) for a c2c error."""
    status, code = status_of(e)
    headers = {}
    if isinstance(e, QueueFullError):
        headers["Retry-After"] = str(max(1, round(e.retry_after_s)))
    if isinstance(e, AuthError):
        headers["WWW-Authenticate"] = "Bearer"
    if isinstance(e, ClientTimeoutError):
        headers["Connection"] = "close"  # what is left of the body is never read
    return status, body(str(e), status, code, c2c_error=type(e).__name__), headers


def schema_error_body(errors: list[dict[str, Any]]) -> dict[str, Any]:
    """The 400 body for a request the schema refused (pydantic's ``errors()``): ``json_invalid`` for a body
    that is not JSON, else ``invalid_request`` with the first offending field as ``param``."""
    first = errors[0] if errors else {}
    ctx = first.get("ctx") or {}
    if first.get("type") == "json_invalid":
        return body(f"the request body is not valid JSON: {ctx.get('error', 'malformed')}", 400, "json_invalid")

    def where(err: dict[str, Any]) -> str:
        return ".".join(str(x) for x in err.get("loc", ()) if x != "body")

    message = "; ".join(f"{where(err) or 'body'}: {err.get('msg')}" for err in errors[:5])
    return body(message or "invalid request", 400, "invalid_request", param=ctx.get("param") or where(first) or None)


def error_bytes(payload: dict[str, Any]) -> bytes:
    """``payload`` as ASCII JSON: a message that quotes a client's string can never fail to encode."""
    return json.dumps(payload, ensure_ascii=True, separators=(",", ":")).encode()


class ErrorResponse(JSONResponse):
    """A JSON error response rendered by :func:`error_bytes`."""

    def render(self, content: Any) -> bytes:
        return error_bytes(content)
