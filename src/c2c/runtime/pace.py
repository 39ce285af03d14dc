"""`Pace`: long work cut into forward passes of a bounded size, with a call before each.

A server shares one model between tenants by handing the model's turn over between
forward passes (:mod:`c2c.serve.worker`). Work done in one pass holds every other tenant
for its whole length, however long: a 5,000-token prefill, a repair that recomputes a
whole conversation, the prefix before an imported slice. So every forward pass a served
request makes goes through a :class:`Pace`: at most ``chunk`` tokens a pass, and
``between()`` before each pass, where the turn may pass to another tenant (and where a
cancelled or timed-out request stops).

The library's own calls take :data:`ONE_PASS` (no cut, nothing between), the pace of a
single caller that holds the model alone.

A chunked prefill rounds as any split prefill does: CPU matrix products block by rows, so
even in fp32 the K/V are within rounding of one pass's (1e-5 on the tiny test model), not
bit-equal; greedy tokens agree.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Iterator, Sequence

import torch

from c2c.runtime.kvcache import KVCache
from c2c.runtime.protocol import Runtime, Stepper


def _nothing() -> None:
    return None


@dataclass(frozen=True, kw_only=True)
class Pace:
    """At most ``chunk`` tokens a forward pass (0: one pass), and ``between()`` before each pass.

    ``between`` may raise (the request was cancelled or ran past its deadline): the work stops there, and
    nothing the caller holds has changed (every function here returns new caches).
    """

    chunk: int = 0
    between: Callable[[], None] = field(default=_nothing, compare=False, repr=False)
    #: a pass that someone else runs (a server packs the passes of its requests into one forward pass):
    #: ``join(stepper, ids)`` feeds ``ids`` after ``stepper`` and returns the last logits ``(vocab,)``; it also
    #: does what ``between`` does. None: each pass is the stepper's own, after ``between()``
    join: Callable[[Stepper, list[int]], torch.Tensor] | None = field(default=None, compare=False, repr=False)

    def __post_init__(self) -> None:
        if self.chunk < 0:
            raise ValueError(f"chunk must be >= 0 tokens (0: one pass), got {self.chunk}")

    def runs(self, n: int) -> Iterator[tuple[int, int]]:
        """The index ranges ``[a, b)`` of ``n`` items, one per pass, ``between()`` called before each."""
        step = self.chunk if self.chunk > 0 else max(n, 1)
        for a in range(0, n, step):
            self.between()
            yield a, min(a + step, n)

    def feed(self, stepper: Stepper, ids: Sequence[int]) -> torch.Tensor:
        """Feed ``ids`` to ``stepper`` pass by pass (each by ``join`` when given); the last position's logits
        ``(vocab,)``. An empty ``ids`` is one empty pass (the logits of what the sequence holds)."""
        ids = list(ids)
        if self.join is not None and ids:
            step = self.chunk if self.chunk > 0 else len(ids)
            for a in range(0, len(ids), step):
                logits = self.join(stepper, ids[a:a + step])
            return logits
        logits = None
        for a, b in self.runs(len(ids)) if ids else [(0, 0)]:
            if not ids:
                self.between()
            logits = stepper.feed(ids[a:b])
        return logits

    def step(self, stepper: Stepper, token: int) -> torch.Tensor:
        """One decode step: ``token`` fed after ``stepper`` (by ``join`` when given, else ``between()`` and the
        stepper's own pass); the logits ``(vocab,)``."""
        if self.join is not None:
            return self.join(stepper, [token])
        self.between()
        return stepper.feed([token])

    def prefill(self, runtime: Runtime, ids: Sequence[int], past: KVCache | None) -> tuple[torch.Tensor, KVCache]:
        """``runtime.prefill(ids, past)`` pass by pass: (the last position's logits ``(vocab,)``, the grown
        cache). The engine holds the sequence between passes (:meth:`Runtime.stepper`) and exports it once."""
        if self.join is None and (self.chunk == 0 or len(ids) <= self.chunk):  # one pass: the engine's own prefill
            self.between()
            return runtime.prefill(list(ids), past)
        seq = runtime.stepper(past)
        logits = self.feed(seq, ids)
        return logits, seq.cache()


#: the pace of a caller that holds the model alone: one pass, nothing between
ONE_PASS = Pace()
