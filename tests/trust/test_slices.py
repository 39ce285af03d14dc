"""Slices are verified against the context they are attached to, and exported so that they can be.

A compromised but trusted signer can send a slice whose layers 1..N-1 are noise;
a layer-0 check cannot see it. Receivers therefore check a slice after their
own shared-prefix cache, and senders re-prefill slices after that prefix
(isolation "recompute") so the check can run.
"""

import random

import pytest
import torch

from c2c.artifact.prefix import SharedPrefix
from c2c.errors import BadSignatureError, ConfigError, PrefixMismatchError, UnverifiableError, VerificationFailedError
from c2c.team.agent import Team
from c2c.trust.verify_policy import VerifyPolicy, check_received
from c2c.trust.signing import sign, verify_signature
from c2c.trust.verify import verify_kv

from .conftest import DOMAIN, SYSTEM, noised_above_layer0, slice_sender


def receiver_prefix(rt):
    """The receiver's own shared-prefix cache: another Team object, computed afresh."""
    return Team(shared=SharedPrefix.build(SYSTEM), domain=DOMAIN).prefix_cache(rt)


def test_noise_above_layer_0_is_caught_with_the_prefix_and_never_passes_silently(qwen, ring, key):
    honest = slice_sender(qwen, ring).export(labels=("evidence",))
    bad = noised_above_layer0(honest, key)
    assert verify_signature(bad, ring, domain=DOMAIN).key_id == key.key_id  # the signer is trusted
    assert torch.equal(bad.cache.keys[0], honest.cache.keys[0]) and bad.header.tokens == honest.header.tokens
    assert all(not torch.allclose(b, a) for b, a in zip(bad.cache.values[1:], honest.cache.values[1:]))
    prefix = receiver_prefix(qwen)
    with pytest.raises(VerificationFailedError) as e:
        verify_kv(bad, qwen, mode="sample", samples=8, context=prefix, rng=random.Random(0))
    assert e.value.report.worst["layer"] >= 1 and e.value.report.deep_positions == 8
    with pytest.raises(VerificationFailedError):
        verify_kv(bad, qwen, mode="strict", context=prefix)
    with pytest.raises(UnverifiableError, match="not verified beyond layer 0"):
        verify_kv(bad, qwen, mode="sample")  # a layer-0 check alone would pass it
    r = verify_kv(bad, qwen, mode="sample", allow_partial=True)
    assert r.passed and r.layers == "0" and r.deep_positions == 0
    assert "only layer 0" in r.note and "allow_partial" in r.note

    # the same through the receiver's one call
    with pytest.raises(VerificationFailedError):
        check_received(bad, ring, DOMAIN, runtime=qwen, context=prefix)
    with pytest.raises(UnverifiableError, match="not verified beyond layer 0"):
        check_received(bad, ring, DOMAIN, runtime=qwen)
    rep = check_received(bad, ring, DOMAIN, VerifyPolicy(allow_partial=True), runtime=qwen)
    assert rep.kv.layers == "0" and rep.to_dict()["policy"]["allow_partial"] is True
    with pytest.raises(VerificationFailedError):  # a critical handoff never accepts a partial check
        check_received(bad, ring, DOMAIN, VerifyPolicy(allow_partial=True), runtime=qwen, context=prefix, critical=True)


def test_honest_recomputed_slice_verifies_at_every_layer_against_the_receivers_prefix(qwen, ring, key):
    agent = slice_sender(qwen, ring)
    art = agent.export(labels=("evidence",))
    P = agent.context.prefix_len
    assert art.header.kind != "full" and art.header.start == P and art.header.labels["isolation"] == "recompute"
    prefix = receiver_prefix(qwen)
    r = verify_kv(art, qwen, mode="sample", samples=8, context=prefix, rng=random.Random(0))
    assert r.layers == "all" and r.deep_positions == 8 and r.max_error < 1e-4 and r.note == ""
    t = verify_kv(art, qwen, mode="strict", context=prefix)
    assert t.deep_positions == art.header.seq_len and t.max_error < 1e-4
    rep = check_received(art, ring, DOMAIN, runtime=qwen, context=prefix, prefix_ids=prefix.token_ids)
    assert rep.kv.layers == "all" and rep.kv.deep_positions > 0


