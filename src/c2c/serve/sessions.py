"""Sessions: a conversation's KV cache kept between requests, under byte budgets shared fairly.

A request names its session in ``extra_body={"c2c": {"session": "analyst-1"}}``.
The server keeps that session's cache, so the next turn prefills only what is
new (:mod:`c2c.conversation.reuse`), and its attachments (caches or texts taken from
the store), which stay part of the conversation on later turns.

All sessions together hold at most ``budget_bytes`` of K/V and ``max_sessions``
records, and each tenant (trust domain) at most its share of both
(``tenant_bytes``, ``tenant_sessions``; by default an even split between the
server's domains). Past a limit, caches are evicted (never their record) and,
past the record count, the least recently used records are forgotten:

1. a tenant over its share loses its own least recently used first;
2. if all together are still over, the tenant holding the most loses its least
   recently used.

So one tenant's many sessions never push out another's while the shares add up
to at most the whole (the default). The next request on an evicted session is
rebuilt from its messages and attachments, and says so; a forgotten session
starts anew. A request is never answered from a cache that does not match it,
evicted or not: reuse is by exact token prefix.

Sessions are per caller: the key is (domain, agent, session name, model), so two
agents never share a cache by choosing the same name.
"""

from __future__ import annotations

import threading
from collections import Counter, OrderedDict
from dataclasses import dataclass

from c2c.artifact.prefix import PrefixRef
from c2c.runtime.kvcache import KVCache
from c2c.conversation import Conversation, Part
from c2c.conversation.editing import Held, held_messages


@dataclass(frozen=True)
class SessionKey:
    domain: str
    agent: str
    name: str
    model: str


@dataclass(frozen=True)
class Attachments:
    """What a session attached: the commits, and the parts they placed after its shared prefix.

    Attributes:
        parts: placed after the shared prefix, in order (their ``kv`` dropped once imported).
        commits: the commits behind them; a publish from the session lists them as parents.
        via_text: those of ``commits`` that were read as text (not cache hops).
        placed: how many of ``parts`` each of ``commits`` placed, in order (0: the session continued it).
        mode: the mode they were attached with (a stale one is attached again with it).
        prefix: the shared prefix they were checked against (None: nothing placed).
    """

    parts: tuple[Part, ...] = ()
    commits: tuple[str, ...] = ()
    via_text: tuple[str, ...] = ()
    placed: tuple[int, ...] = ()
    mode: str = "auto"
    prefix: PrefixRef | None = None


@dataclass(eq=False)
class Session:
    """One conversation's state: its :class:`~c2c.conversation.Conversation` and the cache of it, plus the pool's
    bookkeeping (``state``, ``turns``).

    Attributes:
        cache: the K/V the last request left (``token_ids`` say exactly what it holds), or None.
        conversation: the last request's conversation, as rendered (its parts' messages are the kept messages).
        history: for each message part of ``conversation``, its index in the caller's history (drops skip some).
        attachments: what the session attached (:class:`Attachments`).
        state: ``"new"``, ``"warm"`` (a cache is held) or ``"evicted"`` (rebuilt on next use).
        dropped: the indices of the caller's history dropped so far (cumulative).
    """

    key: SessionKey | None
    cache: KVCache | None = None
    conversation: Conversation | None = None
    history: tuple[int, ...] = ()
    attachments: Attachments = Attachments()
    state: str = "new"
    turns: int = 0
    dropped: frozenset[int] = frozenset()

    @property
    def held(self) -> tuple[Held, ...]:
        """Where the messages of the last request sit in ``cache`` (:func:`c2c.conversation.editing.held_messages`)."""
        if self.conversation is None:
            return ()
        return held_messages(self.conversation, self.history, len(self.attachments.parts))

    @property
    def nbytes(self) -> int:
        return self.cache.nbytes if self.cache is not None else 0


@dataclass
class PoolStats:
    sessions: int = 0
    held_bytes: int = 0
    evictions: int = 0
    forgotten: int = 0


