"""A model's forward passes, one at a time, shared fairly between tenants.

Every admitted request (a :class:`Job`) runs on a thread of its own, but only the
job that holds the model's *turn* may run the model, so no two threads ever run
one model's forward passes at once. A job calls :meth:`Job.between_passes` between
forward passes; there the turn passes to the waiting job whose tenant (trust
domain) has used the model least recently, and within that tenant to the agent
that has (:class:`~c2c.serve.fairness.UsageClock`). The requests of one lane (one
session; a request without a session is a lane of its own) run one after another,
oldest first. So another tenant's short request does not wait
for a tenant's long generations to end: it goes at their next forward pass.

Admission is bounded, and refused at once (:class:`~c2c.errors.QueueFullError`,
HTTP 429 with ``Retry-After``) rather than letting latency grow without bound:

- a model holds at most ``max_queue`` requests beyond the one running;
- one tenant holds at most ``tenant_queue`` of them, running or waiting (its
  share), so one tenant cannot fill the queue for everyone.

Each job carries a cancel flag (set when the client disconnects) and a deadline;
a job waiting for the turn leaves as soon as either is set, and a running one at
its next :meth:`Job.between_passes`. Results and streamed deltas reach the asyncio side
through :class:`Channel`.

Passes are batched. A job's prompt chunks and decode steps (:meth:`Job.step`) queue for
the turn like any other pass; the job that gets it runs, in one forward pass, its own
tokens and the decode steps of every job waiting at one then (up to ``max_batch`` jobs),
and, when its own is a decode step, the prefill chunk of the most deserving job of its
own tenant waiting with one: at most one chunk a pass, so a pass stays about one chunk
long, and never another tenant's chunk, so a tenant whose turn it is gets a short pass.
After a pass, the turn waits a moment (:data:`GATHER_S`) for that pass's jobs to sample
and come back, so that the choice of who goes next sees them. So the weights are read
once a pass for all the decoding agents, and their steps ride along with the prompts of
the agents still arriving. A pass is charged
to its jobs' tenants and agents by their share of its tokens. An engine that cannot
batch (``batch`` None) runs each job's passes alone, as before.

NOTE: a started job keeps its K/V while it waits for the turn, so a model holds
as many live caches as it has started jobs: at most one per agent.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from collections import Counter
from typing import Any, Callable, Hashable

from c2c.errors import QueueFullError, RequestTimeoutError, ServeError
from c2c.serve.auth import OPEN, Principal
from c2c.serve.fairness import UsageClock

log = logging.getLogger("c2c")
# how long the turn waits after a pass for that pass's jobs to come back with their next one; also how often a
# job waiting for the turn looks at its cancel flag and deadline
GATHER_S = 0.02


class Cancelled(Exception):
    """The client went away; the job stops quietly (nobody is left to tell)."""


class Channel:
    """Events from a worker thread to one asyncio consumer, in order."""

    def __init__(self, loop: asyncio.AbstractEventLoop):
        self._loop = loop
        self._q: asyncio.Queue = asyncio.Queue()

    def put(self, kind: str, value: Any = None) -> None:
        try:
            self._loop.call_soon_threadsafe(self._q.put_nowait, (kind, value))
        except RuntimeError:  # the loop is closed: the server is gone, and so is the consumer
            pass

    async def get(self) -> tuple[str, Any]:
        return await self._q.get()


class Job:
    """One request's work on a model: ``run(job)`` is called on the job's own thread, holding the turn.

    ``run`` reports through :meth:`emit` and returns the final result, which becomes a
    ``("done", result)`` event; an exception becomes ``("error", exc)``. ``owner`` is whose
    share the job counts against. Jobs of one ``lane`` (by default: of one owner) run one after another,
    oldest first; a server gives each session its own lane, and each request without a session one of its own,
    so that one agent's independent requests decode together.
    """

    def __init__(self, run: Callable[["Job"], Any], channel: Channel, *, timeout_s: float,
                 owner: Principal = OPEN, lane: Hashable | None = None):
        self.run = run
        self.channel = channel
        self.owner = owner
        self.lane = owner if lane is None else lane   # jobs of one lane run one after another, oldest first
        self.deadline = time.monotonic() + timeout_s
        self.timeout_s = timeout_s
        self.cancel = threading.Event()
        self.enqueued = time.monotonic()
        self.started: float | None = None
        self.seq = 0
        self.worker: ModelWorker | None = None  # set when submitted
        self.turn_since = 0.0                   # perf_counter when it last got the turn
        self.released = False                   # it said it runs no forward pass any more
        self.step_in: tuple[Any, list[int]] | None = None   # (stepper, token ids) waiting for a batched pass
        self.step_out: Any = None                        # its logits (or the pass's exception), once run

    def emit(self, kind: str, value: Any = None) -> None:
        self.channel.put(kind, value)

    def between_passes(self) -> None:
        """Raise if the client went away or the deadline passed; else let a more deserving job have
        the turn first (call between forward passes: the only place a job gives up the turn)."""
        self.raise_if_done()
        if self.worker is not None:
            self.worker.pass_turn(self)

    def step(self, stepper: Any, ids: list[int]):
        """A pass of ``ids`` after ``stepper`` (a prompt chunk or a decode step), in one forward pass with the other
        jobs' that wait then (on a worker that batches; else alone, after :meth:`check`); its last logits
        ``(vocab,)``. Raises as :meth:`check` does while it waits."""
        if self.worker is None or self.worker.batch is None:   # an engine that cannot batch: its own pass, on
            self.between_passes()                                       # this thread, holding the turn (as every pass was)
            return stepper.feed(ids)
        self.raise_if_done()
        return self.worker.step(self, stepper, list(ids))

    def release_turn(self) -> None:
        """Give up the turn for good: the job runs no forward pass after this (e.g. it only stores and
        signs now), so the next job need not wait for it."""
        self.released = True
        if self.worker is not None:
            self.worker.release(self)

    def raise_if_done(self) -> None:
        """Raise :class:`Cancelled` or :class:`~c2c.errors.RequestTimeoutError` when that is due."""
        if self.cancel.is_set():
            raise Cancelled()
        if time.monotonic() > self.deadline:
            raise RequestTimeoutError(f"the request ran past its {self.timeout_s:g} s deadline "
                                      "(queueing included); retry, or ask for fewer tokens")

    @property
    def queued_s(self) -> float:
        return (self.started or time.monotonic()) - self.enqueued


class ModelWorker:
    """The jobs of one model: admission (``max_queue``, ``tenant_queue``) and the turn (module docstring).

    Args:
        max_queue: requests that may wait beyond the one running.
        tenant_queue: requests one tenant (``Job.owner.domain``) may hold, running or waiting;
            ``None``: ``max_queue + 1`` (no share beyond the whole queue).
        half_life_s: how long use of the model counts against a tenant when choosing who goes next.
    """

    def __init__(self, name: str, *, max_queue: int, tenant_queue: int | None = None, half_life_s: float = 5.0,
                 retry_after_s: float = 1.0, on_depth: Callable[[int], None] = lambda depth: None,
                 batch: Callable[[list, list[int]], list] | None = None, max_batch: int = 16,
                 on_batch: Callable[[int], None] = lambda size: None,
                 engine_init: Callable[[], None] = lambda: None):
        self.name = name
        # every batched pass runs on this one thread: a math library's thread team (OpenMP) belongs to the thread
        # that starts it, and a team per job thread left spinning after its pass would fight the next for the cores
        self._engine = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"c2c-model:{name}",
                                          initializer=engine_init)
        self.batch = batch if max_batch > 1 else None   # runs several jobs' passes as one (Batching.feed_together)
        self.max_batch = max_batch if batch is not None else 1
        self._on_batch = on_batch
        self._returning: set[Job] = set()     # jobs whose last pass was a batched one: the turn waits for them
        self._gather_until = 0.0             # until then the turn waits for the last pass's decoders to come back
        self.max_queue = max_queue
        self.tenant_queue = max_queue + 1 if tenant_queue is None else tenant_queue
        self.retry_after_s = retry_after_s
        self._cv = threading.Condition()
        self._jobs: dict[int, Job] = {}      # admitted and not finished, by seq
        self._ready: dict[int, Job] = {}     # waiting for the turn, by seq
        self._holder: Job | None = None      # the job whose forward passes run now
        self._held: Counter[str] = Counter()  # jobs per tenant
        self._tenants = UsageClock(half_life_s)
        self._agents = UsageClock(half_life_s)
        self._seq = itertools.count(1)
        self._closing = False
        self._on_depth = on_depth

    @property
    def depth(self) -> int:
        """Jobs waiting (not counting the one running)."""
        return max(len(self._jobs) - 1, 0)

    @property
    def size(self) -> int:
        """Jobs admitted and not finished (running or waiting)."""
        return len(self._jobs)

    def submit(self, job: Job) -> Job:
        """Admit ``job`` and start its thread; it runs when it gets the turn.

        Raises:
            QueueFullError: ``max_queue`` jobs are already waiting, or the job's tenant holds its share.
            ServeError: the worker is shutting down.
        """
        tenant = job.owner.domain
        with self._cv:
            if self._closing:
                raise ServeError("the server is shutting down; retry on another instance or later")
            if len(self._jobs) > self.max_queue:
                raise QueueFullError(f"model {self.name} has {len(self._jobs) - 1} requests waiting (the limit, "
                                     f"--max-queue {self.max_queue}); retry after {self.retry_after_s:g} s",
                                     retry_after_s=self.retry_after_s)
            if self._held[tenant] >= self.tenant_queue:
                raise QueueFullError(f"domain {tenant!r} has {self._held[tenant]} requests on model {self.name}, "
                                     f"its share (--max-queue-per-tenant {self.tenant_queue}); retry after "
                                     f"{self.retry_after_s:g} s", retry_after_s=self.retry_after_s)
            job.seq, job.worker = next(self._seq), self
            self._jobs[job.seq] = job
            self._held[tenant] += 1
            self._on_depth(self.depth)
        threading.Thread(target=self._run, args=(job,), name=f"c2c-serve:{self.name}:{job.seq}",
                         daemon=True).start()
        return job

    def close(self, timeout_s: float) -> None:
        """Refuse new jobs, let admitted ones finish (up to ``timeout_s``)."""
        deadline = time.monotonic() + timeout_s
        with self._cv:
            self._closing = True
            while self._jobs and time.monotonic() < deadline:
                self._cv.wait(max(deadline - time.monotonic(), 0.0))
            if self._jobs:
                log.warning("model %s still has %d requests after %.0f s; leaving them", self.name,
                            len(self._jobs), timeout_s)
        self._engine.shutdown(wait=False)

    # ------------------------------------------------------------- the turn
    def _run(self, job: Job) -> None:
        try:
            with self._cv:
                self._wait_for_turn(job)
            job.started = time.monotonic()
            job.raise_if_done()
            result = job.run(job)
        except Cancelled:
            job.emit("cancelled")
        except Exception as e:  # noqa: BLE001 - every failure goes back to its request; the others go on
            job.emit("error", e)
        else:
            job.emit("done", result)
        finally:
            self.release(job)
            with self._cv:
                self._returning.discard(job)
                self._ready.pop(job.seq, None)
                del self._jobs[job.seq]
                self._held[job.owner.domain] -= 1
                if not self._held[job.owner.domain]:
                    del self._held[job.owner.domain]
                self._on_depth(self.depth)
                self._hand_on()
                self._cv.notify_all()  # close() waits for the last job

    def pass_turn(self, job: Job) -> None:
        """Called by the job holding the turn, between forward passes: go on, or wait while a job
        that deserves it more has the turn.

        Raises:
            Cancelled, RequestTimeoutError: while waiting (the job no longer holds the turn then).
        """
        with self._cv:
            self._returning.discard(job)   # a pass of another kind: no batched pass of it to wait for
            if self._holder is not job:
                if job.released:   # it said it runs no forward pass any more
                    return
                self._wait_for_turn(job)   # its last pass was a batched step, which left it without the turn
                return
            now = time.perf_counter()
            self._charge(job, now)
            job.turn_since = now
            if not self._ready or self._pick([job, *self._ready.values()], now) is job:
                return
            self._holder = None
            self._wait_for_turn(job)

    def step(self, job: Job, stepper: Any, ids: list[int]):
        """``job``'s pass of ``ids``, run in one forward pass with the others waiting when the turn comes (module
        docstring); its last logits. The job holds no turn afterwards: a pass of another kind queues for it.

        Raises:
            Cancelled, RequestTimeoutError: while waiting; the exception of the batched pass, in every job of it.
        """
        with self._cv:
            if self._holder is job:
                self._charge(job, time.perf_counter())
                self._holder = None
            job.step_in, job.step_out = (stepper, ids), None
            self._returning.add(job)   # it comes back with its next pass (its next chunk, or its first step)
            self._ready[job.seq] = job
            self._hand_on()
            self._cv.notify_all()   # a pass gathering its jobs may be waiting for this one
            while self._holder is not job and job.step_out is None:
                if job.cancel.is_set() or time.monotonic() > job.deadline:
                    if job.step_in is not None:   # not taken into a pass: leave the queue
                        self._ready.pop(job.seq, None)
                        job.step_in = None
                        self._returning.discard(job)
                        job.raise_if_done()
                self._cv.wait(GATHER_S)
                self._hand_on()   # the moment given to the last pass's decoders may have run out
            if job.step_out is not None:   # another job's pass ran this one
                out, job.step_out = job.step_out, None
                if isinstance(out, BaseException):
                    raise out
                return out
            batch = self._gather(job)
        t0 = time.perf_counter()
        try:
            if len(batch) == 1:
                outs = [self._engine.submit(stepper.feed, ids).result()]
            else:
                outs = self._engine.submit(self.batch, [j.step_in[0] for j in batch],
                                           [j.step_in[1] for j in batch]).result()
        except Exception as e:  # noqa: BLE001 - every job of the pass gets the pass's failure
            outs = [e] * len(batch)
        with self._cv:
            now = time.perf_counter()
            tokens = sum(len(j.step_in[1]) for j in batch)
            for j, out in zip(batch, outs):
                share = (now - t0) * len(j.step_in[1]) / tokens
                self._tenants.charge(j.owner.domain, share, now)
                self._agents.charge((j.owner.domain, j.owner.agent), share, now)
                j.step_in = None
                if j is not job:
                    j.step_out = out
            self._on_batch(len(batch))
            self._holder = None
            self._gather_until = time.monotonic() + GATHER_S
            self._hand_on()
            self._cv.notify_all()
        if isinstance(outs[0], BaseException):
            raise outs[0]
        return outs[0]

    def _gather(self, leader: Job) -> list[Job]:
        """(lock held, ``leader`` holds the turn) The jobs whose passes run in ``leader``'s: ``leader`` first, then
        the jobs waiting at a decode step, oldest first, and (when ``leader``'s is a step) the prefill chunk of its
        own tenant :meth:`_pick` prefers, up to ``max_batch`` jobs."""
        self._ready.pop(leader.seq, None)
        steps = self._waiting(1)
        chunk = []
        if len(leader.step_in[1]) == 1:   # a chunk of the leader's own tenant may ride along (another's waits)
            chunks = [j for j in self._waiting(2) if j.owner.domain == leader.owner.domain]
            best = self._pick(chunks, time.perf_counter()) if chunks else None
            chunk = [best] if best is not None else []
        batch = [leader] + chunk + steps[:self.max_batch - 1 - len(chunk)]
        for j in batch[1:]:
            del self._ready[j.seq]
        return batch

    def _waiting(self, least: int) -> list[Job]:
        """(lock held) The jobs queued with a pass of 1 token (``least`` 1: decode steps) or more (2: prompt
        chunks), oldest first."""
        return sorted((j for j in self._ready.values() if j.step_in is not None
                       and (len(j.step_in[1]) == 1) == (least == 1)), key=lambda j: j.seq)

    def release(self, job: Job) -> None:
        """``job`` runs no more forward passes: the turn goes on (a no-op if it does not hold it)."""
        with self._cv:
            self._returning.discard(job)
            if self._holder is job:
                self._charge(job, time.perf_counter())
                self._holder = None
                self._hand_on()

    def _wait_for_turn(self, job: Job) -> None:
        """(lock held) Queue ``job`` for the turn and wait until it has it; leave early when cancelled."""
        self._ready[job.seq] = job
        self._hand_on()
        while self._holder is not job:
            if job.cancel.is_set() or time.monotonic() > job.deadline:
                del self._ready[job.seq]
                job.raise_if_done()
            self._cv.wait(GATHER_S)
            self._hand_on()   # the moment given to the last pass's decoders may have run out

    def _hand_on(self) -> None:
        """(lock held) Give a free turn to the job that deserves it most, and wake the waiters."""
        if self._holder is not None or not self._ready:
            return
        if time.monotonic() < self._gather_until and any(j.step_in is None for j in self._returning):
            return   # the last pass's decoders are sampling their next token: they may deserve the turn
        now = time.perf_counter()
        job = self._pick(list(self._ready.values()), now)
        if job is None:  # each waiting job's agent has an older one still storing its result
            return
        del self._ready[job.seq]
        self._holder, job.turn_since = job, now
        self._cv.notify_all()

    def _pick(self, jobs: list[Job], now: float) -> Job | None:
        """The tenant with the least recent use, its agent with the least, that agent's oldest job that is not at a
        decode step (steps ride along with every pass), else its oldest; only a lane's oldest unfinished job may
        go (a lane's requests run one after another, as the same session's must)."""
        first: dict[Hashable, int] = {}
        for j in self._jobs.values():  # in admission order
            first.setdefault(j.lane, j.seq)
        jobs = sorted((j for j in jobs if first[j.lane] == j.seq), key=lambda j: j.seq)
        if not jobs:
            return None
        tenant = self._tenants.least(dict.fromkeys(j.owner.domain for j in jobs), now)
        jobs = [j for j in jobs if j.owner.domain == tenant]
        agent = self._agents.least(dict.fromkeys((tenant, j.owner.agent) for j in jobs), now)
        mine = [j for j in jobs if j.owner.agent == agent[1]]
        # a decode step rides along with any pass: the agent's oldest job that is not one goes first, if any
        return next((j for j in mine if j.step_in is None or len(j.step_in[1]) > 1), mine[0])

    def _charge(self, job: Job, now: float) -> None:
        spent = now - job.turn_since
        self._tenants.charge(job.owner.domain, spent, now)
        self._agents.charge((job.owner.domain, job.owner.agent), spent, now)
