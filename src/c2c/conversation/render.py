"""Chat messages as tokens, the same way every time, so that a session's cache is reused exactly.

A conversation is rendered as a run of :class:`Part` values::

    [prefix: BOS + the system turn] [attachments ...] [one turn per message ...] [generation prompt]

Each turn is rendered with the model's chat template exactly as it is written
mid-conversation (:meth:`Runtime.render_turn`) and tokenized on its own, so the
tokens of ``messages[:k]`` are always a prefix of those of ``messages[:k + 1]``:
a session that already holds the KV of the first ``k`` messages needs to prefill
only what follows. The shared prefix (what :func:`c2c.handoff.decide` compares
between sender and receiver) is BOS plus a leading system message, if any.

NOTE: a request without a system message gets no template default (Qwen's
"You are Qwen..." is not inserted): what the client sends is what the model reads.
"""

from __future__ import annotations

import bisect
import json
import os
from dataclasses import dataclass, replace
from typing import Any, Sequence

from c2c.artifact.prefix import prefix_token_ids
from c2c.conversation import Conversation, Part
from c2c.errors import ToolCallError
from c2c.runtime import placement
from c2c.runtime.protocol import Runtime
from c2c.runtime.protocol import Offsets
from c2c.conversation.tools import ToolCall

ROLES = ("system", "developer", "user", "assistant", "tool")


@dataclass(frozen=True, kw_only=True)
class Message:
    """One chat message; ``name`` (optional) is also the label of its span (see :meth:`Conversation.context`).

    An assistant message may carry ``tool_calls`` (its content then may be empty); a ``tool`` message answers
    the call ``tool_call_id``, and its span is labelled by ``name``, else by the called tool's name
    (``tool_name``), else ``tool``; it answers to its ``tool_call_id`` too (:attr:`aliases`).
    """

    role: str
    content: str
    name: str | None = None
    tool_calls: tuple[ToolCall, ...] = ()
    tool_call_id: str | None = None
    tool_name: str | None = None

    @property
    def label(self) -> str:
        return self.name or self.tool_name or self.role

    @property
    def aliases(self) -> tuple[str, ...]:
        """The other names its span answers to in ``publish.labels``: a tool result's ``tool_call_id``."""
        return (self.tool_call_id,) if self.tool_call_id and self.tool_call_id != self.label else ()

    @property
    def text(self) -> str:
        """What the message says, its calls included (a text handoff reads this)."""
        calls = "\n".join(json.dumps({"name": c.name, "arguments": json.loads(c.arguments)}, ensure_ascii=False)
                          for c in self.tool_calls)
        return "\n".join(x for x in (self.content, calls) if x)

    def to_dict(self) -> dict[str, Any]:
        """The message as a chat template reads it (a call's arguments parsed: :meth:`ToolCall.to_template`)."""
        d: dict[str, Any] = {"role": self.role, "content": self.content}
        if self.name:
            d["name"] = self.name
        if self.tool_calls:
            d["tool_calls"] = [c.to_template() for c in self.tool_calls]
            d["content"] = self.content or None
        if self.tool_call_id is not None:
            d["tool_call_id"] = self.tool_call_id
        return d


def split_system(messages: Sequence[Message]) -> tuple[Message | None, tuple[Message, ...]]:
    """The leading system (or developer) message, if any, and the rest."""
    if messages and messages[0].role in ("system", "developer"):
        return messages[0], tuple(messages[1:])
    return None, tuple(messages)


def prefix_ids(runtime: Runtime, system: Message | None) -> tuple[int, ...]:
    """BOS (if the model has one) and the system turn: what sender and receiver must share
    (:func:`c2c.artifact.prefix.prefix_token_ids`, as for every other caller)."""
    return prefix_token_ids(runtime, system.content if system is not None else None)


def turn(runtime: Runtime, m: Message) -> Part:
    role = "system" if m.role == "developer" else m.role
    return Part(label=m.label, token_ids=tuple(runtime.encode(runtime.render_turn(role, m.content))),
                text=f"{m.label}: {m.content}")


