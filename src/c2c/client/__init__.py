"""`c2c.client`: a thin httpx client for `c2c serve`'s native endpoints, and helpers for the ``c2c`` field.

Chat completions go through any OpenAI client; these helpers build the request's
``c2c`` extension and read the response's::

    from openai import OpenAI
    from c2c.client import Client, c2c_options, c2c_of, published

    oai = OpenAI(base_url="http://127.0.0.1:8000/v1", api_key=TOKEN)
    r = oai.chat.completions.create(model=M, messages=msgs, temperature=0,
                                    extra_body=c2c_options(session="analyst-1", publish="analyst"))
    commit = published(r)                        # the commit id
    print(Client("http://127.0.0.1:8000", api_key=TOKEN).commit(commit)["stale"])

A refusal raises the :mod:`c2c.errors` class the server named in the error's
``c2c_error`` field (e.g. :class:`~c2c.errors.StaleCommitError`), with ``.status``
set; a schema error raises :class:`~c2c.errors.ConfigError`. Needs ``httpx`` (the
``serve`` extra).
"""

from __future__ import annotations

import json
from typing import Any, Iterable, Iterator, Sequence

import httpx

from c2c import errors

__all__ = ["Client", "attach_records", "c2c_of", "c2c_options", "error_from", "published"]
_BY_TYPE = {"invalid_request_error": errors.ConfigError, "authentication_error": errors.AuthError}


def c2c_options(session: str | None = None, *, publish: str | bool | None = None, labels: Sequence[str] = (),
                attach: Iterable[str] = (), mode: str = "auto", timeout_s: float | None = None) -> dict[str, Any]:
    """``extra_body`` for an OpenAI client: ``{"c2c": {...}}``.

    Args:
        session: keep this conversation's cache on the server between requests.
        publish: commit the cache after the reply: a stream name, or True for the caller's agent name.
        labels: with ``publish``, commit only the slice covering these spans (message names or roles).
        attach: commit ids to continue from; ``mode`` is ``auto``, ``full``, ``slice`` or ``text``.
        timeout_s: a deadline tighter than the server's.
    """
    c: dict[str, Any] = {}
    if session is not None:
        c["session"] = session
    if publish:
        c["publish"] = {"labels": list(labels)} | ({} if publish is True else {"stream": publish})
    attach = list(attach)
    if attach:
        c["attach"], c["mode"] = attach, mode
    if timeout_s is not None:
        c["timeout_s"] = timeout_s
    return {"c2c": c}


def c2c_of(response: Any) -> dict[str, Any]:
    """The ``c2c`` field of a completion (an openai object, a final stream chunk, or a dict); {} if none."""
    if isinstance(response, dict):
        return response.get("c2c") or {}
    extra = getattr(response, "model_extra", None) or {}
    return extra.get("c2c") or getattr(response, "c2c", None) or {}


def published(response: Any) -> str | None:
    """The id of the commit a completion published, or None."""
    return (c2c_of(response).get("publish") or {}).get("commit")


def attach_records(response: Any) -> list[dict[str, Any]]:
    """One record per attached commit: ``used`` (cache/text), ``reason``, ``checks``, ``bytes``, ``timings``."""
    return list(c2c_of(response).get("attach") or [])


def error_from(response: httpx.Response) -> errors.C2CError:
    """The :mod:`c2c.errors` exception an error response names in ``c2c_error`` (``.status`` holds the
    HTTP status); without one, :class:`~c2c.errors.ConfigError` for an invalid request (the schema),
    :class:`~c2c.errors.AuthError` for a 401, else :class:`~c2c.errors.ServeError`."""
    try:
        e = response.json()["error"]
        kind, name, message = str(e.get("type")), str(e.get("c2c_error")), str(e.get("message"))
    except (ValueError, KeyError, TypeError, AttributeError):
        kind, name, message = "", "", response.text[:500]
    cls = getattr(errors, name, None)
    if not (isinstance(cls, type) and issubclass(cls, errors.C2CError)):
        cls = _BY_TYPE.get(kind, errors.ServeError)
    try:
        exc = cls(message)
    except TypeError:  # a class with a richer constructor
        exc = errors.ServeError(message)
    exc.status = response.status_code
    return exc


class Client:
    """The server's native endpoints (``/v1/c2c/...``, ``/healthz``) over httpx."""

    def __init__(self, base_url: str = "http://127.0.0.1:8000", *, api_key: str | None = None,
                 timeout: float = 60.0, transport: httpx.BaseTransport | None = None):
        base = base_url.rstrip("/").removesuffix("/v1")
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.http = httpx.Client(base_url=base, headers=headers, timeout=timeout, transport=transport)

    def _call(self, method: str, path: str, **kw) -> Any:
        r = self.http.request(method, path, **kw)
        if r.status_code >= 400:
            raise error_from(r)
        return r.json()

    def health(self) -> dict:
        r = self.http.get("/healthz")
        return r.json()

    def models(self) -> list[dict]:
        return self._call("GET", "/v1/models")["data"]

    def chat(self, model: str, messages: list[dict], **params: Any) -> dict:
        """``POST /v1/chat/completions`` without streaming; ``params`` may hold ``c2c=...``."""
        return self._call("POST", "/v1/chat/completions", json={"model": model, "messages": messages, **params})

    def commit(self, commit_id: str) -> dict:
        """A commit: stream, version, parents, ``stale`` and ``stale_reason``, hop depth."""
        return self._call("GET", f"/v1/c2c/commits/{commit_id}")

    def invalidate(self, commit_id: str, reason: str) -> list[dict]:
        """Mark a commit and its dependents stale; the events it caused."""
        return self._call("POST", f"/v1/c2c/commits/{commit_id}/invalidate", json={"reason": reason})["events"]

    def advise(self, model: str, message_tokens: int, **kw: Any) -> dict:
        """The advisor's text-vs-cache prediction (needs a calibration on the server's machine)."""
        return self._call("POST", "/v1/c2c/advise", json={"model": model, "message_tokens": message_tokens, **kw})

    def events(self, after: str = "0", *, limit: int = 0, timeout_s: float = 0) -> Iterator[dict]:
        """Invalidation events of the caller's domain as they happen (``limit``/``timeout_s`` end the stream)."""
        params = {"after": after, "limit": limit, "timeout_s": timeout_s}
        with self.http.stream("GET", "/v1/c2c/events", params=params, timeout=None) as r:
            if r.status_code >= 400:
                r.read()
                raise error_from(r)
            for line in r.iter_lines():
                if line.startswith("data: "):
                    yield json.loads(line[6:])

    def close(self) -> None:
        self.http.close()

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
