"""One worker thread per model: the only thread that runs that model's forward passes.

Requests wait in a bounded queue in front of it. A full queue refuses at once
(:class:`~c2c.errors.QueueFullError`, HTTP 429 with ``Retry-After``) rather than
letting latency grow without bound. Each :class:`Job` carries a cancel flag (set
when the client disconnects) and a deadline; the job's code calls
:meth:`Job.check` between forward passes. Results and streamed deltas reach the
asyncio side through :class:`Channel`.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
import time
from typing import Any, Callable

from c2c.errors import QueueFullError, RequestTimeoutError, ServeError

log = logging.getLogger("c2c")


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
    """One request's work on a worker: ``run(job)`` is called on the worker thread.

    ``run`` reports through :meth:`emit` and returns the final result, which becomes a
    ``("done", result)`` event; an exception becomes ``("error", exc)``.
    """

    def __init__(self, run: Callable[["Job"], Any], channel: Channel, *, timeout_s: float):
        self.run = run
        self.channel = channel
        self.deadline = time.monotonic() + timeout_s
        self.timeout_s = timeout_s
        self.cancel = threading.Event()
        self.enqueued = time.monotonic()
        self.started: float | None = None

    def emit(self, kind: str, value: Any = None) -> None:
        self.channel.put(kind, value)

    def check(self) -> None:
        """Raise if the client went away or the deadline passed (call between forward passes)."""
        if self.cancel.is_set():
            raise Cancelled()
        if time.monotonic() > self.deadline:
            raise RequestTimeoutError(f"the request ran past its {self.timeout_s:g} s deadline "
                                      "(queueing included); retry, or ask for fewer tokens")

    @property
    def queued_s(self) -> float:
        return (self.started or time.monotonic()) - self.enqueued


class ModelWorker:
    """A thread running jobs one at a time, fed by a queue of at most ``max_queue`` waiting jobs."""

    def __init__(self, name: str, *, max_queue: int, retry_after_s: float = 1.0,
                 on_depth: Callable[[int], None] = lambda depth: None):
        self.name = name
        self.max_queue = max_queue
        self.retry_after_s = retry_after_s
        self._q: queue.Queue = queue.Queue()
        self._waiting = 0
        self._lock = threading.Lock()
        self._closing = False
        self._on_depth = on_depth
        self._thread = threading.Thread(target=self._loop, name=f"c2c-serve:{name}", daemon=True)
        self._thread.start()

    @property
    def depth(self) -> int:
        """Jobs waiting (not counting the one running)."""
        return self._waiting

    def submit(self, job: Job) -> Job:
        """Queue ``job``.

        Raises:
            QueueFullError: ``max_queue`` jobs are already waiting.
            ServeError: the worker is shutting down.
        """
        with self._lock:
            if self._closing:
                raise ServeError("the server is shutting down; retry on another instance or later")
            if self._waiting >= self.max_queue:
                raise QueueFullError(f"model {self.name} has {self._waiting} requests waiting (the limit, "
                                     f"--max-queue {self.max_queue}); retry after {self.retry_after_s:g} s",
                                     retry_after_s=self.retry_after_s)
            self._waiting += 1
            self._on_depth(self._waiting)
        self._q.put(job)
        return job

    def close(self, timeout_s: float) -> None:
        """Refuse new jobs, let queued and running ones finish (up to ``timeout_s``), stop the thread."""
        with self._lock:
            self._closing = True
        self._q.put(None)
        self._thread.join(timeout_s)
        if self._thread.is_alive():
            log.warning("worker %s still busy after %.0f s; leaving it", self.name, timeout_s)

    def _loop(self) -> None:
        while True:
            job = self._q.get()
            if job is None:
                return
            with self._lock:
                self._waiting -= 1
                self._on_depth(self._waiting)
            job.started = time.monotonic()
            try:
                job.check()
                result = job.run(job)
            except Cancelled:
                job.emit("cancelled")
            except Exception as e:  # noqa: BLE001 - every failure goes back to its request; the worker goes on
                job.emit("error", e)
            else:
                job.emit("done", result)
