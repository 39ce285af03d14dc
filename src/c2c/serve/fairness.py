"""Who goes next: the key that has had the least of a resource recently.

A :class:`UsageClock` keeps, per key (a tenant, an agent), the seconds of a
resource it used, decaying with a half-life: use from one half-life ago counts
half. The scheduler of :mod:`c2c.serve.worker` gives a model's next forward pass
to the waiting tenant with the least recent use. So a tenant that used less than
the others recently goes first (a light user is not slowed down by a heavy one),
and tenants that all want the model all the time end up taking turns, pass by
pass.

NOTE: a newcomer starts with no use, so a heavy tenant that just arrived goes
first until its use catches up with the others' (about one half-life when the
others were busy all along); that is the price of letting a light user go first.
"""

from __future__ import annotations

import math
from typing import Hashable, Iterable, TypeVar

K = TypeVar("K", bound=Hashable)


class UsageClock:
    """Recent use per key, in seconds, decaying with ``half_life_s`` (not thread-safe: the caller locks)."""

    def __init__(self, half_life_s: float):
        if not half_life_s > 0:
            raise ValueError("half_life_s must be > 0")
        self._rate = math.log(2) / half_life_s
        self._used: dict[Hashable, tuple[float, float]] = {}  # key -> (seconds, as of this time)

    def usage(self, key: Hashable, now: float) -> float:
        """``key``'s recent use at time ``now`` (seconds, each weighted by how long ago)."""
        used, at = self._used.get(key, (0.0, now))
        return used * math.exp(-self._rate * max(now - at, 0.0))

    def charge(self, key: Hashable, seconds: float, now: float) -> None:
        """Add ``seconds`` of use to ``key`` at time ``now``."""
        self._used[key] = (self.usage(key, now) + max(seconds, 0.0), now)
        if len(self._used) > 4096:  # forget keys whose use has decayed to nothing
            self._used = {k: v for k, v in self._used.items() if self.usage(k, now) > 1e-9}

    def least(self, keys: Iterable[K], now: float) -> K:
        """The key of ``keys`` with the least recent use; the first of them on a tie."""
        return min(keys, key=lambda k: self.usage(k, now))