def test_recompute_equals_a_fresh_prefill_without_the_private_spans_and_positions_does_not(qwen):
    agent = slice_sender(qwen)
    ctx, P = agent.context, agent.context.prefix_len
    ev = ctx.spans_labelled("evidence")[0]
    assert ctx.spans_labelled("role")[0].private and ev.start > P  # the private role precedes the evidence
    rec = agent.export(labels=("evidence",))                       # default: recompute
    pos = agent.export(labels=("evidence",), isolation="positions")
    assert rec.header.labels["isolation"] == "recompute" and pos.header.labels["isolation"] == "positions"
    assert pos.header.start == ev.start and rec.header.start == P

    _, fresh = qwen.prefill(list(ctx.token_ids[:P] + ctx.token_ids[ev.start:ev.end]))
    ref = fresh.slice(P, fresh.end)
    assert rec.cache.token_ids == ref.token_ids == ctx.token_ids[ev.start:ev.end]
    for layer in range(ref.num_layers):
        assert (rec.cache.keys[layer] - ref.keys[layer]).abs().max() < 1e-5, layer
        assert (rec.cache.values[layer] - ref.values[layer]).abs().max() < 1e-5, layer

    moved = qwen.reposition(pos.cache, P)  # same positions as the reference: only the attended context differs
    assert (moved.keys[0] - ref.keys[0]).abs().max() < 1e-5 and (moved.values[0] - ref.values[0]).abs().max() < 1e-5
    for layer in range(1, ref.num_layers):  # attention carried the private role into every layer above 0
        assert (moved.values[layer] - ref.values[layer]).abs().max() > 1e-3, layer

    with pytest.raises(ConfigError, match="isolation"):
        agent.export(labels=("evidence",), isolation="clean")


def test_a_slice_after_positions_the_receiver_lacks_is_unverifiable(qwen):
    pos = slice_sender(qwen).export(labels=("evidence",), isolation="positions")
    prefix = receiver_prefix(qwen)
    assert pos.header.start > prefix.end
    for mode in ("sample", "strict"):
        with pytest.raises(UnverifiableError, match="recompute"):
            verify_kv(pos, qwen, mode=mode, context=prefix)


def test_context_must_be_the_claimed_prefix(qwen):
    art = slice_sender(qwen).export(labels=("evidence",))
    ids = list(receiver_prefix(qwen).token_ids)
    ids[-3] = ids[-3] + 1  # same length, one token off
    _, other = qwen.prefill(ids)
    assert other.end == art.header.start
    with pytest.raises(PrefixMismatchError):
        verify_kv(art, qwen, mode="sample", context=other)


def test_check_loads_the_runtime_and_builds_the_context_only_after_trust(qwen, ring, key):
    art = slice_sender(qwen, ring).export(labels=("evidence",))
    prefix = receiver_prefix(qwen)
    loads, contexts = [], []

    def loader():
        loads.append(1)
        return qwen

    def context(rt):
        contexts.append(rt)
        return prefix

    other = slice_sender(qwen).export(labels=("evidence",), isolation="positions")
    replayed = art.with_signature(sign(other, key).signature)
    with pytest.raises(BadSignatureError):
        check_received(replayed, ring, DOMAIN, runtime=loader, context=context)
    with pytest.raises(PrefixMismatchError):
        check_received(art, ring, DOMAIN, runtime=loader, context=context, prefix_ids=[1, 2, 3])
    assert loads == [] and contexts == []
    rep = check_received(art, ring, DOMAIN, runtime=loader, context=context)
    assert loads == [1] and contexts == [qwen] and rep.kv.layers == "all"


def test_policy_allow_partial_round_trips_and_is_validated():
    p = VerifyPolicy(allow_partial=True)
    assert VerifyPolicy.from_dict(p.to_dict()) == p and VerifyPolicy().allow_partial is False
    assert p.for_handoff(critical=True).allow_partial is False
    with pytest.raises(ConfigError):
        VerifyPolicy(allow_partial="yes")


def test_slice_context_is_the_receivers_prefix_cache_for_a_slice_that_follows_it_and_nothing_else(qwen, ring, key):
    """The one rule the library's handoff, the server and `c2c continue`/`verify` verify slices by."""
    from c2c.artifact.prefix import prefix_token_ids
    from c2c.trust.verify import slice_context

    agent = slice_sender(qwen, ring)
    honest = agent.export(labels=("evidence",))                          # recompute: starts after the prefix
    positions = agent.export(labels=("evidence",), isolation="positions")  # after the private role
    ids = prefix_token_ids(qwen, SYSTEM)
    assert honest.header.start == len(ids) < positions.header.start
    assert slice_context(0, ids) is None                                 # a full cache needs no context
    assert slice_context(positions.header.start, ids) is None            # computed after what we do not hold
    made = slice_context(honest.header.start, ids)(qwen)
    assert made.start == 0 and made.token_ids == ids and made.end == honest.header.start
    assert torch.equal(made.keys[-1], receiver_prefix(qwen).keys[-1])
    cached = Team(shared=SharedPrefix.build(SYSTEM), domain=DOMAIN)
    assert slice_context(honest.header.start, ids, cached.prefix_cache) == cached.prefix_cache
    # through check(): computed only after the signature and prefix checks, and it catches deep noise
    assert check_received(honest, ring, DOMAIN, runtime=qwen, prefix_ids=ids,
                 context=slice_context(honest.header.start, ids)).kv.layers == "all"
    with pytest.raises(VerificationFailedError):
        check_received(noised_above_layer0(honest, key), ring, DOMAIN, runtime=qwen, prefix_ids=ids,
              context=slice_context(honest.header.start, ids))
    with pytest.raises(UnverifiableError, match="not verified beyond layer 0"):
        check_received(positions, ring, DOMAIN, runtime=qwen, prefix_ids=ids, context=slice_context(positions.header.start, ids))