class SessionPool:
    """Sessions by key, least recently used first per tenant, within the budgets of the module docstring.

    A request takes its session out (:meth:`take`) and puts it back (:meth:`put`); a
    session that is out is the request's alone. Safe to use from several threads.

    Args:
        budget_bytes, max_sessions: K/V bytes and session records of all tenants together.
        tenant_bytes, tenant_sessions: the same for one tenant (``SessionKey.domain``);
            ``None``: the whole budget.
    """

    def __init__(self, budget_bytes: int, *, max_sessions: int = 4096, tenant_bytes: int | None = None,
                 tenant_sessions: int | None = None, on_evict=None):
        self.budget_bytes = budget_bytes
        self.max_sessions = max_sessions
        self.tenant_bytes = budget_bytes if tenant_bytes is None else tenant_bytes
        self.tenant_sessions = max_sessions if tenant_sessions is None else tenant_sessions
        self._tenants: dict[str, OrderedDict[SessionKey, Session]] = {}  # least recently used first
        self._lock = threading.Lock()
        self._held: Counter[str] = Counter()  # K/V bytes per tenant
        self.stats = PoolStats()
        self._on_evict = on_evict or (lambda session: None)

    def take(self, key: SessionKey) -> Session:
        """The session for ``key`` (a new one if there is none), removed from the pool until :meth:`put`."""
        with self._lock:
            s = self._tenants.get(key.domain, {}).pop(key, None)
            if s is None:
                return Session(key=key)
            self._held[key.domain] -= s.nbytes
            self._sync()
            return s

    def put(self, session: Session) -> None:
        """Return ``session`` as its tenant's most recently used; evict and forget to fit the budgets."""
        if session.key is None:
            return
        tenant = session.key.domain
        with self._lock:
            if session.cache is not None and session.nbytes > min(self.budget_bytes, self.tenant_bytes):
                self._evict(session)  # larger than a whole budget: keep the record only
            mine = self._tenants.setdefault(tenant, OrderedDict())
            mine[session.key] = session
            mine.move_to_end(session.key)
            self._held[tenant] += session.nbytes
            self._sync()
            while self._held[tenant] > self.tenant_bytes and self._evict_oldest(tenant):
                pass
            while sum(self._held.values()) > self.budget_bytes and self._evict_oldest(self._most(self._held)):
                pass
            while len(mine) > self.tenant_sessions:
                self._forget_oldest(tenant)
            while self.stats.sessions > self.max_sessions:
                self._forget_oldest(self._most({t: len(s) for t, s in self._tenants.items()}))
            self._sync()

    def get_state(self, key: SessionKey) -> str | None:
        with self._lock:
            s = self._tenants.get(key.domain, {}).get(key)
            return None if s is None else s.state

    def held_bytes(self, tenant: str) -> int:
        """K/V bytes the sessions of ``tenant`` hold in the pool."""
        with self._lock:
            return self._held[tenant]

    def _most(self, amounts: dict[str, int]) -> str:
        return max(amounts, key=lambda t: amounts[t])

    def _evict_oldest(self, tenant: str) -> bool:
        """Drop the cache of ``tenant``'s least recently used session that has one; False if none has."""
        for s in self._tenants.get(tenant, {}).values():
            if s.cache is not None:
                self._held[tenant] -= s.nbytes
                self._evict(s)
                return True
        return False

    def _forget_oldest(self, tenant: str) -> None:
        _, old = self._tenants[tenant].popitem(last=False)
        self._held[tenant] -= old.nbytes
        self.stats.forgotten += 1
        self._sync()

    def _evict(self, s: Session) -> None:
        s.cache = None
        s.state = "evicted"
        self.stats.evictions += 1
        self._on_evict(s)

    def _sync(self) -> None:
        for tenant in [t for t, s in self._tenants.items() if not s]:
            del self._tenants[tenant]
            self._held.pop(tenant, None)
        self.stats.sessions = sum(len(s) for s in self._tenants.values())
        self.stats.held_bytes = sum(self._held.values())
