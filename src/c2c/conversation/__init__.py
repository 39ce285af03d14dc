"""`Conversation`: one conversation as every front-end holds it, cut into labelled parts.

::

    parts[0]   the shared prefix: BOS and the system turn (what :func:`c2c.handoff.decide` compares)
    parts[1:]  one part per message (or attached commit, or generation prompt), in order

Each :class:`Part` carries its label, whether it is private, its token ids, the text it says (what a text
handoff of it reads), the chat :class:`Message` it renders (none for an attached cache) and, where the front-end
holds them, its K/V at its own positions.

The library's agents (each holds one, :class:`c2c.team.agent.Agent`), ``c2c serve``'s sessions (rendered by the
model's chat template, :mod:`c2c.conversation.render`) and vLLM's publisher (:meth:`Conversation.of_tokens`) build
one, and one function makes a commit of it (:func:`c2c.commit.author.commit_of`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Sequence

from c2c.context import PRIVATE_LABELS, Context
from c2c.conversation.tools import ToolCall
from c2c.runtime.kvcache import KVCache


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
    private: bool | None = None   # its span's privacy (an agent's own turns; None: by label, c2c.context)

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


@dataclass(frozen=True, kw_only=True)
class Part:
    """A run of tokens of a conversation.

    ``kv``, when given, is the K/V of exactly these tokens at positions ``kv.start...``
    (a cache attached from the store); it is imported instead of prefilled. ``text`` is
    what the part says, for a text handoff of it (empty for the prefix and prompt).
    """

    label: str
    token_ids: tuple[int, ...]
    private: bool | None = None
    kv: KVCache | None = None
    text: str = ""
    aliases: tuple[str, ...] = ()   # other names of its span (a tool result's call id)
    message: Message | None = None  # the chat message it renders (the prefix's: the system message), if any

    @property
    def is_private(self) -> bool:
        """``private``, or where it is None, by label (:data:`c2c.context.PRIVATE_LABELS`), as its span is."""
        return self.label in PRIVATE_LABELS if self.private is None else self.private


@dataclass(frozen=True, kw_only=True)
class Conversation:
    """A conversation's parts; ``parts[0]`` is the shared prefix."""

    parts: tuple[Part, ...]

    @classmethod
    def of_tokens(cls, token_ids: Sequence[int], *, prefix_len: int, text: str = "",
                  label: str = "conversation") -> "Conversation":
        """Token ids known only as a whole (a vLLM request): the prefix, then everything after it as one part
        labelled ``label`` that says ``text``."""
        if not 0 <= prefix_len <= len(token_ids):
            raise ValueError(f"a prefix of {prefix_len} tokens does not fit {len(token_ids)} tokens")
        ids = tuple(token_ids)
        rest = (Part(label=label, token_ids=ids[prefix_len:], private=False, text=text),) \
            if len(ids) > prefix_len else ()
        return cls(parts=(Part(label="prefix", token_ids=ids[:prefix_len]),) + rest)

    @property
    def token_ids(self) -> tuple[int, ...]:
        return tuple(t for p in self.parts for t in p.token_ids)

    def bounds(self) -> list[tuple[int, int]]:
        """Each part's token range ``[a, b)`` in :attr:`token_ids`, in order."""
        out, at = [], 0
        for p in self.parts:
            out.append((at, at + len(p.token_ids)))
            at += len(p.token_ids)
        return out

    @property
    def prefix_ids(self) -> tuple[int, ...]:
        return self.parts[0].token_ids

    def __len__(self) -> int:
        return sum(len(p.token_ids) for p in self.parts)

    def after_prefix(self, attachments: Sequence[Part]) -> "Conversation":
        """This conversation with ``attachments`` placed right after the shared prefix."""
        return Conversation(parts=self.parts[:1] + tuple(attachments) + self.parts[1:]) if attachments else self

    def context(self) -> Context:
        """The tokens as a :class:`~c2c.context.Context`: one span per part after the prefix, labelled."""
        ctx = Context(token_ids=self.prefix_ids, prefix_len=len(self.prefix_ids))
        for p in self.parts[1:]:
            ctx = ctx.extend(p.token_ids, p.label, private=p.private, aliases=p.aliases)
        return ctx

    def text_between(self, start: int, end: int) -> str:
        """The text of the parts that lie inside tokens ``[start, end)``, one paragraph each: never the shared
        prefix's, nor a private part's (a commit's text may reach a domain its K/V never would)."""
        out = []
        for i, (p, (a, b)) in enumerate(zip(self.parts, self.bounds())):
            if i and a >= start and b <= end and p.text and not p.is_private:
                out.append(p.text)
        return "\n\n".join(out)
