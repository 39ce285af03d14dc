"""Every refusal as an HTTP status and one error shape, OpenAI's plus one field::

    {"error": {"message": "...", "type": "invalid_request_error", "code": "stale_commit",
               "param": null, "c2c_error": "StaleCommitError"}}

The status, ``type`` and ``code`` of a :class:`~c2c.errors.C2CError` come from the one table
in the library (:data:`c2c.errors.HTTP_TABLE`, :func:`c2c.errors.error_payload`), which vLLM's
middleware (:mod:`c2c.vllm.api_middleware`) renders too, so a refusal reads the same from
either server. This module adds what only ``c2c serve``'s HTTP layer needs:

- the router's own refusals (``route_not_found``, ``method_not_allowed``, ``internal_error``);
- schema errors: ``json_invalid`` for a body that is not JSON, ``invalid_request`` with
  ``param`` naming the offending field;
- the headers some errors carry (``Retry-After``, ``WWW-Authenticate``, ``Connection: close``);
- the response class, whose bytes are always ASCII JSON.
"""

from __future__ import annotations

import json
from http import HTTPStatus
from typing import Any

from starlette.responses import JSONResponse

from c2c.errors import AuthError, C2CError, ClientTimeoutError, QueueFullError, error_payload, type_of

_HTTP_CODES = {404: "route_not_found", 405: "method_not_allowed"}  # the router's own refusals


def http_code(status: int) -> str:
    """The ``code`` of a refusal by the router itself (no such route, method, ...)."""
    try:
        return _HTTP_CODES.get(status) or HTTPStatus(status).phrase.lower().replace(" ", "_").replace("-", "_")
    except ValueError:
        return f"http_{status}"


def error_body(e: C2CError) -> tuple[int, dict[str, Any], dict[str, str]]:
    """(status, body, extra headers) for a c2c error."""
    status, payload = error_payload(e)
    headers = {}
    if isinstance(e, QueueFullError):
        headers["Retry-After"] = str(max(1, round(e.retry_after_s)))
    if isinstance(e, AuthError):
        headers["WWW-Authenticate"] = "Bearer"
    if isinstance(e, ClientTimeoutError):
        headers["Connection"] = "close"  # what is left of the body is never read
    return status, payload, headers


def body(message: str, status: int, code: str, *, param: str | None = None,
         c2c_error: str | None = None) -> dict[str, Any]:
    """The one error shape (see the module docstring)."""
    return {"error": {"message": message, "type": type_of(status), "code": code, "param": param,
                      "c2c_error": c2c_error}}


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
    param = ".".join(x for x in (where(first), ctx.get("param")) if x)  # a field's own error names a field in it
    return body(message or "invalid request", 400, "invalid_request", param=param or None)


def error_bytes(payload: dict[str, Any]) -> bytes:
    """``payload`` as ASCII JSON: a message that quotes a client's string can never fail to encode."""
    return json.dumps(payload, ensure_ascii=True, separators=(",", ":")).encode()


class ErrorResponse(JSONResponse):
    """A JSON error response rendered by :func:`error_bytes`."""

    def render(self, content: Any) -> bytes:
        return error_bytes(content)
