"""Agent-managed context in a session: drop messages from its cache without re-prefilling what follows.

A request names the messages to drop in ``extra_body={"c2c": {"session": ..., "edit": {...}}}``::

    {"drop": [2, 4],            # zero-based indices into ``messages``: every message dropped so far
     "reposition": true,        # close the gaps (re-rotate the keys after them); false leaves them open
     "repair": "none"}          # or "first:K" / "ratio:R": recompute some tokens after the gaps

The semantics follow AKV's ``drop_message`` (thu-nics/AKV): the caller keeps sending its
*full* history, and the indices are cumulative, so one list says what the model reads.
The session drops, from its cache, the held messages newly listed, and prefills only
what is new. Where c2c differs: an index once dropped must stay listed (the cache no
longer holds it: leaving it out is refused, not silently re-prefilled), and the repair
levels of :mod:`c2c.runtime.edit` are c2c's own.

Refused with :class:`~c2c.errors.ContextEditError` (400), the session left as it was:
an index out of range, the system message, a message whose text differs from the one
the session holds at that index, an earlier drop left out (a request without ``edit`` on
a session that has dropped messages included: it would bring them back), an edit without
a session or together with ``attach``, a malformed repair level or one without
``reposition``. A
session without a cache (new, or evicted), or whose cache cannot be edited (a model with
sliding-window layers; a first message at token 0, without BOS or system message), renders
the kept messages and prefills them: exact, and the record says so.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Sequence

from c2c.errors import ConfigError, ContextEditError, RuntimeUnsupportedError
from c2c.runtime.edit import Repair, close_gaps, drop
from c2c.runtime.kvcache import EditStep, KVCache
from c2c.runtime.pace import ONE_PASS, Pace
from c2c.runtime.protocol import Runtime
from c2c.conversation import Conversation
from c2c.conversation.render import Message


@dataclass(frozen=True, kw_only=True)
class EditSpec:
    """A request's edit instructions (see the module docstring)."""

    drop: tuple[int, ...] = ()
    reposition: bool = True
    repair: str = "none"


@dataclass(frozen=True)
class Held:
    """A message a session's cache holds: its index in the caller's history, its digest, its tokens ``[a, b)``
    and their digest (:func:`tokens_digest`: what the cache must still hold there for the message to be cut out)."""

    index: int
    digest: str
    a: int
    b: int
    tokens: str


@dataclass(frozen=True, kw_only=True)
class Edited:
    """What :func:`apply` did: the cache to continue from and the messages the model reads.

    Attributes:
        cache: the session's cache with the newly dropped messages taken out (None: it held none).
        kept: the messages to render, in order; ``kept_index`` their indices in the request.
        newly_dropped: indices dropped by this request (the rest of ``spec.drop`` was dropped before).
        step: the edit of the cache, or None when no held token was dropped.
        closed: tokens re-positioned to close gaps left open by earlier requests (no new drop).
        rebuilt: the session had no cache: the kept messages are prefilled from text (exact).
    """

    cache: KVCache | None
    kept: tuple[Message, ...]
    kept_index: tuple[int, ...]
    newly_dropped: tuple[int, ...]
    step: EditStep | None = None
    closed: int = 0
    rebuilt: bool = False

    def record(self, cache: KVCache | None) -> dict:
        """The reply's ``c2c.edit`` field; ``cache`` is the session's cache after the turn."""
        step = self.step or EditStep()
        edits = cache.edits if cache is not None else None
        if self.rebuilt:
            reason = ("the session held no cache it could edit (new, evicted, or a model whose sliding-window layers "
                      "cannot be edited): the kept messages were prefilled from text, exactly")
        elif self.step is not None:
            reason = (f"dropped {step.dropped_tokens} tokens from the cache; "
                      + ("re-positioned what followed" if step.repositioned else "left the positions open")
                      + (f", recomputed {step.recomputed} ({step.repair})" if step.recomputed else ""))
        else:
            reason = "nothing held was dropped" + (f"; closed earlier gaps ({self.closed} tokens moved)"
                                                   if self.closed else "")
        return {"dropped_messages": list(self.newly_dropped), "dropped_tokens": step.dropped_tokens,
                "repositioned_tokens": step.repositioned + self.closed, "recomputed_tokens": step.recomputed,
                "repair": step.repair, "rebuilt": self.rebuilt, "exact": cache is None or cache.exact,
                "open_gaps": len(cache.gaps) if cache is not None else 0,
                "total": edits.to_dict() if edits is not None else None, "reason": reason}


def digest(m: Message) -> str:
    calls = "\0".join(f"{c.id}\0{c.name}\0{c.arguments}" for c in m.tool_calls)
    return hashlib.sha256(f"{m.role}\0{m.name or ''}\0{m.content}\0{calls}\0{m.tool_call_id or ''}".encode()).hexdigest()


def tokens_digest(ids: Sequence[int]) -> str:
    return hashlib.sha256(",".join(map(str, ids)).encode()).hexdigest()


