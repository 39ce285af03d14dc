"""Verification policy, and the one call a receiver makes before attaching a cache.

A :class:`VerifyPolicy` is set per trust domain (stored in the keyring,
``Keyring.set_policy``) and tightened per handoff: a *critical* handoff is always
verified strictly, routine ones rely on the signature (``kv="none"``) or on
sampling. :func:`check` runs, in order:

1. the signature (:func:`c2c.trust.signing.verify_signature`), required unless
   the policy says otherwise; a present signature is always checked;
2. the shared prefix, when the receiver passes its prefix token ids;
3. only then any work the unverified artifact could direct: a lazily given
   runtime is loaded and a lazily given context computed;
4. the model fingerprint, when a runtime is given;
5. the KV check the policy asks for (:func:`c2c.trust.verify.verify_kv`). A
   slice is checked against the context it will be attached to (the
   receiver's shared-prefix cache); without one, a sampled check refuses
   unless the policy has ``allow_partial``.

It returns a :class:`TrustReport` to record, or raises the specific
:class:`~c2c.errors.C2CError`. A handoff that gets a :class:`~c2c.errors.TrustError`
or :class:`~c2c.errors.IncompatibleCacheError` falls back to text.
"""

from __future__ import annotations

import random
from dataclasses import asdict, dataclass, replace
from typing import Any, Callable, Literal, Sequence

from c2c.artifact.codec import Artifact
from c2c.artifact.fingerprint import Fingerprint
from c2c.errors import ConfigError
from c2c.runtime.kvcache import KVCache
from c2c.runtime.pace import ONE_PASS, Pace
from c2c.runtime.protocol import Runtime
from c2c.trust.keys import Keyring
from c2c.trust.signing import SignerInfo, verify_signature
from c2c.trust.verify import DEFAULT_SAMPLES, VerifyReport, verify_kv

KVCheck = Literal["none", "sample", "strict"]


@dataclass(frozen=True, kw_only=True)
class VerifyPolicy:
    """How much a receiver checks before attaching a cache.

    Attributes:
        kv: ``"none"`` (signature only), ``"sample"`` (layer-0 sweep + ``samples``
            deep probes) or ``"strict"`` (full re-prefill).
        samples: deep probes for ``"sample"``; 48 bounds the miss probability of
            an edit to 10% of one layer's positions by 0.9**48 < 0.7%.
        require_signature: refuse unsigned artifacts.
        tolerance: relative tolerance, or ``None`` for the dtype/device default.
        allow_partial: accept a ``"sample"`` check of a slice that comes without its
            context at layer 0 only (its deeper layers stay unverified); by default
            such a check raises :class:`~c2c.errors.UnverifiableError`.
    """

    kv: KVCheck = "sample"
    samples: int = DEFAULT_SAMPLES
    require_signature: bool = True
    tolerance: float | None = None
    allow_partial: bool = False

    def __post_init__(self) -> None:
        if self.kv not in ("none", "sample", "strict"):
            raise ConfigError(f"policy kv={self.kv!r}: use 'none', 'sample' or 'strict'")
        if not isinstance(self.samples, int) or self.samples < 1:
            raise ConfigError(f"policy samples={self.samples!r}: give a positive number of positions")
        if self.tolerance is not None and not self.tolerance > 0:
            raise ConfigError(f"policy tolerance={self.tolerance!r}: give a positive number")
        if not isinstance(self.allow_partial, bool):
            raise ConfigError(f"policy allow_partial={self.allow_partial!r}: give true or false")

    def for_handoff(self, *, critical: bool) -> "VerifyPolicy":
        """This policy, made strict when the handoff is critical."""
        return replace(self, kv="strict", require_signature=True, allow_partial=False) if critical else self

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "VerifyPolicy":
        unknown = set(d) - {"kv", "samples", "require_signature", "tolerance", "allow_partial"}
        if unknown:
            raise ConfigError(f"unknown policy fields {sorted(unknown)}")
        return cls(**d)


#: signature only: for routine handoffs between agents that share a host
ROUTINE = VerifyPolicy(kv="none")
#: the default for a domain without a stored policy
DEFAULT = VerifyPolicy()
#: every layer at every position
STRICT = VerifyPolicy(kv="strict")


def policy_for(keyring: Keyring, domain: str, *, critical: bool = False) -> VerifyPolicy:
    """The policy stored for ``domain`` (or :data:`DEFAULT`), strict when ``critical``."""
    stored = keyring.policy_dict(domain)
    policy = VerifyPolicy.from_dict(stored) if stored else DEFAULT
    return policy.for_handoff(critical=critical)


