"""Chat messages as tokens, the same way every time, so that a session's cache is reused exactly.

A conversation is rendered as a run of :class:`Part` values::

    [prefix: BOS + the system turn] [attachments ...] [one turn per message ...] [generation prompt]

The tokens are always those of the model's own chat template over the whole conversation. Where the
template is *prefix-stable* (:func:`template_stability`, checked once per model: rendering message by message
gives exactly the whole rendering's tokens), each turn is rendered as the template writes it mid-conversation
(:meth:`Runtime.render_turn`) and tokenized on its own, so the tokens of ``messages[:k]`` are a prefix of those
of ``messages[:k + 1]``: a session that already holds the KV of the first ``k`` messages prefills only what
follows. Where it is not, every conversation is rendered whole (:func:`render_whole`) and cut where its
messages end, never into other tokens than the template's. The shared prefix (what :func:`c2c.handoff.decide`
compares between sender and receiver) is BOS plus a leading system message, if any.

NOTE: a request without a system message gets no template default (Qwen's
"You are Qwen..." is not inserted): what the client sends is what the model reads.
"""

from __future__ import annotations

import bisect
import os
import threading
import weakref
from dataclasses import dataclass, replace
from typing import Any, Sequence

from c2c.artifact.prefix import prefix_token_ids
from c2c.conversation import Conversation, Message, Part
from c2c.errors import ToolCallError
from c2c.runtime import placement
from c2c.runtime.protocol import Runtime
from c2c.runtime.protocol import Offsets

ROLES = ("system", "developer", "user", "assistant", "tool")
__all__ = ["Message", "render", "render_whole", "template_stability", "continuation"]


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
                text=f"{m.label}: {m.content}", private=m.private, message=m)


def render(runtime: Runtime, messages: Sequence[Message], *, tools: Sequence[dict] = (),
           attachments: Sequence[Part] = (), generation_prompt: bool = True) -> Conversation:
    """``messages`` (with ``attachments`` right after the shared prefix) as parts.

    With ``generation_prompt`` the last part is the assistant's opening (label ``"prompt"``),
    after which the reply is generated. A conversation with ``tools`` (OpenAI's entries), or with tool calls
    in it, or any conversation on a model whose template is not prefix-stable (:func:`template_stability`),
    is rendered by the model's template whole (:func:`render_whole`); any other, turn by turn (the same tokens).
    """
    if tools or any(m.tool_calls or m.tool_call_id is not None for m in messages) or \
            not template_stability(runtime).stable:
        return render_whole(runtime, messages, tools=tools,
                            generation_prompt=generation_prompt).after_prefix(attachments)
    return _by_turns(runtime, messages, generation_prompt).after_prefix(attachments)


def _by_turns(runtime: Runtime, messages: Sequence[Message], generation_prompt: bool) -> Conversation:
    """``messages`` turn by turn: the prefix, each message as the template writes it mid-conversation, and
    the generation prompt (labelled ``"prompt"``)."""
    system, rest = split_system(messages)
    parts = [Part(label="prefix", token_ids=prefix_ids(runtime, system), message=system)]
    parts += [turn(runtime, m) for m in rest]
    if generation_prompt:
        parts.append(Part(label="prompt", token_ids=tuple(runtime.encode(runtime.generation_prompt())),
                          private=False))
    return Conversation(parts=tuple(parts))


_PROBE = "\ue000"   # a private-use character: a user turn no template writes on its own


# The conversations a template is checked on (:func:`template_stability`): a system turn or none, consecutive
# user messages, long turns, unicode and whitespace (the shapes a template most often writes differently once
# another message follows).
STABILITY_PROBES: dict[str, tuple[tuple[str, str], ...]] = {
    "system and turns": (("system", "Be brief."), ("user", "Hi"), ("assistant", "Hello!"), ("user", "And?")),
    "consecutive users": (("system", "S"), ("user", "a"), ("user", "b"), ("assistant", "c"), ("user", "d")),
    "long turns": (("system", "You read logs. " * 40), ("user", "line " * 300), ("assistant", "ok " * 200),
                   ("user", "next")),
    "unicode": (("system", "S"), ("user", "h\u00e9llo \u4e16\u754c \U0001f680 \u00a0tab\tend"),
                ("assistant", "\u00e7a va \u2713"), ("user", " leading space")),
    "no system": (("user", "Hi"), ("assistant", "Hello!"), ("user", "And?")),
}