def render(runtime: Runtime, messages: Sequence[Message], *, tools: Sequence[dict] = (),
           attachments: Sequence[Part] = (), generation_prompt: bool = True) -> Conversation:
    """``messages`` (with ``attachments`` right after the shared prefix) as parts.

    With ``generation_prompt`` the last part is the assistant's opening (label ``"prompt"``),
    after which the reply is generated. A conversation with ``tools`` (OpenAI's entries), or with tool calls
    in it, is rendered by the model's template whole (:func:`render_whole`); any other, turn by turn.
    """
    if tools or any(m.tool_calls or m.tool_call_id is not None for m in messages):
        return render_whole(runtime, messages, tools=tools,
                            generation_prompt=generation_prompt).after_prefix(attachments)
    system, rest = split_system(messages)
    parts = [Part(label="prefix", token_ids=prefix_ids(runtime, system))]
    parts += [turn(runtime, m) for m in rest]
    if generation_prompt:
        parts.append(Part(label="prompt", token_ids=tuple(runtime.encode(runtime.generation_prompt())),
                          private=False))
    return Conversation(parts=tuple(parts)).after_prefix(attachments)


_PROBE = "\ue000"   # a private-use character: a user turn no template writes on its own


def render_whole(runtime: Runtime, messages: Sequence[Message], *, tools: Sequence[dict] = (),
                 generation_prompt: bool = True) -> Conversation:
    """``messages`` rendered by the model's own chat template as one conversation, ``tools`` given, as
    transformers' ``apply_chat_template(tools=...)`` and vLLM render it; cut into parts where each message ends.

    The tokens are always those of the whole rendering, tokenized once: a template may write a message
    differently once another follows it (Qwen2.5 merges consecutive tool results into one turn), so turn by
    turn would be wrong there. Where message ``k`` ends comes from rendering ``messages[:k]`` alone: its
    part runs to the last token the two renderings share. A message the next one changes (a tool result
    followed by another) therefore ends before the text that changes, which goes with the next part;
    a session's cache is reused up to the first token that differs (:mod:`c2c.conversation.reuse`), never past it.
    Without a system message the prefix is what the template writes before the first message (Qwen2.5
    writes its default system turn, and the tools in it).

    Raises:
        ToolCallError: the model has no chat template, or one that does not render ``tools`` (it cannot call
            them); ``param`` is ``tools``, or ``messages`` for a history of calls.
    """
    tl = list(tools) or None

    def chat(ms: list[dict], gp: bool = False) -> str | None:
        return runtime.render_chat(ms, gp, tools=tl)

    dicts = [m.to_dict() for m in messages]
    whole = chat(dicts, generation_prompt)
    what = "tools" if tools else "messages"
    if whole is None:
        raise ToolCallError(f"{_name(runtime)} has no chat template, so it cannot render tools or tool calls; "
                            "leave tools out, or serve a model whose template defines them", param=what)
    missing = [t["function"]["name"] for t in tools if t["function"]["name"] not in whole]
    if missing:
        raise ToolCallError(f"{_name(runtime)}'s chat template does not render tools (the catalogue it writes "
                            f"lacks {missing[0]!r}): it cannot call them. Leave tools out, or serve a model that "
                            "calls tools, such as Qwen2.5-Coder-0.5B-Instruct", param="tools")
    system, rest = split_system(messages)
    skip = 1 if system is not None else 0
    if system is not None:
        head = chat(dicts[:1]) or ""
    else:
        probe, own = chat([{"role": "user", "content": _PROBE}]) or "", runtime.render_turn("user", _PROBE)
        head = probe[:-len(own)] if own and probe.endswith(own) else ""
    ends = [_shared(head, whole)]
    for k in range(1, len(rest) + 1):
        ends.append(max(ends[-1], _shared(chat(dicts[:skip + k]) or "", whole)))
    ids, cuts = _cut(runtime, whole, ends)
    bos = tuple(runtime.bos_ids)
    if bos and tuple(ids[:len(bos)]) != bos:
        ids, cuts = list(bos) + ids, [c + len(bos) for c in cuts]
    parts = [Part(label="prefix", token_ids=tuple(ids[:cuts[0]]))]
    parts += [Part(label=m.label, token_ids=tuple(ids[cuts[k]:cuts[k + 1]]), text=f"{m.label}: {m.text}",
                   aliases=m.aliases) for k, m in enumerate(rest)]
    tail = tuple(ids[cuts[-1]:])
    if generation_prompt:
        parts.append(Part(label="prompt", token_ids=tail, private=False))
    elif tail:
        parts[-1] = replace(parts[-1], token_ids=parts[-1].token_ids + tail)
    return Conversation(parts=tuple(parts))