@dataclass(frozen=True, kw_only=True)
class TrustReport:
    """What :func:`check` established about an artifact; record it with the handoff."""

    artifact: str
    domain: str
    policy: VerifyPolicy
    signer: SignerInfo | None
    kv: VerifyReport | None

    def to_dict(self) -> dict[str, Any]:
        return {"artifact": self.artifact, "domain": self.domain, "policy": self.policy.to_dict(),
                "signer": asdict(self.signer) if self.signer else None,
                "kv": self.kv.to_dict() if self.kv else None}


def check_received(artifact: Artifact, keyring: Keyring, domain: str, policy: VerifyPolicy | None = None, *,
          runtime=None, critical: bool = False, prefix_ids: Sequence[int] | None = None,
          context: KVCache | Callable[[Any], KVCache] | None = None, token_ids: Sequence[int] | None = None,
          rng: random.Random | None = None, exact: bool = True, engine: bool = True,
          pace: Pace = ONE_PASS) -> TrustReport:
    """Everything a receiver in ``domain`` checks before attaching ``artifact``.

    Nothing the unverified header names is acted on before the signature, the
    domain and the prefix have been checked: pass ``runtime`` (and ``context``)
    as callables to load the model (and compute the context) only then.

    Args:
        artifact: the decoded artifact.
        keyring: the receiver's keyring.
        domain: the receiver's trust domain.
        policy: the policy; default the one stored for ``domain`` (see :func:`policy_for`).
        runtime: the receiver's model, or a zero-argument callable that loads it (called only
            after the signature, domain and prefix checks passed, and only when needed); needed
            for ``kv`` checks and the fingerprint check.
        critical: make the policy strict for this handoff.
        prefix_ids: the receiver's shared-prefix token ids, checked against the artifact's.
        context: for a slice, the cache of ``[0, start)`` it will be attached to (the receiver's
            shared-prefix cache; see :func:`verify_kv`), or a callable ``runtime -> cache``
            called after the runtime is loaded.
        token_ids: the claimed tokens when the header withholds them.
        rng: probe-position source (tests and benchmarks fix it; default is unpredictable).
        exact: the runtime's fingerprint must equal the artifact's, numerics included (a cache about to
            be attached); ``False`` for a check that only reports on the K/V within a tolerance
            (``c2c verify``), where another CPU class or kernel is not a mismatch.
        engine: compare the engines; ``False`` where :func:`c2c.handoff.decide` rules on them (a
            :class:`~c2c.handoff.cross_engine.CrossEnginePolicy`), which then forces its own K/V check.
        pace: the passes a ``strict`` check's re-prefill runs in (a server's prefill chunk).

    Raises:
        UnsignedArtifactError, BadSignatureError, UnknownSignerError, RevokedSignerError,
        DomainMismatchError: the signature check failed.
        PrefixMismatchError, FingerprintMismatchError: the artifact does not fit here.
        VerificationFailedError, UnverifiableError: the KV check failed or cannot run.
        ConfigError: the policy needs a runtime and none was given.
    """
    policy = (policy or policy_for(keyring, domain)).for_handoff(critical=critical)
    signer = None
    if policy.require_signature or artifact.signature is not None:
        signer = verify_signature(artifact, keyring, domain=domain)
    if prefix_ids is not None:
        artifact.header.prefix.require_match(list(prefix_ids))
    # Trusted from here on: only now load what the header names, or compute anything.
    if callable(runtime) and not isinstance(runtime, Runtime):  # a loader, not a runtime
        runtime = runtime()
    kv = None
    if policy.kv != "none":
        if runtime is None:
            raise ConfigError(f"the {policy.kv!r} KV check needs the receiver's runtime (runtime=...)")
        Fingerprint.of(runtime).require_same(artifact.header.fingerprint, exact=exact, engine=engine)
        if callable(context):
            context = context(runtime)
        kv = verify_kv(artifact, runtime, mode=policy.kv, samples=policy.samples, tolerance=policy.tolerance,
                       context=context, token_ids=token_ids, rng=rng, allow_partial=policy.allow_partial,
                       engine=engine, pace=pace)
    elif runtime is not None:
        Fingerprint.of(runtime).require_same(artifact.header.fingerprint, engine=engine)
    return TrustReport(artifact=artifact.id, domain=domain, policy=policy, signer=signer, kv=kv)