def newly_dropped(messages: Sequence[Message], spec: EditSpec, *, dropped_before: frozenset[int],
                  held: Sequence[Held]) -> tuple[int, ...]:
    """The indices ``spec`` newly drops; :class:`ContextEditError` for any instruction it cannot apply."""
    n = len(messages)
    for i in spec.drop:
        if not 0 <= i < n:
            raise ContextEditError(f"drop index {i} is out of range: the history has {n} messages (0..{n - 1}); "
                                   "indices count every message sent, the dropped ones included")
    if len(set(spec.drop)) != len(spec.drop):
        raise ContextEditError("drop lists an index twice")
    if messages and messages[0].role in ("system", "developer") and 0 in spec.drop:
        raise ContextEditError("message 0 is the system message, the shared prefix every cache is checked "
                               "against; it cannot be dropped (start a new session to change it)")
    missing = sorted(dropped_before - set(spec.drop))
    if missing:
        raise ContextEditError(f"message {missing[0]} was dropped on an earlier turn and is not listed now: drops "
                               "are cumulative, list every dropped index each time (c2c.client.context_policy does)")
    by_index = {h.index: h for h in held}
    new = tuple(sorted(set(spec.drop) - dropped_before))
    for i in new:
        h = by_index.get(i)
        if h is not None and h.digest != digest(messages[i]):
            raise ContextEditError(f"message {i} differs from the one this session holds at that index: the "
                                   "history contradicts the drop; send the same history (indices are positions "
                                   "in the full history)")
    return new


def apply(runtime: Runtime, cache: KVCache | None, messages: Sequence[Message], spec: EditSpec, *,
          dropped_before: frozenset[int], held: Sequence[Held], pace: Pace = ONE_PASS) -> Edited:
    """Check ``spec`` (:func:`check`), then drop the newly dropped messages the cache holds; a repair's
    forward passes run at ``pace`` (the server's prefill chunk, the turn free to pass between them).

    Nothing of the session is changed here: the caller keeps the result once the turn succeeds.
    """
    new = newly_dropped(messages, spec, dropped_before=dropped_before, held=held)
    try:
        how = Repair.parse(spec.repair)  # refused before anything is done
    except ConfigError as e:
        raise ContextEditError(str(e)) from None
    if how.kind != "none" and not spec.reposition:
        raise ContextEditError("a repair recomputes tokens at their re-positioned places: send reposition: true, "
                               "or repair: none")
    gone = set(spec.drop)
    kept_index = tuple(i for i in range(len(messages)) if i not in gone)
    kept = tuple(messages[i] for i in kept_index)
    if cache is None:
        return Edited(cache=None, kept=kept, kept_index=kept_index, newly_dropped=new, rebuilt=True)
    spans = []
    try:
        for h in held:
            if h.index in new:
                if h.a == 0 or h.b > cache.seq_len or tokens_digest(cache.token_ids[h.a:h.b]) != h.tokens:
                    # token 0 (no BOS, no system message) or not held as recorded: cut there, prefill the rest
                    cache = cache.head(h.a) if h.a > 0 else None
                    break
                spans.append((h.a, h.b))
        spans = [(a, b) for a, b in spans if cache is not None and b <= cache.seq_len]
        if cache is not None and spans:
            cache, step = drop(runtime, cache, spans, reposition=spec.reposition, repair=how, pace=pace)
            return Edited(cache=cache, kept=kept, kept_index=kept_index, newly_dropped=new, step=step)
    except RuntimeUnsupportedError:  # sliding-window layers: they no longer hold what the edit needs
        cache = None
    if cache is None:
        return Edited(cache=None, kept=kept, kept_index=kept_index, newly_dropped=new, rebuilt=True)
    closed = 0
    if spec.reposition and cache.gaps:
        cache, closed = close_gaps(runtime, cache)
    return Edited(cache=cache, kept=kept, kept_index=kept_index, newly_dropped=new, closed=closed)


def drop_parts(runtime: Runtime, conversation: Conversation, cache: KVCache, indices: Sequence[int], *,
               reposition: bool = True, repair: str | Repair | None = None,
               pace: Pace = ONE_PASS) -> tuple[Conversation, KVCache, EditStep]:
    """Take parts ``indices`` (never 0, the shared prefix) out of ``conversation`` and their tokens out of
    ``cache``, which holds exactly its tokens, without a prefill (:func:`c2c.runtime.edit.drop`: what follows
    is re-positioned, or the gaps left open; ``repair`` recomputes some, at ``pace``).

    Raises:
        ConfigError: an index is 0 or out of range.
    """
    chosen = sorted(set(indices))
    if not chosen or chosen[0] < 1 or chosen[-1] >= len(conversation.parts):
        raise ConfigError(f"parts {list(indices)} cannot be dropped: a conversation of {len(conversation.parts)} "
                          "parts can drop parts 1.. (part 0 is the shared prefix)")
    bounds = conversation.bounds()
    spans = [bounds[i] for i in chosen if bounds[i][1] > bounds[i][0]]
    step = EditStep()
    if spans:
        cache, step = drop(runtime, cache, spans, reposition=reposition, repair=repair, pace=pace)
    gone = set(chosen)
    return Conversation(parts=tuple(p for i, p in enumerate(conversation.parts) if i not in gone)), cache, step


def held_messages(rendering: Conversation, kept_index: Sequence[int], attachments: int) -> tuple[Held, ...]:
    """Where each kept message (but the system one, which is the prefix) sits in ``rendering``'s tokens:
    ``kept_index`` gives each kept message's index in the caller's history, ``attachments`` how many parts
    lie between the prefix and the first message; each part carries its message (:attr:`Part.message`)."""
    offsets = rendering.bounds()
    turns = [i for i in kept_index if not (i == 0 and rendering.parts[0].message is not None)]
    first = 1 + attachments
    ids = rendering.token_ids
    return tuple(Held(index=i, digest=digest(rendering.parts[first + j].message), a=offsets[first + j][0],
                      b=offsets[first + j][1], tokens=tokens_digest(ids[offsets[first + j][0]:offsets[first + j][1]]))
                 for j, i in enumerate(turns))
