"""Sessions: a conversation's KV cache kept between requests, under one byte budget.

A request names its session in ``extra_body={"c2c": {"session": "analyst-1"}}``.
The server keeps that session's cache, so the next turn prefills only what is
new (:mod:`c2c.serve.reuse`), and its attachments (caches or texts taken from
the store), which stay part of the conversation on later turns.

All sessions together hold at most ``budget_bytes`` of K/V. Past it the least
recently used lose their cache (never their record): the next request on an
evicted session is rebuilt from its messages and attachments, and says so. A
request is never answered from a cache that does not match it, evicted or not:
reuse is by exact token prefix.

Sessions are per caller: the key is (domain, agent, session name, model), so two
agents never share a cache by choosing the same name.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass

from c2c.artifact.prefix import PrefixRef
from c2c.runtime.kvcache import KVCache
from c2c.serve.render import Part


@dataclass(frozen=True)
class SessionKey:
    domain: str
    agent: str
    name: str
    model: str


@dataclass(eq=False)
class Session:
    """One conversation's state.

    Attributes:
        cache: the K/V the last request left (``token_ids`` say exactly what it holds), or None.
        attachments: parts placed after the shared prefix (their ``kv`` dropped once imported).
        attached: the commits behind them; a publish from this session lists them as parents.
        via_text: those of ``attached`` that were read as text (not cache hops).
        attach_mode: the mode they were attached with (a stale one is attached again with it).
        attach_prefix: the shared prefix the attachments were checked against.
        state: ``"new"``, ``"warm"`` (a cache is held) or ``"evicted"`` (rebuilt on next use).
    """

    key: SessionKey | None
    cache: KVCache | None = None
    attachments: tuple[Part, ...] = ()
    attached: tuple[str, ...] = ()
    via_text: tuple[str, ...] = ()
    attach_mode: str = "auto"
    attach_prefix: PrefixRef | None = None
    state: str = "new"
    turns: int = 0

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
    """Sessions by key, least recently used first, within ``budget_bytes`` of K/V.

    A request takes its session out (:meth:`take`) and puts it back (:meth:`put`); a
    session that is out is the request's alone. Safe to use from several threads.
    """

    def __init__(self, budget_bytes: int, *, max_sessions: int = 4096, on_evict=None):
        self.budget_bytes = budget_bytes
        self.max_sessions = max_sessions
        self._sessions: OrderedDict[SessionKey, Session] = OrderedDict()
        self._lock = threading.Lock()
        self._held = 0
        self.stats = PoolStats()
        self._on_evict = on_evict or (lambda session: None)

    def take(self, key: SessionKey) -> Session:
        """The session for ``key`` (a new one if there is none), removed from the pool until :meth:`put`."""
        with self._lock:
            s = self._sessions.pop(key, None)
            if s is None:
                return Session(key=key)
            self._held -= s.nbytes
            self._sync()
            return s

    def put(self, session: Session) -> None:
        """Return ``session`` as the most recently used; evict caches until the pool fits its budget."""
        if session.key is None:
            return
        with self._lock:
            if session.cache is not None and session.nbytes > self.budget_bytes:
                self._evict(session)  # larger than the whole budget: keep the record only
            self._sessions[session.key] = session
            self._sessions.move_to_end(session.key)
            self._held += session.nbytes
            for s in list(self._sessions.values()):  # oldest first
                if self._held <= self.budget_bytes:
                    break
                if s.cache is not None:
                    self._held -= s.nbytes
                    self._evict(s)
            while len(self._sessions) > self.max_sessions:
                _, old = self._sessions.popitem(last=False)
                self._held -= old.nbytes
                self.stats.forgotten += 1
            self._sync()

    def get_state(self, key: SessionKey) -> str | None:
        with self._lock:
            s = self._sessions.get(key)
            return None if s is None else s.state

    def _evict(self, s: Session) -> None:
        s.cache = None
        s.state = "evicted"
        self.stats.evictions += 1
        self._on_evict(s)

    def _sync(self) -> None:
        self.stats.sessions = len(self._sessions)
        self.stats.held_bytes = self._held
