"""VerifyPolicy and check_received(): one call that raises the specific error or returns what it established."""

import random
from dataclasses import replace

import pytest
import torch

from c2c.artifact import Artifact
from c2c.errors import (
    BadSignatureError,
    ConfigError,
    DomainMismatchError,
    FingerprintMismatchError,
    PrefixMismatchError,
    UnsignedArtifactError,
    VerificationFailedError,
)
from c2c.trust.verify_policy import DEFAULT, ROUTINE, STRICT, VerifyPolicy, check_received, policy_for
from c2c.trust.signing import sign

from .conftest import DOMAIN


def tampered(art: Artifact) -> Artifact:
    c = art.cache
    v = c.values[-1].clone()
    v[:, :, 5] += 3 * v.std()
    return Artifact.build(replace(c, values=c.values[:-1] + (v,)), fingerprint=art.header.fingerprint,
                          prefix=art.header.prefix)


def test_policy_validation_and_round_trip():
    assert DEFAULT.kv == "sample" and ROUTINE.kv == "none" and STRICT.kv == "strict"
    for bad in ({"kv": "maybe"}, {"samples": 0}, {"tolerance": -1.0}):
        with pytest.raises(ConfigError):
            VerifyPolicy(**bad)
    p = VerifyPolicy(kv="sample", samples=12, tolerance=1e-2)
    assert VerifyPolicy.from_dict(p.to_dict()) == p
    with pytest.raises(ConfigError):
        VerifyPolicy.from_dict({"kv": "none", "extra": 1})
    assert ROUTINE.for_handoff(critical=True).kv == "strict"
    assert ROUTINE.for_handoff(critical=False) is ROUTINE
    with pytest.raises(Exception):
        p.kv = "none"  # frozen


def test_policy_for_reads_the_domain_policy(ring):
    assert policy_for(ring, DOMAIN) == DEFAULT
    ring.set_policy(DOMAIN, ROUTINE.to_dict())
    assert policy_for(ring, DOMAIN) == ROUTINE
    assert policy_for(ring, DOMAIN, critical=True).kv == "strict"


def test_routine_check_is_signature_only(ring, key, qwen_art, qwen):
    report = check_received(sign(qwen_art, key), ring, DOMAIN, ROUTINE, runtime=qwen)
    assert report.signer.key_id == key.key_id and report.kv is None and report.artifact == qwen_art.id
    # ... so a compromised signer's tampered cache passes a routine check
    assert check_received(sign(tampered(qwen_art), key), ring, DOMAIN, ROUTINE).kv is None


def test_sampled_and_critical_checks_catch_a_compromised_signer(ring, key, qwen_art, qwen):
    report = check_received(sign(qwen_art, key), ring, DOMAIN, runtime=qwen, rng=random.Random(0))
    assert report.kv.mode == "sample" and report.kv.passed
    assert report.to_dict()["kv"]["deep_positions"] == DEFAULT.samples or report.kv.deep_positions == qwen_art.header.seq_len
    ring.set_policy(DOMAIN, ROUTINE.to_dict())
    bad = sign(tampered(qwen_art), key)
    assert check_received(bad, ring, DOMAIN, runtime=qwen).kv is None  # the domain's routine policy
    with pytest.raises(VerificationFailedError):
        check_received(bad, ring, DOMAIN, runtime=qwen, critical=True)


def test_check_raises_the_specific_error(ring, key, qwen_art, qwen, tiny):
    with pytest.raises(UnsignedArtifactError):
        check_received(qwen_art, ring, DOMAIN, ROUTINE)
    assert check_received(qwen_art, ring, DOMAIN, replace(ROUTINE, require_signature=False)).signer is None
    replayed = qwen_art.with_signature(sign(replace_tokens(qwen_art), key).signature)
    with pytest.raises(BadSignatureError):  # a present signature is always checked
        check_received(replayed, ring, DOMAIN, replace(ROUTINE, require_signature=False))
    with pytest.raises(DomainMismatchError):
        check_received(sign(qwen_art, key), ring, "ops", ROUTINE)
    with pytest.raises(ConfigError, match="runtime"):
        check_received(sign(qwen_art, key), ring, DOMAIN, DEFAULT)
    with pytest.raises(PrefixMismatchError):
        check_received(sign(qwen_art, key), ring, DOMAIN, ROUTINE, prefix_ids=[1, 2, 3])
    ids = list(qwen_art.header.tokens[: qwen_art.header.prefix.length])
    assert check_received(sign(qwen_art, key), ring, DOMAIN, ROUTINE, prefix_ids=ids).signer
    with pytest.raises(FingerprintMismatchError):
        check_received(sign(qwen_art, key), ring, DOMAIN, ROUTINE, runtime=tiny("llama"))


def replace_tokens(art: Artifact) -> Artifact:
    c = art.cache
    return Artifact.build(replace(c, token_ids=(0,) + c.token_ids[1:]), fingerprint=art.header.fingerprint,
                          prefix=art.header.prefix) if c.token_ids[0] != 0 else \
        Artifact.build(replace(c, keys=tuple(k + 1 for k in c.keys)), fingerprint=art.header.fingerprint,
                       prefix=art.header.prefix)


def test_noisy_cache_fails_kv_verification(qwen_art, qwen):
    from c2c.trust.noise import NoiseConfig, add_noise
    from c2c.trust.verify import verify_kv

    noisy = Artifact.build(add_noise(qwen_art.cache, NoiseConfig(sigma=0.05, seed=0)),
                           fingerprint=qwen_art.header.fingerprint, prefix=qwen_art.header.prefix)
    with pytest.raises(VerificationFailedError):
        verify_kv(noisy, qwen, mode="sample", samples=2)
    assert torch.isfinite(noisy.cache.keys[0]).all()
