"""The HTTP schema: pydantic models mirroring OpenAI's chat completions, and the ``c2c`` extension.

Extensions ride in one extra field, ``c2c`` (the openai client sends it with
``extra_body={"c2c": {...}}``)::

    {"session": "analyst-1",                       # keep this conversation's KV cache between requests
     "publish": {"stream": "analyst", "labels": ["evidence"],    # commit the cache (or a slice) after the reply
                 "share": ["ops"]},                # ... and let trust domain "ops" attach it too
     "attach": ["<commit id>", ...], "mode": "auto",             # continue from commits: auto|full|slice|text
     "edit": {"drop": [2, 4], "reposition": true, "repair": "none"},  # drop messages from the session's cache
     "timeout_s": 30}                              # a tighter deadline than the server's

Responses carry the same field with what was done: the session's state, cached,
reused, imported and prefilled tokens, one record per attached commit (the path
used, the reason, every check of the :class:`~c2c.handoff.Decision`, bytes,
timings), the published commit, and timings. A non-streamed response repeats the
essentials as headers (:func:`c2c_headers`: ``x-c2c-commit``, ``x-c2c-handoffs``,
``x-c2c-cached-tokens``, ``x-c2c-session-state``, ``x-c2c-edit``) for clients that drop unknown fields.

Sampling follows OpenAI's defaults: without ``temperature`` it is 1.0 (sampled);
``temperature: 0`` is greedy and deterministic.

NOTE: OpenAI fields this server does not know are ignored (clients such as
LangChain send a few); those it cannot honour (the legacy ``functions``/``function_call``,
``n > 1`` with a session) are refused, the error's ``param`` naming the field. ``tools``,
``tool_choice`` and ``parallel_tool_calls`` (:mod:`c2c.conversation.tools`), ``logprobs``/``top_logprobs``
(up to 20), ``n`` (up to 8) and ``response_format`` ``json_object``/``json_schema`` (constrained
decoding) are served. Inside
``c2c`` every unknown key is refused.

Every request body is checked whole before its fields (:class:`RequestBody`): each
string in it, keys and ignored fields included, must encode as UTF-8 (JSON's
``"\\ud800"`` decodes to a lone surrogate, which a tokenizer or a database cannot
take). Every number is bounded, and NaN and infinities are refused, so that no
value overflows further down.
"""

from __future__ import annotations

import json
import re
from typing import Any, Literal, Sequence

from pydantic import BaseModel, ConfigDict, Field, model_validator
from pydantic_core import PydanticCustomError

from c2c.canon import non_utf8_at
from c2c.errors import ConfigError
from c2c.conversation.editing import EditSpec
from c2c.conversation.decode import MAX_TOP_LOGPROBS
from c2c.conversation.render import Message
from c2c.conversation.tools import Tool, ToolCall, Tools
from c2c.serve.service import MAX_N, ChatRequest, Completion, JsonFormat, PublishSpec, Reply, Started

_NAME = r"^[A-Za-z0-9][A-Za-z0-9_.:@+=-]*$"
MAX_TOKENS = 1 << 24          # max_tokens, max_completion_tokens: far past any context, so a ContextLengthError decides
MAX_TIMEOUT_S = 24 * 3600.0   # c2c.timeout_s, the events stream's timeout_s
_CURSOR = re.compile(r"[0-9]{1,20}(-[0-9]{1,20})?")  # what either store issues: sqlite "17", Redis "1700000000000-0"


def event_cursor(value: str) -> str:
    """An events cursor (``?after=`` or ``Last-Event-ID``) shaped like one a store issues, else ConfigError.

    The store checks its own range too (:meth:`c2c.store.interface.Lineage.events`).
    """
    if not _CURSOR.fullmatch(value):
        raise ConfigError(f"event cursor {value[:64]!r} is not one this server issued; give the id of the "
                          "last event received, or 0 for the start")
    return value


class InModel(BaseModel):
    """Any part of a request: NaN and infinities are refused."""

    model_config = ConfigDict(allow_inf_nan=False)


class RequestBody(InModel):
    """A whole request body: every string in it must encode as UTF-8 (checked once, before the fields)."""

    @model_validator(mode="before")
    @classmethod
    def _utf8(cls, data: Any) -> Any:
        where = non_utf8_at(data)
        if where is not None:
            raise PydanticCustomError("invalid_utf8", "{param} is not valid UTF-8 (a lone surrogate such as "
                                      "\\ud800); send text that encodes as UTF-8", {"param": where or "body"})
        return data


