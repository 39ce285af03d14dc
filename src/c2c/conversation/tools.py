"""Tool calling: the request's tools, how a reply is read as calls, and the grammar that forces one.

OpenAI's ``tools`` (type ``function``), ``tool_choice`` and ``parallel_tool_calls`` become one
:class:`Tools`. The model's own chat template renders the catalogue (:mod:`c2c.conversation.render`),
and the reply is read back as calls by :meth:`Tools.parse`, from what the zoo's models actually
write:

- Qwen2.5's hermes form, as its template asks: ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``,
  any number of them, after optional text;
- the bare or fenced JSON that Qwen2.5-Coder writes instead (``{"name": ..., "arguments": ...}``, or
  ```` ```json ... ``` ````, one object, several, or a list): only a reply that is nothing else.

A call must name one of the request's tools and carry an object of arguments; a reply that does not
parse as calls is returned as content, as vLLM does, never as an error. ``tool_choice: required`` and
a named function are guaranteed rather than hoped for: the reply is constrained to the calls' JSON
(:meth:`Tools.forced_schema`), each tool's ``parameters`` included. With ``response_format`` and
``tool_choice: auto``, the reply is constrained to either a call or the format's JSON: never neither.
"""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass
from typing import Any, Sequence

_HERMES = "<tool_call>"
_HERMES_END = "</tool_call>"
_FENCE = re.compile(r"```[A-Za-z0-9_-]*[ \t]*\n?(.*?)```", re.S)
_NOTHING = {"type": "object", "properties": {}}


def new_call_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"


@dataclass(frozen=True, kw_only=True)
class Tool:
    """One ``tools`` entry of type ``function``; ``parameters`` is a JSON Schema of its arguments object."""

    name: str
    description: str = ""
    parameters: dict[str, Any] | None = None

    def to_dict(self) -> dict[str, Any]:
        """OpenAI's entry, as the chat template reads it."""
        fn: dict[str, Any] = {"name": self.name}
        if self.description:
            fn["description"] = self.description
        fn["parameters"] = self.parameters if self.parameters is not None else _NOTHING
        return {"type": "function", "function": fn}

    def call_schema(self) -> dict[str, Any]:
        """The JSON Schema of one call of this tool: ``{"name": <this name>, "arguments": <parameters>}``."""
        return {"type": "object", "properties": {"name": {"const": self.name},
                                                 "arguments": self.parameters or _NOTHING},
                "required": ["name", "arguments"], "additionalProperties": False}


@dataclass(frozen=True, kw_only=True)
class ToolCall:
    """One call: ``arguments`` is the JSON text of an object, as OpenAI carries it."""

    id: str
    name: str
    arguments: str

    def to_dict(self) -> dict[str, Any]:
        """OpenAI's ``tool_calls`` entry."""
        return {"id": self.id, "type": "function", "function": {"name": self.name, "arguments": self.arguments}}

    def to_template(self) -> dict[str, Any]:
        """The entry a chat template reads: ``arguments`` parsed, so that the template does not encode them twice
        (as vLLM renders history)."""
        return {"id": self.id, "type": "function",
                "function": {"name": self.name, "arguments": json.loads(self.arguments)}}


