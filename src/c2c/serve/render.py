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

from dataclasses import dataclass, replace
from typing import Sequence

from c2c.artifact.prefix import prefix_token_ids
from c2c.context import Context
from c2c.runtime import placement
from c2c.runtime.protocol import Runtime
from c2c.runtime.kvcache import KVCache

ROLES = ("system", "developer", "user", "assistant", "tool")


@dataclass(frozen=True, kw_only=True)
class Message:
    """One chat message; ``name`` (optional) is also the label of its span (see :meth:`Rendering.context`)."""

    role: str
    content: str
    name: str | None = None

    @property
    def label(self) -> str:
        return self.name or self.role

    def to_dict(self) -> dict[str, str]:
        d = {"role": self.role, "content": self.content}
        if self.name:
            d["name"] = self.name
        return d


@dataclass(frozen=True, kw_only=True)
class Part:
    """A run of tokens of a rendered conversation.

    ``kv``, when given, is the K/V of exactly these tokens at positions ``kv.start...``
    (a cache attached from the store); it is imported instead of prefilled. ``text`` is
    what the part says, for a text handoff of it (empty for the prefix and prompt).
    """

    label: str
    token_ids: tuple[int, ...]
    private: bool | None = None
    kv: KVCache | None = None
    text: str = ""


@dataclass(frozen=True, kw_only=True)
class Rendering:
    """A conversation's parts; ``parts[0]`` is the shared prefix."""

    parts: tuple[Part, ...]

    @property
    def token_ids(self) -> tuple[int, ...]:
        return tuple(t for p in self.parts for t in p.token_ids)

    @property
    def prefix_ids(self) -> tuple[int, ...]:
        return self.parts[0].token_ids

    def __len__(self) -> int:
        return sum(len(p.token_ids) for p in self.parts)

    def after_prefix(self, attachments: Sequence[Part]) -> "Rendering":
        """This rendering with ``attachments`` placed right after the shared prefix."""
        return Rendering(parts=self.parts[:1] + tuple(attachments) + self.parts[1:]) if attachments else self

    def context(self) -> Context:
        """The tokens as a :class:`~c2c.context.Context`: one span per part after the prefix, labelled."""
        ctx = Context(token_ids=self.prefix_ids, prefix_len=len(self.prefix_ids))
        for p in self.parts[1:]:
            ctx = ctx.extend(p.token_ids, p.label, private=p.private)
        return ctx


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


def render(runtime: Runtime, messages: Sequence[Message], *, attachments: Sequence[Part] = (),
           generation_prompt: bool = True) -> Rendering:
    """``messages`` (with ``attachments`` right after the shared prefix) as parts.

    With ``generation_prompt`` the last part is the assistant's opening (label ``"prompt"``),
    after which the reply is generated.
    """
    system, rest = split_system(messages)
    parts = [Part(label="prefix", token_ids=prefix_ids(runtime, system))]
    parts += [turn(runtime, m) for m in rest]
    if generation_prompt:
        parts.append(Part(label="prompt", token_ids=tuple(runtime.encode(runtime.generation_prompt())),
                          private=False))
    return Rendering(parts=tuple(parts)).after_prefix(attachments)


def text_turn(runtime: Runtime, label: str, text: str) -> Part:
    """A user turn holding ``text`` (how a text handoff is read)."""
    return Part(label=label, token_ids=tuple(runtime.encode(runtime.render_turn("user", text))), private=False,
                text=text)


@dataclass(frozen=True)
class Continuation:
    """A request whose messages continue a commit's conversation (:func:`continuation`)."""

    rendering: Rendering     # the request's own, the commit's K/V (if carried) on the messages it covers
    messages: int            # how many messages (parts after the prefix) the commit covers
    carried: bool            # False: prefilled as sent (the text path, or K/V the model cannot cut per message)


def continuation(own: Rendering, commit: Sequence[int], attached: Part | None) -> Continuation | None:
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
    return Continuation(rendering=Rendering(parts=tuple(parts)), messages=n, carried=True)