@dataclass(frozen=True)
class Stability:
    """Whether rendering a model's conversations message by message gives its template's whole rendering.

    ``reason`` says why not (the probe, the message and the token where the two first differ), or what was
    checked; :func:`render` renders every conversation whole where ``stable`` is False."""

    stable: bool
    reason: str


_STABILITY: "weakref.WeakKeyDictionary[Any, Stability]" = weakref.WeakKeyDictionary()
_STABILITY_LOCK = threading.Lock()


def template_stability(runtime: Runtime) -> Stability:
    """Whether ``runtime``'s chat template is prefix-stable, checked once per runtime (each later call reads
    the first answer): for each of :data:`STABILITY_PROBES` and each ``k``, the tokens of ``messages[:k]``
    rendered turn by turn (with the generation prompt) are exactly those of the template over
    ``messages[:k]`` whole. Without a system message the template may write its default system turn, which
    c2c leaves out on purpose (what the client sends is what the model reads): the rest must still be the same
    tokens. A model without a chat template is written in c2c's plain turns, prefix-stable by construction.
    """
    with _STABILITY_LOCK:
        known = _STABILITY.get(runtime)
    if known is None:   # two threads may both check a new runtime: the same answer, kept once
        known = _check_stability(runtime)
        with _STABILITY_LOCK:
            _STABILITY[runtime] = known
    return known


def _check_stability(runtime: Runtime) -> Stability:
    if runtime.render_chat([{"role": "user", "content": "x"}]) is None:
        return Stability(True, "no chat template: c2c's plain turns, each a prefix of the next by construction")
    bos = tuple(runtime.bos_ids)
    refused = []
    for name, turns in STABILITY_PROBES.items():
        msgs = [Message(role=r, content=c) for r, c in turns]
        system, rest = split_system(msgs)
        for k in range(1, len(rest) + 1):
            shown = msgs[:len(msgs) - len(rest) + k]
            try:
                mine = list(_by_turns(runtime, shown, True).token_ids)
                text = runtime.render_chat([x.to_dict() for x in shown], True) or ""
            except Exception as e:   # a template that refuses the shape (raise_exception): no path renders it
                refused.append(f"{name!r} ({type(e).__name__}: {str(e)[:80]})")
                break
            whole = list(runtime.encode(text))
            if bos and tuple(whole[:len(bos)]) != bos:
                whole = list(bos) + whole
            if system is None and len(whole) > len(mine) and whole[len(whole) - len(mine) + len(bos):] == \
                    mine[len(bos):]:
                continue   # the template's default system turn, then exactly ours
            if mine != whole:
                at = len(os.path.commonprefix([mine, whole]))
                return Stability(False, f"{_name(runtime)}'s chat template is not prefix-stable: in the probe "
                                 f"{name!r}, {k} message(s) after the system turn rendered one by one part from the "
                                 f"template's whole rendering at token {at} ({len(mine)} against {len(whole)} "
                                 "tokens); every conversation is rendered whole")
    checked = len(STABILITY_PROBES) - len(refused)
    return Stability(True, f"prefix-stable on {checked} probe conversations: turns are rendered one at a time"
                     + (f" (the template refuses {', '.join(refused)}; c2c renders those shapes turn by turn)"
                        if refused else ""))


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
    parts = [Part(label="prefix", token_ids=tuple(ids[:cuts[0]]), message=system)]
    parts += [Part(label=m.label, token_ids=tuple(ids[cuts[k]:cuts[k + 1]]), text=f"{m.label}: {m.text}",
                   aliases=m.aliases, private=m.private, message=m) for k, m in enumerate(rest)]
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