@dataclass(frozen=True, kw_only=True)
class Tools:
    """A request's tools and how it wants them used.

    ``choice``: ``auto`` (the model decides), ``none`` (no call; the catalogue is still rendered,
    as vLLM renders it), ``required`` (at least one call) or ``function`` (a call of ``name``).
    ``parallel``: several calls may come in one reply.
    """

    tools: tuple[Tool, ...]
    choice: str = "auto"
    name: str | None = None
    parallel: bool = True

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(t.name for t in self.tools)

    @property
    def calls(self) -> bool:
        """Whether a reply may be a call (``choice`` is not ``none``)."""
        return self.choice != "none" and bool(self.tools)

    @property
    def forced(self) -> bool:
        """Whether every reply is a call (``required`` or a named function)."""
        return self.choice in ("required", "function")

    def entries(self) -> list[dict[str, Any]]:
        return [t.to_dict() for t in self.tools]

    def forced_schema(self) -> dict[str, Any]:
        """The JSON Schema a forced reply is constrained to: a call of the named function; or, for ``required``,
        a list of one or more calls (one call when ``parallel`` is false) of any of the tools."""
        if self.choice == "function":
            return next(t.call_schema() for t in self.tools if t.name == self.name)
        one = {"anyOf": [t.call_schema() for t in self.tools]} if len(self.tools) > 1 else self.tools[0].call_schema()
        return {"type": "array", "items": one, "minItems": 1} if self.parallel else one

    def either_schema(self, answer: dict[str, Any] | None) -> dict[str, Any]:
        """``tools`` with ``response_format`` in ``auto``: a call of one of the tools, or JSON of the format
        (``answer``; None: any object, ``json_object``)."""
        return {"anyOf": [t.call_schema() for t in self.tools] + [answer or {"type": "object"}]}

    def parse(self, text: str) -> tuple[str | None, tuple[ToolCall, ...]]:
        """``text`` read as ``(content, calls)``: the calls it makes (none when it makes none, or when what looks
        like a call is malformed or names no given tool: then all of it is content)."""
        if not self.calls:
            return text, ()
        at = text.find(_HERMES)
        if at >= 0:
            bodies, rest = [], text[at:]
            while rest.startswith(_HERMES):
                end = rest.find(_HERMES_END)
                body, rest = (rest[len(_HERMES):], "") if end < 0 else (rest[len(_HERMES):end],
                                                                      rest[end + len(_HERMES_END):].lstrip())
                bodies.append(body)
            calls = self._calls(bodies) if not rest.strip() else None
            return (text, ()) if calls is None else (text[:at].strip() or None, calls)
        s = text.strip()
        fences = _FENCE.findall(s)
        if fences and not _FENCE.sub("", s).strip():
            bodies = fences
        elif s.startswith(("{", "[")):
            bodies = [s]
        else:
            return text, ()
        calls = self._calls(bodies)
        return (text, ()) if calls is None else (None, calls)

    def _calls(self, bodies: Sequence[str]) -> tuple[ToolCall, ...] | None:
        """The calls of JSON ``bodies`` (each one or more values: an object, or a list of them), or None when
        any of it is not a call of a given tool."""
        out: list[ToolCall] = []
        decoder = json.JSONDecoder()
        for body in bodies:
            at, body = 0, body.strip()
            while at < len(body):
                try:
                    value, at = decoder.raw_decode(body, at)
                except ValueError:
                    return None
                for v in value if isinstance(value, list) else [value]:
                    call = self._call(v)
                    if call is None:
                        return None
                    out.append(call)
                while at < len(body) and body[at] in " \t\r\n,":
                    at += 1
        if not out:
            return None
        return tuple(out) if self.parallel else tuple(out[:1])

    def _call(self, v: Any) -> ToolCall | None:
        if not isinstance(v, dict) or v.get("name") not in self.names:
            return None
        if self.choice == "function" and v["name"] != self.name:
            return None
        args = v.get("arguments", v.get("parameters", {}))
        if isinstance(args, str):
            try:
                args = json.loads(args)
            except ValueError:
                return None
        if not isinstance(args, dict):
            return None
        return ToolCall(id=new_call_id(), name=v["name"], arguments=json.dumps(args, ensure_ascii=False))


def held_back(text: str) -> int:
    """How many characters at the end of streamed ``text`` to hold back: the start of a possible ``<tool_call>``
    tag; all of it once a call may have begun (a call's JSON or fence at the start, or a ``<tool_call>`` tag)."""
    s = text.lstrip()
    if s[:1] in ("{", "[", "`") or _HERMES in text:
        return len(text)
    for i in range(max(len(text) - len(_HERMES) + 1, 0), len(text)):
        if _HERMES.startswith(text[i:]):
            return len(text) - i
    return 0