def _json_format(rf: dict[str, Any] | None) -> JsonFormat | None:
    """OpenAI's ``response_format`` as a :class:`JsonFormat` (None for ``text`` or none); a malformed one is refused
    naming the field. Whether the schema compiles is the structured-output engine's to say, at submit."""
    kind = (rf or {}).get("type", "text")
    if kind == "text":
        return None
    if kind == "json_object":
        return JsonFormat()
    if kind == "json_schema":
        spec = rf.get("json_schema")
        if not isinstance(spec, dict) or not isinstance(spec.get("schema", {}), dict):
            raise _unsupported("response_format.json_schema", "response_format json_schema takes "
                               "json_schema: {name, schema: a JSON Schema object, strict}")
        return JsonFormat(schema=spec.get("schema", {}))
    raise _unsupported("response_format.type", f"response_format type {str(kind)[:40]!r} is not one of 'text', "
                                               "'json_object' or 'json_schema'")


def _unsupported(param: str, message: str) -> PydanticCustomError:
    """A refusal of a field this server does not serve, naming the field as the error's ``param``."""
    return PydanticCustomError("unsupported", message, {"param": param})  # (no braces in message: a template)


class TextPart(InModel):
    model_config = ConfigDict(extra="ignore")
    type: Literal["text"]
    text: str


class FunctionCallIn(InModel):
    model_config = ConfigDict(extra="ignore")
    name: str = Field(min_length=1, max_length=64)
    arguments: str = Field(max_length=1 << 20, description="the arguments object, as JSON text")


class ToolCallIn(InModel):
    model_config = ConfigDict(extra="ignore")
    id: str = Field(min_length=1, max_length=256)
    type: Literal["function"] = "function"
    function: FunctionCallIn

    def to_call(self) -> ToolCall:
        return ToolCall(id=self.id, name=self.function.name, arguments=self.function.arguments)


class ChatMessageIn(InModel):
    model_config = ConfigDict(extra="ignore")
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[TextPart] | None = None
    name: str | None = Field(default=None, min_length=1, max_length=64, pattern=_NAME,
                             description="also the label of the message's span, for publish labels")
    tool_calls: list[ToolCallIn] | None = Field(default=None, max_length=128)
    tool_call_id: str | None = Field(default=None, min_length=1, max_length=256)

    @model_validator(mode="after")
    def _calls(self) -> "ChatMessageIn":
        if self.tool_calls and self.role != "assistant":
            raise _unsupported("tool_calls", "only an assistant message carries tool_calls")
        for j, c in enumerate(self.tool_calls or ()):
            try:
                args = json.loads(c.function.arguments)
            except ValueError:
                args = None
            if not isinstance(args, dict):
                raise _unsupported(f"tool_calls.{j}.function.arguments", "a tool call's arguments must be the JSON "
                                   f"text of an object; call {c.id[:64]!r} has {c.function.arguments[:80]!r}")
        if self.tool_call_id is not None and self.role != "tool":
            raise _unsupported("tool_call_id", "only a tool message carries tool_call_id")
        return self

    def to_message(self, tool_names: dict[str, str]) -> Message:
        """The message; ``tool_names`` maps the conversation's call ids to the tools they called (a tool
        result's span is labelled by its tool's name)."""
        c = self.content
        text = "" if c is None else c if isinstance(c, str) else "".join(p.text for p in c)
        return Message(role=self.role, content=text, name=self.name,
                       tool_calls=tuple(t.to_call() for t in self.tool_calls or ()), tool_call_id=self.tool_call_id,
                       tool_name=tool_names.get(self.tool_call_id) if self.tool_call_id is not None else None)


class FunctionIn(InModel):
    model_config = ConfigDict(extra="ignore")
    name: str = Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_-]+$")
    description: str = Field(default="", max_length=64 * 1024)
    parameters: dict[str, Any] | None = Field(default=None, description="a JSON Schema of the arguments object")


class ToolIn(InModel):
    model_config = ConfigDict(extra="ignore")
    type: Literal["function"]
    function: FunctionIn

    def to_tool(self) -> Tool:
        f = self.function
        return Tool(name=f.name, description=f.description, parameters=f.parameters)


