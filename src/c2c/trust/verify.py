"""Check that a KV-cache encodes the tokens its header claims, with the receiver's own model.

A signature proves who made an artifact, not that the signer was honest. A
compromised agent inside the domain can sign a cache whose vectors do not come
from its claimed tokens ("vector-level injection"). The receiver re-computes
some or all of the K/V with its own copy of the model and compares:

``strict``
    Re-prefill every claimed token and compare every layer at every position.
    Costs one prefill of the artifact's span.
``sample``
    1. *Layer-0 sweep*: layer 0's K/V depend only on token and position, so they
       are recomputed at every position (about ``1/num_layers`` of a prefill).
       This catches any token swapped in the header and any edit of layer 0.
    2. *Deep probes*: ``k`` positions, one drawn uniformly from each of ``k``
       equal strata of the span, are recomputed at every layer, each token
       attending to the artifact's *own* earlier cache (the batched form of
       ``runtime.prefill([t_p], past=cache.slice(0, p))``). A probe at ``p``
       catches edits at ``p`` in any layer, and also edits at earlier positions
       of layers below the last, which change what ``p`` attends to. If a
       fraction ``f`` of one layer's positions was edited, the probes miss it
       with probability at most ``(1 - f) ** k`` (stratification only helps):
       ``k = 48`` gives at most 0.6% for ``f = 0.1``.
       Positions are drawn with ``random.SystemRandom`` so a sender cannot
       predict them.

What can be checked depends on what the receiver has:

- a full cache (``start == 0``): everything above;
- a slice (``start > 0``): its deeper layers depend on the context it was
  computed after. It is verified against the context it will be attached to:
  ``context`` is a cache of positions ``[0, start)``, normally the receiver's
  own shared-prefix cache, which is exactly what a slice exported with
  isolation ``"recompute"`` follows (:meth:`c2c.team.agent.Agent.export`). The
  slice is then checked like a full cache. A context that ends elsewhere means
  the slice was computed after positions the receiver does not hold, so it
  cannot be checked: :class:`UnverifiableError`. Without a context, ``strict``
  refuses with :class:`UnverifiableError`, and so does ``sample`` (a slice
  whose layers 1..N-1 were replaced by noise passes a layer-0 check), unless
  the caller accepts a partial check with ``allow_partial=True``: then layer 0
  only is checked and the report's note says so;
- sliding-window layers keep only the last ``W - 1`` tokens, so earlier
  positions cannot be re-computed from the artifact's own cache: ``sample`` then
  runs ``strict`` instead (the report says so);
- tokens withheld from the header: pass ``token_ids`` (checked against the
  header's ``token_digest``), otherwise :class:`UnverifiableError`.

Errors are relative: for each layer, position and K or V, the largest absolute
difference over heads and head_dim divided by the rms of the recomputed tensor
of that layer. Honest fp32 recomputation on CPU stays near 1e-5 (measured in
``benchmarks/results/trust_verify.md``); tolerances leave a wide margin and
depend on dtype and device (:func:`default_tolerance`).
"""

from __future__ import annotations

import random
import time
from dataclasses import asdict, dataclass, replace
from typing import Any, Callable, Literal, Sequence

import torch

from c2c.artifact.codec import Artifact
from c2c.artifact.fingerprint import Fingerprint
from c2c.canon import token_digest
from c2c.errors import ConfigError, UnverifiableError, VerificationFailedError
from c2c.runtime.kvcache import KVCache
from c2c.runtime.pace import ONE_PASS, Pace
from c2c.trust.probe import PROBE_CHUNK, kv_at_positions, layer0_kv

KVMode = Literal["sample", "strict"]
DEFAULT_SAMPLES = 48

# Relative tolerance per (dtype, device type). fp32 on CPU recomputes to ~1e-5
# (see the module docstring); the GPU may use TF32 or other kernels than the
# sender's; half precisions round at ~4e-3 (bf16) / ~5e-4 (fp16) per op and
# accumulate over layers.
_TOLERANCES = {
    ("float32", "cpu"): 1e-3,
    ("float32", "cuda"): 2e-2,
    ("float16", "cpu"): 5e-2,
    ("float16", "cuda"): 5e-2,
    ("bfloat16", "cpu"): 2e-1,
    ("bfloat16", "cuda"): 2e-1,
}


def default_tolerance(dtype: torch.dtype, device: torch.device | str) -> float:
    """The relative tolerance for a receiver computing in ``dtype`` on ``device``."""
    name = str(dtype).replace("torch.", "")
    kind = torch.device(device).type
    return _TOLERANCES.get((name, kind), _TOLERANCES.get((name, "cuda"), 2e-1))


