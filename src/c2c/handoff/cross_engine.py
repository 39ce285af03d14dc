"""Cross-engine attach: a cache another engine computed from the same weights, taken only by explicit opt-in.

vLLM's CPU attention and c2c's transformers runtime, loading the same safetensors in the same
dtype, compute nearly the same K/V (``benchmarks/vllm_fidelity.py`` measures how nearly). Nearly,
not exactly: the fingerprint names the engine (``backend``), so by default :func:`c2c.handoff.decide`
refuses such a cache as it refuses another model (``auto`` sends text, ``full`` raises
:class:`~c2c.errors.FingerprintMismatchError`), and its reason names the two engines and this opt-in.

The opt-in is a :class:`CrossEnginePolicy` on :attr:`c2c.handoff.policy.HandoffPolicy.cross_engine`,
carrying the measured :class:`EngineFidelity`. It allows a cache when

- the two fingerprints differ in the engine only: the weights digest, dtype, architecture, layers,
  KV heads, head dim, RoPE, tokenizer and adapters are equal;
- the two engines are the pair that was measured, the dtype the one it was measured in, and the
  weights the ones it was measured on (where the record names them).

:func:`decide` then takes the cache path with :attr:`~c2c.handoff.decide.Decision.verify` set
(``"sample"``, or ``"strict"`` where the policy asks) and the fidelity in ``Decision.fidelity``, so
the record of the hop carries what the cache was allowed on. The receiver runs that K/V check
against its own model before attaching, whatever its trust domain's policy says
(:func:`enforce`); a cache that fails it is refused (``auto`` falls back to text).
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any, Callable, Literal

from c2c.artifact.codec import Artifact
from c2c.artifact.fingerprint import Fingerprint
from c2c.errors import ConfigError
from c2c.runtime.kvcache import KVCache
from c2c.trust.verify import DEFAULT_SAMPLES, default_tolerance, verify_kv

OPT_IN = "HandoffPolicy(cross_engine=CrossEnginePolicy(fidelity=EngineFidelity.from_results(...)))"


@dataclass(frozen=True, kw_only=True)
class EngineFidelity:
    """How closely two engines agree on one model in one dtype, as ``benchmarks/vllm_fidelity.py`` measured.

    Attributes:
        engines: the two engine kinds (``EngineId.kind``), sorted: ``("transformers", "vllm")``.
        dtype: the dtype both ran in.
        prompts: how many prompts were measured.
        rel_kv_median / rel_kv_max: ``||kv_a - kv_b|| / ||kv_b||`` of each prompt's worst layer, median
            and max over the prompts.
        top1_agreement: fraction of greedy answer positions where one engine's argmax, teacher-forced,
            equals the other's token.
        exact_match: fraction of whole greedy continuations that were identical.
        weights_digest: the weights measured on; where set, only caches of these weights are allowed.
        model / source: informational: the model's name and the results file, by its path in the repository.
    """

    engines: tuple[str, ...]
    dtype: str
    prompts: int
    rel_kv_median: float
    rel_kv_max: float
    top1_agreement: float
    exact_match: float
    weights_digest: str = ""
    model: str = ""
    source: str = ""

    def __post_init__(self) -> None:
        engines = tuple(sorted(self.engines)) if isinstance(self.engines, (tuple, list)) else ()
        if len(engines) != 2 or len(set(engines)) != 2 or not all(isinstance(e, str) and e for e in engines):
            raise ConfigError(f"engines={self.engines!r}: name the two engines measured, e.g. ('transformers', 'vllm')")
        object.__setattr__(self, "engines", engines)
        if not isinstance(self.prompts, int) or isinstance(self.prompts, bool) or self.prompts < 1:
            raise ConfigError(f"prompts={self.prompts!r}: give the number of prompts measured (at least 1)")
        for name in ("rel_kv_median", "rel_kv_max"):
            v = getattr(self, name)
            if not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
                raise ConfigError(f"{name}={v!r}: give the measured relative difference (a finite number >= 0)")
        for name in ("top1_agreement", "exact_match"):
            v = getattr(self, name)
            if not isinstance(v, (int, float)) or not 0 <= v <= 1:
                raise ConfigError(f"{name}={v!r}: give the measured fraction, between 0 and 1")

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["engines"] = list(self.engines)
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "EngineFidelity":
        if not isinstance(d, dict):
            raise ConfigError(f"an engine fidelity record is a JSON object, not {type(d).__name__}")
        unknown = set(d) - {f.name for f in fields(cls)}
        if unknown:
            raise ConfigError(f"unknown engine fidelity fields {sorted(unknown)}")
        try:
            return cls(**{**d, "engines": tuple(d.get("engines", ()))})
        except TypeError as e:
            raise ConfigError(f"an engine fidelity record lacks fields: {e}") from None

    @classmethod
    def from_results(cls, path: str | Path, *, dtype: str = "bfloat16") -> "EngineFidelity":
        """The record of one dtype in a ``benchmarks/vllm_fidelity.py`` results file (its ``.json``).

        Raises:
            ConfigError: the file is missing, or has no run in ``dtype``.
        """
        path = Path(path)
        try:
            out = json.loads(path.read_text())
        except (OSError, ValueError) as e:
            raise ConfigError(f"cannot read the fidelity results {path}: {e}") from None
        try:
            run = out["dtypes"][dtype]
        except (KeyError, TypeError):
            raise ConfigError(f"{path} has no {dtype} run; run benchmarks/vllm_fidelity.py --dtypes {dtype}") from None
        try:
            s = run["summary"]
            return cls(engines=("transformers", "vllm"), dtype=dtype, prompts=s["prompts"],
                       rel_kv_median=s["rel_kv_median"], rel_kv_max=s["rel_kv_max"], top1_agreement=s["top1_own"],
                       exact_match=s["exact_own"], weights_digest=run.get("weights_digest", ""),
                       model=out.get("model", ""), source=f"benchmarks/results/{path.name}")
        except (KeyError, TypeError, AttributeError) as e:
            raise ConfigError(f"{path}'s {dtype} run is not a vllm_fidelity.py summary (missing {e}); "
                              "rerun benchmarks/vllm_fidelity.py") from None

    def summary(self) -> str:
        return (f"measured on {self.prompts} prompts in {self.dtype}: relative K/V difference median "
                f"{self.rel_kv_median:.1e}, max {self.rel_kv_max:.1e}; greedy top-1 agreement "
                f"{100 * self.top1_agreement:.1f}%")


@dataclass(frozen=True, kw_only=True)
class CrossEnginePolicy:
    """The opt-in to attach caches of another engine (see the module docstring).

    Attributes:
        fidelity: what was measured for the pair of engines; the rule allows only that pair, dtype and weights.
        verify: the K/V check forced before every such attach: ``"sample"`` (the default; the layer-0
            sweep and 48 deep probes) or ``"strict"`` (a full re-prefill). NOTE: in bf16 a one-pass
            re-prefill differs from vLLM's prefill-then-decode by more than the bf16 tolerance at some
            positions: strict refused 1 of 64 honest commits (``benchmarks/results/vllm_fidelity.md``).
    """

    fidelity: EngineFidelity
    verify: Literal["sample", "strict"] = "sample"

    def __post_init__(self) -> None:
        if not isinstance(self.fidelity, EngineFidelity):
            raise ConfigError("CrossEnginePolicy.fidelity must be an EngineFidelity (EngineFidelity.from_results(...))")
        if self.verify not in ("sample", "strict"):
            raise ConfigError(f"CrossEnginePolicy verify={self.verify!r}: use 'sample' or 'strict'")


def rule(sender: Fingerprint, receiver: Fingerprint, policy: CrossEnginePolicy | None) -> tuple[bool, str] | None:
    """The fingerprint verdict ``(ok, detail)`` when the two differ in the engine only; else None (the
    ordinary rule applies: the same engine, or more than the engine differs)."""
    diff = sender.diff(receiver)
    a, b = sender.backend.kind, receiver.backend.kind
    if set(diff) != {"backend"} or a == b:
        return None
    engines = f"engines differ ({a} made the cache, {b} would attach it; same weights, dtype and shapes)"
    refused = f"models differ in backend: {engines}"
    if policy is None:
        if b == "vllm":  # the connector has no model of its own in-process to run the forced check with
            return False, f"{refused}; a vLLM instance attaches only vLLM caches (it cannot run the K/V check " \
                          "a cross-engine attach forces); send the text, or attach it in c2c's own runtime"
        return False, f"{refused}; cross-engine attach is off unless opted in: {OPT_IN}"
    f = policy.fidelity
    if tuple(sorted((a, b))) != f.engines:
        return False, f"{refused}; the cross-engine policy was measured for {f.engines}"
    if sender.dtype != f.dtype:
        return False, f"{refused}; the cross-engine policy was measured in {f.dtype}, not {sender.dtype}"
    if f.weights_digest and sender.weights_digest != f.weights_digest:
        return False, f"{refused}; the cross-engine policy was measured on other weights ({f.model or 'unnamed'})"
    return True, f"{engines}: allowed by the cross-engine policy ({f.summary()}); {policy.verify} K/V check forced"


def terms(sender: Fingerprint, receiver: Fingerprint, policy: CrossEnginePolicy | None) -> dict[str, Any]:
    """What a cache path allowed across engines carries (``verify``, ``fidelity``); ``{}`` when none is."""
    ruling = rule(sender, receiver, policy)
    if ruling is None or not ruling[0]:
        return {}
    return {"verify": policy.verify, "fidelity": policy.fidelity.to_dict()}


def _as_strong(done: dict, verify: str, artifact: Artifact, runtime) -> bool:
    """Whether a K/V check the receiver's trust checks already ran is at least the forced one: the same
    mode or strict, every layer, at most the default tolerance, and at least as many deep positions
    (a domain's own policy may have allowed layer 0 only, a looser tolerance or fewer samples)."""
    if done.get("mode") not in (verify, "strict") or done.get("layers") != "all":
        return False
    if done.get("tolerance", math.inf) > default_tolerance(runtime.dtype, runtime.device):
        return False
    want = artifact.header.seq_len if done["mode"] == "strict" else min(DEFAULT_SAMPLES, artifact.header.seq_len)
    return done.get("deep_positions", 0) >= want


def enforce(decision, artifact: Artifact, runtime, *, trust: dict | None = None,
            context: KVCache | Callable[[Any], KVCache] | None = None) -> dict | None:
    """Run the K/V check a cross-engine ``decision`` forces, before the cache is attached.

    Args:
        decision: :func:`c2c.handoff.decide`'s :class:`~c2c.handoff.decide.Decision`; nothing to do
            unless its ``verify`` is set.
        trust: the receiver's trust report (``TrustReport.to_dict()``), if its checks ran: a K/V check
            there at least as strong is not repeated.
        context: for a slice, the cache it follows (see :func:`c2c.trust.verify.verify_kv`), or a
            callable ``runtime -> cache`` (:func:`c2c.trust.verify.slice_context`), called only if a check runs.

    Returns:
        the :class:`~c2c.trust.verify.VerifyReport` as a dict, or None when nothing was forced.

    Raises:
        VerificationFailedError, UnverifiableError: the cache may not be attached.
    """
    if decision.verify is None:
        return None
    done = (trust or {}).get("kv")
    if done and _as_strong(done, decision.verify, artifact, runtime):
        return done
    if callable(context):
        context = context(runtime)
    return verify_kv(artifact, runtime, mode=decision.verify, context=context, engine=False).to_dict()