def _tool_choice(choice: Any, tools: Sequence[ToolIn]) -> tuple[str, str | None]:
    """OpenAI's ``tool_choice`` as ``(mode, name)``; refused naming the field when it asks for what cannot be."""
    if choice is None:
        return ("auto" if tools else "none"), None
    if choice in ("auto", "none", "required"):
        if choice == "required" and not tools:
            raise _unsupported("tool_choice", "tool_choice 'required' needs tools")
        return choice, None
    if isinstance(choice, dict) and choice.get("type") == "function" and isinstance(choice.get("function"), dict):
        name = choice["function"].get("name")
        if name not in {t.function.name for t in tools}:
            raise _unsupported("tool_choice.function.name", f"tool_choice names {str(name)[:64]!r}, which is not "
                               "one of the request's tools")
        return "function", name
    raise _unsupported("tool_choice", "tool_choice is 'auto', 'none', 'required' or "
                                      "{'type': 'function', 'function': {'name': ...}}")


class PublishIn(InModel):
    model_config = ConfigDict(extra="forbid")
    stream: str | None = Field(default=None, max_length=200, description="default: the caller's agent name")
    labels: list[str] = Field(default_factory=list, max_length=16,
                              description="publish only the slice covering these spans; empty: the whole cache")
    share: list[str] = Field(default_factory=list, max_length=16,
                             description="other trust domains that may attach this commit (as text or cache)")


class EditIn(InModel):
    """``c2c.edit``: drop messages from the session's cache (:mod:`c2c.conversation.editing`)."""

    model_config = ConfigDict(extra="forbid")
    drop: list[int] = Field(default_factory=list, max_length=4096,
                            description="zero-based indices into messages, cumulative: every message dropped so far")
    reposition: bool = Field(default=True, description="close the gaps (re-rotate what follows); false leaves "
                                                       "them open until a later request closes them")
    repair: str = Field(default="none", max_length=32,
                        description="none | first:K (recompute the first K tokens after each gap) | ratio:R "
                                    "(the share R, 0..1, that deviates most)")


class C2CIn(InModel):
    model_config = ConfigDict(extra="forbid")
    session: str | None = Field(default=None, min_length=1, max_length=128, pattern=_NAME)
    publish: PublishIn | None = None
    attach: list[str] = Field(default_factory=list, max_length=8, description="commit ids (64 hex)")
    mode: Literal["auto", "full", "slice", "text"] = "auto"
    timeout_s: float | None = Field(default=None, gt=0, le=MAX_TIMEOUT_S)
    edit: EditIn | None = None


class StreamOptionsIn(InModel):
    model_config = ConfigDict(extra="ignore")
    include_usage: bool = False