@dataclass(frozen=True, kw_only=True)
class VerifyReport:
    """What a KV verification compared, and the largest error it saw."""

    mode: str                 # "sample" or "strict": what actually ran
    layers: str               # "all" or "0"
    deep_positions: int       # positions compared at every layer
    layer0_positions: int     # positions compared at layer 0
    max_error: float          # largest relative error seen
    tolerance: float
    worst: dict               # {"layer", "position", "tensor"} of the largest error
    seconds: float
    note: str = ""

    @property
    def passed(self) -> bool:
        return self.max_error <= self.tolerance

    def to_dict(self) -> dict:
        return asdict(self)


# ---------------------------------------------------------------- errors
def relative_errors(ref_k: Sequence[torch.Tensor], ref_v: Sequence[torch.Tensor],
                    got_k: Sequence[torch.Tensor], got_v: Sequence[torch.Tensor]) -> torch.Tensor:
    """Relative error per layer, tensor and position: ``(layers, 2, T)`` for K then V.

    Each input holds one ``(1, kv_heads, T, head_dim)`` tensor per layer, all with
    the same ``T``. Error = max over heads and head_dim of ``|ref - got|``, divided
    by the rms of ``ref`` over the whole layer tensor. NaN stays NaN (it fails).
    """
    rows = []
    for rk, rv, gk, gv in zip(ref_k, ref_v, got_k, got_v):
        pair = []
        for r, g in ((rk, gk), (rv, gv)):
            r, g = r.float(), g.float()
            scale = r.pow(2).mean().sqrt().clamp_min(1e-12)
            pair.append((r - g).abs().amax(dim=(0, 1, 3)) / scale)  # (T,)
        rows.append(torch.stack(pair))
    return torch.stack(rows)  # (L, 2, T)


def probe_errors(runtime, cache: KVCache, positions: Sequence[int]) -> torch.Tensor:
    """Relative errors ``(layers, 2, k)`` of ``cache`` at ``positions``, re-computed at every layer."""
    rk, rv = kv_at_positions(runtime, cache, positions)
    idx = torch.tensor([p - cache.start for p in positions], dtype=torch.long)
    gk = [k[:, :, idx] for k in cache.keys]
    gv = [v[:, :, idx] for v in cache.values]
    return relative_errors(rk, rv, gk, gv)


def layer0_errors(runtime, cache: KVCache) -> torch.Tensor:
    """Relative errors ``(2, T_0)`` of layer 0 at every position it holds."""
    rk, rv = layer0_kv(runtime, cache.token_ids, cache.start)
    return relative_errors([rk], [rv], [cache.keys[0]], [cache.values[0]])[0]


