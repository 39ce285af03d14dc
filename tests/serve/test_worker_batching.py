"""The worker's batched passes (``c2c.serve.worker``), without a model: a fake engine that records each pass."""

from __future__ import annotations

import asyncio
import threading

from c2c.serve.auth import Principal
from c2c.serve.worker import Channel, Job, ModelWorker


class Seq:
    """A fake sequence: it counts the tokens fed to it; its "logits" are that count."""

    def __init__(self, name: str):
        self.name, self.n = name, 0

    def feed(self, ids):
        self.n += len(ids)
        return (self.name, self.n)


class Engine:
    """Runs a pass of several sequences, recording who was in it (and how many tokens each brought)."""

    def __init__(self, fail_on: str | None = None):
        self.passes: list[list[tuple[str, int]]] = []
        self.active, self.peak, self.lock = 0, 0, threading.Lock()
        self.fail_on, self.failed = fail_on, None

    def __call__(self, seqs, ids):
        with self.lock:
            self.active += 1
            self.peak = max(self.peak, self.active)
        try:
            self.passes.append([(s.name, len(x)) for s, x in zip(seqs, ids)])
            threading.Event().wait(0.01)   # a forward pass
            if self.fail_on is not None and any(s.name == self.fail_on for s in seqs) and len(self.passes) > 3:
                self.failed = [s.name for s in seqs]
                raise RuntimeError("the pass failed")
            return [s.feed(x) for s, x in zip(seqs, ids)]
        finally:
            with self.lock:
                self.active -= 1


def _run(engine: Engine, jobs: dict[str, tuple[int, int, str]], max_batch: int = 16):
    """Each job: (prompt tokens, decode steps, agent); its prompt in 4-token chunks, then its steps. What each job
    returned (its last logits), or the exception it raised."""
    loop = asyncio.new_event_loop()
    worker = ModelWorker("m", max_queue=32, tenant_queue=32, batch=engine, max_batch=max_batch)
    out: dict[str, object] = {}
    done = threading.Event()
    lock = threading.Lock()

    def make(name: str, prompt: int, steps: int):
        def run(job: Job):
            seq = Seq(name)
            try:
                logits = None
                for a in range(0, prompt, 4):
                    logits = job.step(seq, list(range(a, min(a + 4, prompt))))
                for _ in range(steps):
                    logits = job.step(seq, [7])
                result = (logits, seq.n)
            except Exception as e:  # noqa: BLE001 - the test reads it
                result = e
            with lock:
                out[name] = result
                if len(out) == len(jobs):
                    done.set()
        return run

    try:
        for name, (prompt, steps, agent) in jobs.items():
            worker.submit(Job(make(name, prompt, steps), Channel(loop), timeout_s=30,
                              owner=Principal(agent=agent, domain="red"), lane=object()))
        assert done.wait(30)
    finally:
        worker.close(10)
        loop.close()
    return out


def test_decode_steps_of_many_jobs_share_a_pass_and_each_job_gets_its_own_logits():
    engine = Engine()
    jobs = {f"j{i}": (10, 20, "default") for i in range(6)}   # one agent, six requests without a session
    out = _run(engine, jobs)
    for name, (prompt, steps, _) in jobs.items():
        assert out[name] == ((name, prompt + steps), prompt + steps)   # its own sequence, every token once
    assert engine.peak == 1                                           # never two passes at once
    sizes = [len(p) for p in engine.passes]
    assert max(sizes) == 6                                            # all six decoded in one pass
    assert sum(sizes) / len(sizes) > 3                                # and mostly together
    for p in engine.passes:
        assert sum(1 for _, n in p if n > 1) <= 1                     # at most one prompt chunk a pass
        assert len({name for name, _ in p}) == len(p)                 # a job at most once a pass
    batched = sum(n for p in engine.passes for _, n in p)   # (a pass of one job alone is its own feed)
    assert batched > sum(s for _, s, _ in jobs.values())    # more than every decode step went through batches


def test_max_batch_bounds_a_pass():
    engine = Engine()
    out = _run(engine, {f"j{i}": (4, 10, "default") for i in range(6)}, max_batch=2)
    assert all(not isinstance(v, Exception) for v in out.values())
    assert max(len(p) for p in engine.passes) == 2


def test_a_failed_pass_fails_the_jobs_in_it_and_the_others_go_on():
    engine = Engine(fail_on="bad")
    jobs = {"bad": (4, 50, "a"), "late": (40, 5, "b")}
    out = _run(engine, jobs)
    assert isinstance(out["bad"], RuntimeError)
    assert engine.failed is not None and "bad" in engine.failed
    for name in engine.failed:   # every job of the failed pass got its failure; no job of another pass did
        assert isinstance(out[name], RuntimeError)
    assert all(not isinstance(out[n], Exception) for n in jobs if n not in engine.failed)


def test_a_job_cancelled_while_waiting_leaves_the_queue():
    loop = asyncio.new_event_loop()
    engine = Engine()
    worker = ModelWorker("m", max_queue=8, batch=engine)
    started, result = threading.Event(), {}

    def slow(job):   # a long decode that keeps the worker busy
        seq = Seq("slow")
        for _ in range(200):
            job.step(seq, [1])
            started.set()
        return "slow done"

    def waiter(job):
        try:
            seq = Seq("w")
            for _ in range(1000):
                job.step(seq, [1])
        except Exception as e:  # noqa: BLE001
            result["w"] = type(e).__name__

    try:
        worker.submit(Job(slow, Channel(loop), timeout_s=30, lane=object()))
        assert started.wait(10)
        w = worker.submit(Job(waiter, Channel(loop), timeout_s=30, lane=object()))
        threading.Event().wait(0.1)
        w.cancel.set()
        for _ in range(300):
            if "w" in result:
                break
            threading.Event().wait(0.01)
    finally:
        worker.close(10)
        loop.close()
    assert result["w"] == "Cancelled"


def test_an_engine_that_cannot_batch_runs_each_pass_alone_holding_the_turn(monkeypatch):
    state = {"active": 0, "peak": 0, "passes": 0}
    lock = threading.Lock()
    plain = Seq.feed

    def feed(self, ids):   # one pass on the job's own thread: count the passes running at once
        with lock:
            state["active"] += 1
            state["peak"] = max(state["peak"], state["active"])
            state["passes"] += 1
        threading.Event().wait(0.005)
        with lock:
            state["active"] -= 1
        return plain(self, ids)

    monkeypatch.setattr(Seq, "feed", feed)
    out = _run(None, {f"j{i}": (8, 6, "default") for i in range(3)})
    assert out == {f"j{i}": ((f"j{i}", 14), 14) for i in range(3)}
    assert state["peak"] == 1 and state["passes"] == 3 * (2 + 6)   # one job's pass at a time, each alone
