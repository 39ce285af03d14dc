"""One request shape for ``c2c serve`` and vLLM: ``extra_body={"c2c": {...}}``, answered in ``c2c``.

vLLM hands a connector only ``kv_transfer_params``, so its native shape is
``extra_body={"kv_transfer_params": {"c2c": {...}}}``, answered in ``kv_transfer_params.c2c``.
:class:`~c2c.vllm.api_middleware.C2CMiddleware` takes ``c2c serve``'s shape as well and
answers a request in the shape it came in. In ``c2c serve``'s shape:

- ``attach`` is a list of commit ids, of at most one here (vLLM loads one commit per
  request); ``mode`` is ``auto``, ``full`` or ``text`` (``slice`` is ``c2c serve``'s);
- ``publish`` takes ``stream`` and ``share``, and ``parents`` as the native shape does;
  ``labels`` (a labelled slice) is ``c2c serve``'s only;
- ``session`` is accepted and not used: vLLM reuses a conversation's prefix through its
  own prefix cache (``--enable-prefix-caching``), so the client sends the whole
  conversation each time, as it does to ``c2c serve``; ``timeout_s`` is refused (vLLM has
  no per-request deadline to give it to);
- the reply's ``c2c`` has ``c2c serve``'s fields: ``attach`` (a list of records, each with
  ``path``, ``used`` (``full`` or ``text``) and the commit's ``tokens`` the prompt holds, split
  into ``imported_tokens``, ``reused_tokens`` and ``prefilled_tokens``), ``attached``,
  ``publish``, ``cached_tokens``, ``imported_tokens``, ``reused_tokens``, ``prefilled_tokens``
  (those three of the whole prompt) and ``session`` (null).

One difference stays, and it is the engine's: vLLM loads a commit's K/V only where the
prompt **begins with** the commit's tokens (the attaching request continues the published
conversation), while ``c2c serve`` places an attached cache after the system prompt by
itself. A prompt that does not begin with the commit's tokens takes the text path in
``auto`` (the record's ``reason`` says so) and is refused in ``full``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from c2c.errors import ConfigError
from c2c.vllm import tickets
from c2c.vllm.commits import Request

SERVE, NATIVE = "c2c", "kv_transfer_params"
_SERVE_KEYS = {"attach", "mode", "publish", "session", "timeout_s"}
_USAGE = ('"c2c" takes {"attach": [ID], "mode": "auto"|"full", "publish": {"stream": S, "share": [DOMAINS]}, '
          '"session": NAME}')


@dataclass(frozen=True)
class Shape:
    """How one request asked: which shape (:data:`SERVE` or :data:`NATIVE`), and the ticket of a streamed reply."""

    name: str
    ask: Request
    ticket: str | None = None


def _from_serve(c: Any) -> dict[str, Any]:
    """``c2c serve``'s ``c2c`` object as ``kv_transfer_params.c2c``.

    Raises:
        ConfigError: a field vLLM cannot honour, or a wrong shape (named in the message).
    """
    if not isinstance(c, dict) or set(c) - _SERVE_KEYS:
        extra = sorted(set(c) - _SERVE_KEYS) if isinstance(c, dict) else []
        raise ConfigError(_USAGE + (f"; unknown: {', '.join(map(str, extra))[:200]}" if extra else ""))
    if "timeout_s" in c:
        raise ConfigError("c2c.timeout_s is c2c serve's only: vLLM has no per-request deadline; leave it out")
    out: dict[str, Any] = {}
    attach = c.get("attach")
    if isinstance(attach, list):
        if len(attach) > 1:
            raise ConfigError(f"vLLM attaches one commit per request; c2c.attach has {len(attach)} (c2c serve "
                              "takes up to 8)")
        attach = attach[0] if attach else None
    if attach is not None:
        out["attach"] = attach
    mode = c.get("mode", "auto")
    if mode == "slice":
        raise ConfigError("c2c.mode 'slice' is c2c serve's only; vLLM attaches whole commits: take 'auto', 'full' "
                          "or 'text'")
    out["mode"] = mode
    pub = c.get("publish")
    if isinstance(pub, dict):
        if pub.get("labels"):
            raise ConfigError("c2c.publish.labels (a labelled slice) is c2c serve's only; vLLM publishes the whole "
                              "conversation")
        pub = {k: v for k, v in pub.items() if k != "labels"}
    if pub is not None:
        out["publish"] = pub
    return out


def read(doc: dict[str, Any]) -> Shape | None:
    """Bring a request body to vLLM's native shape, in place; None when it carries no c2c fields.

    A streamed request gets a fresh ticket (a client's own is replaced; a whole reply's is
    removed: the connector makes one).

    Raises:
        ConfigError: both shapes at once, or a bad ``c2c`` field (named in the message); vLLM never sees it.
    """
    params = doc.get(NATIVE)
    native = isinstance(params, dict) and "c2c" in params
    if SERVE in doc:
        if native:
            raise ConfigError('send c2c\'s fields once: in "c2c" (as c2c serve takes them) or in '
                              'kv_transfer_params.c2c, not both')
        if params is not None and not isinstance(params, dict):
            raise ConfigError("kv_transfer_params must be an object")
        c = doc.pop(SERVE)
        if c is None:
            return None
        doc[NATIVE] = {**(params or {}), "c2c": _from_serve(c)}
        name = SERVE
    elif native:
        name = NATIVE
    else:
        return None
    c2c = doc[NATIVE]["c2c"]
    if isinstance(c2c, dict):
        c2c = doc[NATIVE]["c2c"] = {k: v for k, v in c2c.items() if k != "ticket"}
        if doc.get("stream") is True:
            c2c["ticket"] = tickets.new_ticket()
    try:
        ask = Request.parse(doc[NATIVE])  # ConfigError: refused here, before vLLM sees it
    except ConfigError as e:
        if name == NATIVE:
            raise
        raise ConfigError(str(e).replace("kv_transfer_params.c2c.", "c2c.")) from None  # the field as sent
    return Shape(name=name, ask=ask, ticket=ask.ticket)


def reply(out: dict[str, Any], shape: Shape, usage: dict[str, Any] | None = None) -> tuple[str, dict[str, Any]]:
    """(field, value) a reply carries: ``out`` is what the connector wrote into ``kv_transfer_params.c2c``
    (its publish settled). ``usage`` (the reply's, when it has one) fills the token counts of a request that
    attached nothing."""
    if shape.name == NATIVE:
        return NATIVE, {"c2c": out}
    rec = out.get("attach")
    res: dict[str, Any] = {"session": None, "attach": [rec] if isinstance(rec, dict) else [],
                           "attached": [rec["commit"]] if isinstance(rec, dict) and rec.get("path") == "cache"
                           else [], "publish": out.get("publish")}
    if "imported_tokens" in out:  # the connector's counts of the whole prompt (an attach's record has its own)
        res.update(imported_tokens=out["imported_tokens"], reused_tokens=out["reused_tokens"],
                   prefilled_tokens=out["prefilled_tokens"])
        res["cached_tokens"] = res["imported_tokens"] + res["reused_tokens"]
    elif isinstance(usage, dict):
        cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0
        res.update(cached_tokens=cached, imported_tokens=0, reused_tokens=cached,
                   prefilled_tokens=max(0, int(usage.get("prompt_tokens") or 0) - cached))
    if "error" in out:
        res["error"] = out["error"]
    return SERVE, res