def stratified_positions(start: int, end: int, k: int, rng: random.Random) -> list[int]:
    """One position drawn uniformly from each of ``k`` equal strata of ``[start, end)``."""
    n = end - start
    if k >= n:
        return list(range(start, end))
    bounds = [start + (i * n) // k for i in range(k + 1)]
    return [rng.randrange(bounds[i], bounds[i + 1]) for i in range(k)]


# ---------------------------------------------------------------- verify
def claimed_tokens(artifact: Artifact, token_ids: Sequence[int] | None = None) -> tuple[int, ...]:
    """The token ids the artifact claims: from its header, or ``token_ids`` checked against its digest."""
    h = artifact.header
    if token_ids is not None:
        ids = tuple(int(t) for t in token_ids)
        if len(ids) != h.seq_len or token_digest(ids) != h.token_digest:
            raise VerificationFailedError("the token ids given do not match the artifact's token_digest")
        return ids
    if h.tokens is None:
        raise UnverifiableError("the artifact withholds its token ids, so its KV cannot be checked; "
                                "pass the token ids (e.g. from the sender's text) or accept it on signature only")
    return h.tokens


def slice_context(start: int, prefix_ids: Sequence[int],
                  prefix_cache: Callable[[Any], KVCache] | None = None) -> Callable[[Any], KVCache] | None:
    """What a cache starting at ``start`` is verified against, for a receiver whose shared prefix is
    ``prefix_ids``: the ``context=`` of :func:`verify_kv` and :func:`c2c.trust.verify_policy.check_received`.

    - ``start == 0``, a full cache: nothing (``None``); it is checked on its own.
    - ``start == len(prefix_ids)``, a slice that follows the shared prefix (isolation ``"recompute"``):
      the receiver's shared-prefix cache, as ``runtime -> cache`` so that it is computed only once the
      signature and prefix have been checked, and only if a KV check runs. ``prefix_cache`` computes it
      (say, a team's cached :meth:`~c2c.team.agent.Team.prefix_cache`); by default a prefill of
      ``prefix_ids``.
    - anywhere else: ``None``. The slice was computed after positions the receiver does not hold, so
      ``sample`` and ``strict`` refuse it (:class:`UnverifiableError`) unless the policy accepts a
      layer-0 check (``allow_partial``).
    """
    if start == 0 or start != len(prefix_ids):
        return None
    if prefix_cache is not None:
        return prefix_cache
    ids = list(prefix_ids)
    return lambda runtime: runtime.prefill(ids)[1]


def verify_kv(artifact: Artifact, runtime, *, mode: KVMode = "sample", samples: int = DEFAULT_SAMPLES,
              tolerance: float | None = None, context: KVCache | None = None,
              token_ids: Sequence[int] | None = None, rng: random.Random | None = None,
              layer0: bool = True, allow_partial: bool = False, engine: bool = True,
              pace: Pace = ONE_PASS) -> VerifyReport:
    """Re-compute the artifact's K/V with ``runtime``'s model and compare (see module docstring).

    Args:
        artifact: a decoded artifact (signature checks are separate: :mod:`c2c.trust.signing`).
        runtime: the receiver's model; its fingerprint must equal the artifact's, but for the
            numerics (other kernels or CPU classes round differently, within the tolerance).
        mode: ``"sample"`` or ``"strict"``.
        samples: deep probes ``k`` for ``sample``.
        tolerance: relative tolerance; default :func:`default_tolerance`.
        context: for a slice, the cache it will be attached to: positions ``[0, artifact.start)``
            (the receiver's shared-prefix cache for a slice that follows the prefix).
        token_ids: the claimed tokens when the header withholds them.
        rng: source of probe positions; default ``random.SystemRandom()``.
        layer0: run the layer-0 sweep in ``sample`` mode.
        allow_partial: accept a ``sample`` check of a slice without ``context`` at layer 0
            only (the report's note says so); by default that raises :class:`UnverifiableError`.
        engine: compare the fingerprints' engines; ``False`` for a cache of another engine that
            :func:`c2c.handoff.decide` allowed (``HandoffPolicy.cross_engine``), which this check is for.
        pace: the passes a ``strict`` re-prefill runs in (a server's prefill chunk, its turn free between them).

    Returns:
        a :class:`VerifyReport` (only when the artifact passed).

    Raises:
        FingerprintMismatchError: the receiver's model is not the artifact's.
        PrefixMismatchError: ``context`` is not the shared prefix the artifact claims to follow.
        UnverifiableError: the check asked for cannot be done (see module docstring): a slice
            without its context (unless ``allow_partial``), or with a context ending elsewhere.
        VerificationFailedError: some K/V differ beyond the tolerance; ``.report``
            holds the :class:`VerifyReport`.
    """
    if mode not in ("sample", "strict"):
        raise ConfigError(f"verification mode {mode!r}: use 'sample' or 'strict'")
    if mode == "sample" and samples < 0:
        raise ConfigError(f"samples={samples}: give a number of positions >= 0")
    t0 = time.perf_counter()
    h = artifact.header
    # compared within a tolerance: numerics aside (and the engine, where a decision allowed another one)
    Fingerprint.of(runtime).require_same(h.fingerprint, exact=False, engine=engine)
    cache = replace(artifact.cache, token_ids=claimed_tokens(artifact, token_ids))
    cache = cache.to(device=runtime.device)
    tol = default_tolerance(runtime.dtype, runtime.device) if tolerance is None else float(tolerance)

    full = cache
    if cache.start > 0:
        full = None
        if context is not None:
            if context.start != 0:
                raise ConfigError(f"context starts at {context.start}; give a cache from position 0 "
                                  "(e.g. the shared-prefix cache)")
            if context.end != cache.start:
                raise UnverifiableError(
                    f"the slice starts at position {cache.start} but the context it would be attached to ends "
                    f"at {context.end}: the slice was computed after positions the receiver does not hold, so "
                    "its layers above 0 cannot be checked; ask the sender to export it with isolation "
                    "'recompute' so that it follows the shared prefix, or hand off by text")
            if context.end == h.prefix.length:
                h.prefix.require_match(list(context.token_ids))
            full = context.to(device=runtime.device).append(cache)
        elif mode == "sample" and not allow_partial:
            raise UnverifiableError(
                f"a slice starting at {cache.start} without the context it follows is not verified beyond "
                "layer 0 (its deeper layers could be anything); pass context= (the receiver's shared-prefix "
                "cache, for a slice exported with isolation 'recompute'), or allow_partial=True to accept "
                "a layer-0 check")

    note = ""
    edited_from = _edited_from(cache)  # an edited cache: its K/V past this are approximate by design
    if edited_from is not None:
        if mode == "strict" or full is None or any(w is not None for w in cache.windows):
            raise UnverifiableError(
                "the cache was edited without a prefill (messages dropped), so its layers above 0 after the first "
                f"drop (position {edited_from}) are approximate by design and cannot be recomputed; a 'sample' "
                "check covers layer 0 everywhere and every layer before the drop, or re-prefill from text")
        note = (f"edited cache: layer 0 checked at every position, the deeper layers at positions before the first "
                f"drop ({edited_from}) only")
    if mode == "sample" and full is not None and _needs_strict(full, samples):
        mode, note = "strict", "sliding-window layers cannot be probed from the artifact's own cache; ran strict"
    found: list[dict] = []
    deep = n0 = 0
    if mode == "strict":
        if full is None:
            raise UnverifiableError(
                f"strict verification of a slice starting at {cache.start} needs the cache of positions "
                f"[0:{cache.start}) (context=...); without it only layer 0 can be checked (mode 'sample')")
        found.append(_worst(_strict(runtime, cache, context, pace), range(cache.start, cache.end)))
        deep = cache.seq_len
    else:
        deep_end = cache.end if edited_from is None else min(cache.end, edited_from)
        if full is not None and samples > 0 and deep_end > cache.start:
            pos = stratified_positions(cache.start, deep_end, samples, rng or random.SystemRandom())
            found.append(_worst(probe_errors(runtime, full, pos), pos))
            deep = len(pos)
        if layer0 or full is None:
            e0 = layer0_errors(runtime, cache)[None]  # (1, 2, T_0)
            found.append(_worst(e0, range(cache.layer_start(0), cache.end)))
            n0 = e0.shape[-1]
        if not found:
            raise ConfigError("nothing to check: samples=0 and layer0=False")
        if full is None:
            note = (f"partial check (allow_partial): slice starting at {cache.start} without its context, "
                    "only layer 0 was checked, layers above 0 are not verified; pass context= (the "
                    "shared-prefix cache) to check every layer")
    worst = max(found, key=lambda w: w["error"] if w["error"] == w["error"] else float("inf"))
    max_err = worst.pop("error")
    report = VerifyReport(mode=mode, layers="all" if deep else "0", deep_positions=deep, layer0_positions=n0,
                          max_error=max_err, tolerance=tol, worst=worst,
                          seconds=time.perf_counter() - t0, note=note)
    if not (max_err <= tol):
        err = VerificationFailedError(
            f"the KV does not encode the claimed tokens: layer {worst['layer']} {worst['tensor']} at position "
            f"{worst['position']} differs by {max_err:.3g} (relative), tolerance {tol:.3g} ({mode} check); "
            "refuse it and ask for the text instead")
        err.report = report
        raise err
    return report


def _edited_from(cache: KVCache) -> int | None:
    """Where an edited cache stops being what a prefill gives (its first dropped position); None if not edited."""
    if cache.edits is None:
        return None
    first = cache.edits.exact_until
    return cache.start if first is None else max(cache.start, first)


def _needs_strict(full: KVCache, samples: int) -> bool:
    """A sliding layer holds W - 1 tokens: the cache plus the appended probes must fit in it."""
    return any(w is not None and full.seq_len + min(samples, PROBE_CHUNK) > w - 1 for w in full.windows)


def _strict(runtime, cache: KVCache, context: KVCache | None, pace: Pace = ONE_PASS) -> torch.Tensor:
    """Re-prefill (at ``pace``) and compare every layer: errors ``(layers, 2, T)`` (sliding layers padded with 0)."""
    _, ref = pace.prefill(runtime, list(cache.token_ids), context)
    ref = ref.slice(cache.start, cache.end)
    T = cache.seq_len
    out = torch.zeros(cache.num_layers, 2, T)
    for layer in range(cache.num_layers):
        e = relative_errors([ref.keys[layer]], [ref.values[layer]], [cache.keys[layer]], [cache.values[layer]])[0]
        out[layer, :, T - e.shape[-1]:] = e
    return out


def _worst(errs: torch.Tensor, positions: Sequence[int]) -> dict:
    """Largest entry of ``(layers, 2, k)`` errors (NaN counts as largest), and where it is."""
    positions = list(positions)
    k = errs.shape[-1]
    assert len(positions) == k, (len(positions), k)
    i = int(torch.argmax(torch.nan_to_num(errs, nan=float("inf")).reshape(-1)))
    return {"layer": i // (2 * k), "position": int(positions[i % k]), "tensor": "kv"[(i // k) % 2],
            "error": float(errs.reshape(-1)[i])}
