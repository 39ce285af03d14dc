"""What to do with a cache made under another role adapter (LoRA) of the same base.

A cache computed under adapter X and used under adapter Y is approximate: the
adapters change every K/V after layer 0. A team chooses one policy:

- ``refuse``: never (the default; the handoff falls back to text in ``auto``);
- ``verify``: re-compute the K/V at ``samples`` random positions under the
  receiver's adapter, using the artifact's own earlier cache as context, and
  accept when the largest relative divergence is at most ``bound``;
- ``reprefill``: the receiver re-computes the tokens itself (exact, costs a prefill).
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Literal

from c2c.errors import ConfigError, FingerprintMismatchError, VerificationFailedError
from c2c.runtime.kvcache import KVCache
from c2c.trust.verify import probe_errors, stratified_positions


@dataclass(frozen=True, kw_only=True)
class AdapterPolicy:
    mode: Literal["refuse", "verify", "reprefill"] = "refuse"
    bound: float = 0.05
    samples: int = 16

    def __post_init__(self) -> None:
        if self.mode not in ("refuse", "verify", "reprefill"):
            raise ConfigError(f"adapter policy must be refuse, verify or reprefill, not {self.mode!r}")


def divergence(runtime, cache: KVCache, samples: int, rng: random.Random | None = None) -> float:
    """Largest relative K/V error at ``samples`` positions, re-computed by ``runtime``."""

    if cache.start != 0:
        raise ConfigError("divergence needs a full cache (start 0)")
    rng = rng or random.SystemRandom()
    positions = stratified_positions(1, cache.end, samples, rng)
    return float(probe_errors(runtime, cache, positions).max())


def admit(policy: AdapterPolicy, runtime, artifact, error: FingerprintMismatchError,
          context: KVCache | None = None) -> tuple[KVCache, str]:
    """Decide about an artifact whose fingerprint differs from ours only in adapters.

    Returns the cache to attach and a note for the record, or raises.
    """
    if set(error.differences) != {"adapters"}:
        raise error
    theirs, ours = error.differences["adapters"][1], error.differences["adapters"][0]
    if policy.mode == "refuse":
        raise FingerprintMismatchError(
            f"{error} (adapter {list(theirs)} vs {list(ours)}; the team's adapter policy is 'refuse': "
            "set AdapterPolicy(mode='verify' or 'reprefill') to accept such caches)", error.differences)
    h = artifact.header
    if h.tokens is None:
        raise VerificationFailedError("the artifact withholds its tokens, so it cannot be checked or re-prefilled "
                                      "under this adapter")
    if policy.mode == "reprefill":
        if h.kind == "full":
            _, cache = runtime.prefill(list(h.tokens))
        else:
            _, cache = runtime.prefill(list(h.tokens), context)
            cache = cache.slice(context.end, cache.end)
        return cache, f"re-prefilled {h.seq_len} tokens under adapter {list(ours)}"
    if h.kind != "full":
        raise VerificationFailedError("adapter policy 'verify' needs a full cache; use 'reprefill' for slices")
    div = divergence(runtime, artifact.cache, policy.samples)
    if div > policy.bound:
        raise VerificationFailedError(
            f"cache made under adapter {list(theirs)} diverges by {div:.3f} (relative) under {list(ours)}, "
            f"above the team's bound {policy.bound}")
    return artifact.cache, f"accepted: divergence {div:.3f} ≤ bound {policy.bound}"