class ChatCompletionIn(RequestBody):
    """``POST /v1/chat/completions``: OpenAI's fields this server honours, and ``c2c``."""

    model_config = ConfigDict(extra="ignore")
    model: str = Field(min_length=1, max_length=256)
    messages: list[ChatMessageIn] = Field(min_length=1, max_length=4096)
    max_tokens: int | None = Field(default=None, ge=1, le=MAX_TOKENS)
    max_completion_tokens: int | None = Field(default=None, ge=1, le=MAX_TOKENS)
    temperature: float | None = Field(default=None, ge=0, le=2, description="default 1.0 (OpenAI's); 0 is greedy")
    top_p: float | None = Field(default=None, gt=0, le=1)
    seed: int | None = Field(default=None, ge=-(2**63), le=2**63 - 1)
    stop: str | list[str] | None = None
    logit_bias: dict[str, float] | None = Field(default=None, max_length=1024,
                                                description="token id -> bias in [-100, 100]")
    stream: bool = False
    stream_options: StreamOptionsIn | None = None
    n: int | None = Field(default=None, ge=1, le=MAX_N,
                          description=f"choices, up to {MAX_N}: the prompt is prefilled once, its K/V forked for each")
    tools: list[ToolIn] | None = Field(default=None, max_length=128)
    tool_choice: Any = None
    parallel_tool_calls: bool = True
    logprobs: bool | None = None
    top_logprobs: int | None = None
    response_format: dict[str, Any] | None = None
    functions: list[Any] | None = None     # OpenAI's legacy form of tools: refused by name, never ignored
    function_call: Any = None
    c2c: C2CIn | None = None

    @model_validator(mode="after")
    def _supported(self) -> "ChatCompletionIn":
        for name in ("functions", "function_call"):
            if getattr(self, name):
                raise _unsupported(name, f"the legacy field {name} is not served: send it as tools (and "
                                   "tool_choice), as OpenAI's current API does")
        _tool_choice(self.tool_choice, self.tools or ())
        if len({t.function.name for t in self.tools or ()}) != len(self.tools or ()):
            raise _unsupported("tools", "two tools have one name")
        calls: set[str] = set()
        for i, m in enumerate(self.messages):
            calls.update(c.id for c in m.tool_calls or ())
            if m.tool_call_id is not None and m.tool_call_id not in calls:
                raise _unsupported(f"messages.{i}.tool_call_id", f"message {i} answers tool call "
                                   f"{m.tool_call_id[:64]!r}, which no earlier assistant message made")
        if self.top_logprobs is not None and not self.logprobs:
            raise _unsupported("top_logprobs", "top_logprobs needs logprobs: true")
        if self.top_logprobs is not None and not 0 <= self.top_logprobs <= MAX_TOP_LOGPROBS:
            raise _unsupported("top_logprobs", f"top_logprobs must lie in [0, {MAX_TOP_LOGPROBS}]")
        c = self.c2c
        if (self.n or 1) > 1 and c is not None and (c.session or c.publish or c.edit):
            raise _unsupported("n", "n > 1 gives several replies, and a session (or its publish or edit) continues "
                                    "one: send n: 1 with c2c.session, publish or edit")
        _json_format(self.response_format)   # refused here, by name, when malformed
        stops = [self.stop] if isinstance(self.stop, str) else (self.stop or [])
        if len(stops) > 4 or not all(stops):
            raise ValueError("stop: give at most 4 non-empty strings")
        for k, v in (self.logit_bias or {}).items():
            if not (k.isascii() and k.isdigit() and len(k) <= 10) or not -100 <= v <= 100:
                raise ValueError("logit_bias: map token ids (as strings) to biases in [-100, 100]")
        return self

    def to_request(self) -> ChatRequest:
        c = self.c2c or C2CIn()
        names = {t.id: t.function.name for m in self.messages for t in m.tool_calls or ()}
        mode, name = _tool_choice(self.tool_choice, self.tools or ())
        tools = Tools(tools=tuple(t.to_tool() for t in self.tools), choice=mode, name=name,
                      parallel=self.parallel_tool_calls) if self.tools else None
        return ChatRequest(
            model=self.model, messages=tuple(m.to_message(names) for m in self.messages), tools=tools,
            max_tokens=self.max_completion_tokens or self.max_tokens,
            temperature=1.0 if self.temperature is None else self.temperature,
            top_p=1.0 if self.top_p is None else self.top_p, seed=self.seed,
            stop=tuple([self.stop] if isinstance(self.stop, str) else (self.stop or [])),
            logit_bias=tuple((int(k), float(v)) for k, v in (self.logit_bias or {}).items()),
            logprobs=(self.top_logprobs or 0) if self.logprobs else None, n=self.n or 1,
            json=_json_format(self.response_format),
            session=c.session, attach=tuple(c.attach), mode=c.mode, timeout_s=c.timeout_s, stream=self.stream,
            edit=None if c.edit is None else EditSpec(drop=tuple(c.edit.drop), reposition=c.edit.reposition,
                                                      repair=c.edit.repair),
            publish=None if c.publish is None else PublishSpec(stream=c.publish.stream, labels=tuple(c.publish.labels),
                                                              share=tuple(c.publish.share)))


class InvalidateIn(RequestBody):
    model_config = ConfigDict(extra="forbid")
    reason: str = Field(min_length=1, max_length=1000)


class AdviseIn(RequestBody):
    """``POST /v1/c2c/advise``: the inputs of :func:`c2c.advise.advise` for one hop."""

    model_config = ConfigDict(extra="forbid")
    model: str = Field(min_length=1, max_length=256)
    message_tokens: int = Field(ge=1, le=1 << 20)
    context_tokens: int = Field(default=0, ge=0, le=1 << 24)
    hops: int = Field(default=1, ge=1, le=1000)
    bandwidth_gbps: float | None = Field(default=None, gt=0, le=1e6)
    cross_domain: bool = False
    same_model: bool = True
    from_model: str | None = Field(default=None, min_length=1, max_length=256,
                                   description="the served model whose cache the hop carries (instead of "
                                               "same_model): a map the server holds from it to model is offered")
    fuser_available: bool = False

    @model_validator(mode="after")
    def _one_sender(self) -> "AdviseIn":
        if self.from_model is not None and "same_model" in self.model_fields_set:
            raise ValueError("give from_model (the sender's served model) or same_model, not both")
        return self