def _name(runtime: Runtime) -> str:
    return str(getattr(runtime, "name", "") or "this model")


def _shared(part: str, whole: str) -> int:
    """How many characters of ``part`` begin ``whole``."""
    return len(os.path.commonprefix([part, whole]))


def _cut(runtime: Runtime, whole: str, ends: Sequence[int]) -> tuple[list[int], list[int]]:
    """``whole``'s tokens, and for each character position in ``ends`` how many of them lie wholly before it
    (a token across it goes with what follows)."""
    if isinstance(runtime, Offsets):
        ids, offsets = runtime.encode_with_offsets(whole)
        stops = [b for _, b in offsets]   # non-decreasing
        return ids, [bisect.bisect_right(stops, c) for c in ends]
    ids = runtime.encode(whole)
    cuts = []
    for c in ends:
        n = len(os.path.commonprefix([runtime.encode(whole[:c]), ids]))
        cuts.append(max(n, cuts[-1] if cuts else 0))
    return ids, cuts


def text_turn(runtime: Runtime, label: str, text: str) -> Part:
    """A user turn holding ``text`` (how a text handoff is read)."""
    return Part(label=label, token_ids=tuple(runtime.encode(runtime.render_turn("user", text))), private=False,
                text=text)


@dataclass(frozen=True)
class Continuation:
    """A request whose messages continue a commit's conversation (:func:`continuation`)."""

    rendering: Conversation     # the request's own, the commit's K/V (if carried) on the messages it covers
    messages: int            # how many messages (parts after the prefix) the commit covers
    carried: bool            # False: prefilled as sent (the text path, or K/V the model cannot cut per message)


def continuation(own: Conversation, commit: Sequence[int], attached: Part | None) -> Continuation | None:
    """A request that continues a commit's conversation: its messages begin with exactly the commit's tokens.

    ``own`` is the request rendered without attachments, ``commit`` the commit's token ids (its shared
    prefix included) and ``attached`` its part on the cache path (``kv`` at the positions after the
    prefix), or None on the text path. Returns ``own`` with the commit's K/V laid on the messages it
    covers, each message its own slice (none on the text path, or where a sliding-window layer no
    longer holds a message's span: they are then prefilled as sent), and how many messages those are;
    None where the messages do not begin with the commit's tokens, ending on a message's boundary (the
    commit is then placed after the prefix as a block of its own).
    """
    P = len(own.prefix_ids)
    if len(commit) <= P or tuple(commit[:P]) != own.prefix_ids:
        return None
    parts, at, n = list(own.parts), P, 0
    for part in own.parts[1:-1]:   # never the generation prompt
        if at == len(commit):
            break
        end = at + len(part.token_ids)
        if end > len(commit) or tuple(commit[at:end]) != part.token_ids:
            return None
        at, n = end, n + 1
    if at != len(commit):
        return None
    kv = attached.kv if attached is not None else None
    laid = placement.lay(kv, [p.token_ids for p in own.parts[1:n + 1]]) \
        if kv is not None and tuple(kv.token_ids) == tuple(commit[P:]) else None
    if laid is None:   # text, K/V of other tokens (mapped), or a sliding-window layer lost a message's span
        return Continuation(rendering=own, messages=n, carried=False)
    for i, kv in enumerate(laid, start=1):
        parts[i] = replace(own.parts[i], kv=kv)   # (1, H, tokens of message i, D) per layer, at its own positions
    return Continuation(rendering=Conversation(parts=tuple(parts)), messages=n, carried=True)
