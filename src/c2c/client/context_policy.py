"""A client-side policy that keeps an agent's context bounded by dropping old tool responses from the server's
cache (``c2c serve``'s ``c2c.edit``: :mod:`c2c.conversation.editing`), instead of deleting them from the history.

The agent keeps its *full* message list, as it would without c2c; before each request,
:meth:`ContextWindow.extra_body` says which messages the model should no longer read::

    from openai import OpenAI
    from c2c.client.context_policy import ContextPolicy, ContextWindow

    window = ContextWindow(ContextPolicy(keep_tool_responses=8), session="agent-1")
    messages = [{"role": "system", "content": "..."}, ...]          # every message, tool responses included
    r = oai.chat.completions.create(model=M, messages=messages, extra_body=window.extra_body(messages))

The policy (akvalgo's rules):

- ``keep_tool_responses``: a rolling window of the last N tool responses (``role: tool``);
  older ones are dropped;
- ``token_target``: then the oldest remaining tool responses are dropped until the estimated
  tokens of what is kept are at most this (tokens are estimated as characters /
  ``chars_per_token``, or counted by ``count_tokens``);
- ``reposition_every``: close the gaps every N-th request (1: at once); in between they stay
  open, which costs nothing now and leaves the positions where they were;
- ``repair``: the repair level sent with a reposition (``none``, ``first:K``, ``ratio:R``).

Drops are cumulative, as the server wants them: an index once dropped stays listed. A
framework that rebuilds the message list itself (LangGraph's state, for instance) passes
the same full list each time; the window only needs its messages in order.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence

from c2c.errors import ConfigError


@dataclass(frozen=True, kw_only=True)
class ContextPolicy:
    """Which messages an agent's model stops reading (see the module docstring)."""

    keep_tool_responses: int | None = 8
    token_target: int | None = None
    reposition_every: int = 1
    repair: str = "none"
    chars_per_token: float = 4.0

    def __post_init__(self) -> None:
        if self.keep_tool_responses is not None and self.keep_tool_responses < 0:
            raise ConfigError("keep_tool_responses must be >= 0 (or None: no rolling window)")
        if self.token_target is not None and self.token_target < 1:
            raise ConfigError("token_target must be a positive number of tokens (or None)")
        if self.reposition_every < 1:
            raise ConfigError("reposition_every must be >= 1 (1: close the gaps at every request)")
        if self.chars_per_token <= 0:
            raise ConfigError("chars_per_token must be > 0")


def _role(m: Any) -> str:
    return m["role"] if isinstance(m, Mapping) else getattr(m, "type", getattr(m, "role", ""))


def _content(m: Any) -> str:
    c = m.get("content") if isinstance(m, Mapping) else getattr(m, "content", "")
    if isinstance(c, list):
        return "".join(p.get("text", "") if isinstance(p, Mapping) else str(p) for p in c)
    return c or ""


class ContextWindow:
    """One conversation's drops under a :class:`ContextPolicy`: call :meth:`edit` (or :meth:`extra_body`) once
    per request, with the full message list.

    Messages may be dicts (``{"role": "tool", ...}``) or LangChain messages (``ToolMessage`` has
    ``type == "tool"``).
    """

    def __init__(self, policy: ContextPolicy = ContextPolicy(), *, session: str | None = None,
                 count_tokens: Callable[[str], int] | None = None):
        self.policy, self.session = policy, session
        self.count = count_tokens or (lambda text: int(len(text) / policy.chars_per_token) + 4)
        self.dropped: set[int] = set()
        self.requests = 0

    def drops(self, messages: Sequence[Any]) -> list[int]:
        """The indices of ``messages`` the model should not read, cumulative (nothing is taken back)."""
        n = len(messages)
        if any(i >= n for i in self.dropped):
            raise ConfigError(f"the history has {n} messages but message {max(self.dropped)} was dropped "
                              "before: pass the full history each time, dropped messages included")
        tools = [i for i, m in enumerate(messages) if _role(m) == "tool" and i not in self.dropped]
        p = self.policy
        drop = set(self.dropped)
        if p.keep_tool_responses is not None and len(tools) > p.keep_tool_responses:
            cut = len(tools) - p.keep_tool_responses
            drop.update(tools[:cut])
            tools = tools[cut:]
        if p.token_target is not None:
            size = sum(self.count(_content(m)) for i, m in enumerate(messages) if i not in drop)
            while tools and size > p.token_target:
                i = tools.pop(0)
                drop.add(i)
                size -= self.count(_content(messages[i]))
        return sorted(drop)

    def edit(self, messages: Sequence[Any]) -> dict[str, Any] | None:
        """The ``c2c.edit`` field for this request (None before anything is dropped)."""
        drop = self.drops(messages)
        self.requests += 1
        self.dropped = set(drop)
        if not drop:
            return None
        reposition = self.requests % self.policy.reposition_every == 0
        return {"drop": drop, "reposition": reposition, "repair": self.policy.repair if reposition else "none"}

    def extra_body(self, messages: Sequence[Any], **c2c: Any) -> dict[str, Any]:
        """``extra_body`` for an OpenAI client: the session, this request's edit, and any other ``c2c`` keys."""
        body: dict[str, Any] = dict(c2c)
        if self.session is not None:
            body.setdefault("session", self.session)
        e = self.edit(messages)
        if e is not None:
            body["edit"] = e
        return {"c2c": body}

    def kept(self, messages: Sequence[Any]) -> list[Any]:
        """The messages the model reads after the last :meth:`edit` (what a text drop would send)."""
        return [m for i, m in enumerate(messages) if i not in self.dropped]