# ---------------------------------------------------------------- responses
class PromptTokensDetails(BaseModel):
    cached_tokens: int


class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    prompt_tokens_details: PromptTokensDetails


class AssistantMessage(BaseModel):
    role: Literal["assistant"] = "assistant"
    content: str | None = Field(description="null when the reply is only tool calls")
    tool_calls: list[dict[str, Any]] | None = Field(default=None, description='[{"id", "type": "function", '
                                                    '"function": {"name", "arguments": JSON text}}, ...]')


class Choice(BaseModel):
    index: int
    message: AssistantMessage
    finish_reason: str
    logprobs: dict[str, Any] | None = Field(default=None, description='{"content": [{"token", "logprob", "bytes", '
                                                                      '"top_logprobs"}, ...]} when asked for')


class ChatCompletionOut(BaseModel):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int
    model: str
    choices: list[Choice]
    usage: Usage
    c2c: dict[str, Any] = Field(default_factory=dict)


class ErrorDetail(BaseModel):
    """See :mod:`c2c.serve.http_errors`."""

    message: str
    type: str = Field(description="OpenAI's vocabulary: invalid_request_error, authentication_error, "
                                  "permission_error, not_found_error, rate_limit_error, server_error")
    code: str = Field(description="c2c's stable reason, e.g. stale_commit, wrong_domain, json_invalid")
    param: str | None = None
    c2c_error: str | None = Field(default=None, description="the c2c.errors class raised, if any")


class ErrorOut(BaseModel):
    error: ErrorDetail


def usage(c: Completion) -> dict[str, Any]:
    return {"prompt_tokens": c.prompt_tokens, "completion_tokens": c.completion_tokens,
            "total_tokens": c.prompt_tokens + c.completion_tokens,
            "prompt_tokens_details": {"cached_tokens": c.cached_tokens}, **c.usage_extra}


def completion_body(c: Completion) -> dict[str, Any]:
    return {"id": c.id, "object": "chat.completion", "created": c.created, "model": c.model,
            "choices": [{"index": i, "message": message(r), "finish_reason": r.finish_reason,
                         "logprobs": None if r.logprobs is None else {"content": list(r.logprobs)}}
                        for i, r in enumerate(c.replies)],
            "usage": usage(c), "c2c": c.c2c}


def message(r: Reply) -> dict[str, Any]:
    """A reply as OpenAI's assistant message: ``content`` null when it is only tool calls."""
    if not r.tool_calls:
        return {"role": "assistant", "content": r.text}
    return {"role": "assistant", "content": r.text or None, "tool_calls": [c.to_dict() for c in r.tool_calls]}


def c2c_headers(c: Completion) -> dict[str, str]:
    """The ``c2c`` field's essentials as response headers, for clients that drop unknown fields
    (e.g. LangChain's ``ChatOpenAI(include_response_headers=True)``)."""
    h = {"x-c2c-cached-tokens": str(c.cached_tokens)}
    f = c.c2c
    if f.get("session"):
        h["x-c2c-session-state"] = f["session"]["state"]
    if f.get("publish"):
        h["x-c2c-commit"] = f["publish"]["commit"]
    if f.get("edit"):
        e = f["edit"]  # what the session's cache edit did (c2c.conversation.editing)
        h["x-c2c-edit"] = (f"dropped={e['dropped_tokens']},repositioned={e['repositioned_tokens']},"
                           f"recomputed={e['recomputed_tokens']},exact={str(e['exact']).lower()}")
    if f.get("attach"):
        h["x-c2c-handoffs"] = ",".join(  # COMMIT:full|slice|text, or COMMIT:mapped (another model's, mapped)
            f"{a['commit'][:12]}:{'mapped' if a['path'] == 'mapped' else a['used']}" for a in f["attach"])
    return h


def chunk_body(s: Started, *, delta: dict[str, Any] | None = None, finish_reason: str | None = None,
               extra: dict[str, Any] | None = None, choices: bool = True, index: int = 0,
               logprobs: Sequence[dict] | None = None) -> dict[str, Any]:
    body = {"id": s.id, "object": "chat.completion.chunk", "created": s.created, "model": s.model,
            "choices": [{"index": index, "delta": delta or {}, "finish_reason": finish_reason,
                         "logprobs": None if logprobs is None else {"content": list(logprobs)}}]
            if choices else []}
    body.update(extra or {})
    return body
