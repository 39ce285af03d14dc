"""decide(): the one place the handoff rules live. Pure: no model, no I/O (maps are offered as descriptors)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from c2c.advise import Advice

from c2c.artifact.prefix import PrefixRef
from c2c.errors import (ConfigError, DomainMismatchError, FingerprintMismatchError, HandoffError, PrefixMismatchError,
                        StaleCommitError)
from c2c.handoff import CHECKS, HandoffPolicy, Party, decide, fall_back
from c2c.testing.synthetic import synthetic_fingerprint
from c2c.xmodel import MapCalibration, MapOffer

FP = synthetic_fingerprint()
BIG = replace(FP, num_layers=4, layer_types=("full_attention",) * 4, head_dim=16, weights_digest="3" * 64,
              model_name="synthetic-big")
PREFIX = PrefixRef.of(list(range(40)))


def party(name="a", **kw):
    base = dict(name=name, domain="lab", fingerprint=FP, prefix=PREFIX)
    return Party(**{**base, **kw})


def costs(cache_s: float, text_s: float):
    """The advisor's prediction for a hop: only its costs (decide() rules on them)."""
    return Advice(text_handoff_s=text_s, cache_handoff_s=cache_s, text_pipeline_s=text_s + 1,
                  cache_pipeline_s=cache_s + 1, artifact_bytes=1000, message_tokens=64)


def test_auto_takes_the_cache_when_every_check_passes_and_records_all_of_them():
    d = decide(party(), party("b"))
    assert (d.path, d.mode) == ("cache", "full")
    assert [c.name for c in d.checks] == list(CHECKS)
    assert all(c.ok for c in d.checks if c.name != "advisor") and d.check("advisor").ok is None
    assert d.to_dict()["checks"][0] == {"name": "domain", "ok": True, "detail": "same trust domain 'lab'"}


@pytest.mark.parametrize("change, check, error", [
    (dict(domain="other"), "domain", DomainMismatchError),
    (dict(domain=None), "domain", DomainMismatchError),
    (dict(fingerprint=replace(FP, head_dim=16)), "fingerprint", FingerprintMismatchError),
    (dict(prefix=PrefixRef.of(list(range(39)) + [7])), "prefix", PrefixMismatchError),
])
def test_each_failed_check_sends_auto_to_text_and_explicit_modes_to_its_error(change, check, error):
    d = decide(party(), party("b", **change))
    assert d.path == "text" and d.check(check).ok is False and d.reason.startswith("fell back to text")
    explicit = decide(party(), party("b", **change), HandoffPolicy(mode="full"))
    assert isinstance(explicit.refusal(), error)


def test_hops_staleness_and_the_advisor():
    d = decide(party(), party("b"), HandoffPolicy(max_hops=2), hops=3)
    assert d.path == "text" and "hop limit 2" in d.reason
    assert isinstance(decide(party(), party("b"), HandoffPolicy(mode="slice", max_hops=2), hops=3).refusal(),
                      HandoffError)
    d = decide(party(), party("b"), stale="superseded by abc")
    assert d.path == "text" and "stale" in d.reason
    assert isinstance(decide(party(), party("b"), HandoffPolicy(mode="full"), stale="x").refusal(), StaleCommitError)
    d = decide(party(), party("b"), advice=costs(2.0, 1.0))
    assert d.path == "text" and d.reason.startswith("fell back to text: advisor: moving 0.0 MB of K/V")
    assert decide(party(), party("b"), HandoffPolicy(mode="full"), advice=costs(2.0, 1.0)).refusal() is None
    d = decide(party(), party("b"), advice=costs(0.01, 1.0))
    assert d.path == "cache" and "advisor predicts cache 10 ms" in d.reason and d.advice["cache_is_faster"]


def test_the_hop_limit_defaults_to_c2c_max_hops(monkeypatch):
    monkeypatch.setenv("C2C_MAX_HOPS", "1")
    assert decide(party(), party("b"), hops=2).path == "text"
    monkeypatch.setenv("C2C_MAX_HOPS", "5")
    assert decide(party(), party("b"), hops=2).path == "cache"
    monkeypatch.setenv("C2C_MAX_HOPS", "many")
    with pytest.raises(ConfigError, match="C2C_MAX_HOPS"):
        decide(party(), party("b"))


def test_minimization_and_the_fused_path():
    d = decide(party(private=("role",), exportable=("evidence",)), party("b"))
    assert (d.mode, d.labels) == ("slice", ("evidence",)) and "private ['role'] never leave" in d.reason
    d = decide(party(private=("role",), exportable=()), party("b"))
    assert d.path == "text" and "nothing exportable" in d.reason
    other = party("b", fingerprint=replace(FP, architecture="other"))
    assert decide(party(), other, fuser_available=True).path == "fused"
    assert decide(party(), replace(other, domain="elsewhere"), fuser_available=True).path == "text"


def test_policy_is_validated_and_built_from_options():
    assert HandoffPolicy.build(mode="slice", labels=["a"]).labels == ("a",)
    with pytest.raises(ConfigError, match="unknown handoff option"):
        HandoffPolicy.build(modes="full")
    with pytest.raises(ConfigError, match="isolation"):
        HandoffPolicy(isolation="none")


# ------------------------------------------------------------------ the mapped path (cross-model maps)
def offer(source=FP, target=BIG, *, lo=0.08, hi=0.32, record=True, map_id="a" * 64, measured=None):
    """A map descriptor for ``source -> target`` whose record has the interval ``[lo, hi]`` of mapped - source."""
    rec = MapCalibration(map_id=measured or map_id, task="context_qa seed=1", n=100, mapped_correct=70,
                         source_correct=50, diff_ci95=(lo, hi)) if record else None
    return MapOffer(map_id=map_id, source=source, target=target, calibration=rec)


def test_auto_maps_a_cache_to_another_model_only_with_an_earned_map_for_that_very_pair():
    big = party("b", fingerprint=BIG)
    d = decide(party(), big, maps=[offer()])
    assert (d.path, d.mode, d.map_id) == ("mapped", "full", "a" * 64)
    assert d.check("fingerprint").ok is False and "mapped target beats the source alone" in d.reason
    assert d.to_dict()["map_id"] == "a" * 64 and d.to_dict()["path"] == "mapped"
    d = decide(party(), big, maps=[offer(lo=-0.01)])  # the interval does not clear zero
    assert d.path == "text" and d.map_id is None and "does not clearly beat" in d.reason
    d = decide(party(), big, maps=[offer(record=False)])
    assert d.path == "text" and "no calibration record" in d.reason
    d = decide(party(), big, maps=[offer(measured="b" * 64)])  # a record of another map
    assert d.path == "text" and "measured map bbbbbbbbbbbb" in d.reason
    d = decide(party(), big, maps=[offer(source=BIG, target=FP)])  # the map of the reverse pair
    assert d.path == "text" and "no map for this pair" in d.reason and "source.num_layers" in d.reason
    d = decide(party(), big, maps=[offer(source=BIG, target=FP, map_id="c" * 64), offer(lo=-0.2, hi=-0.1),
                                   offer(map_id="d" * 64, measured="d" * 64)])
    assert d.map_id == "d" * 64  # the one earned map among those for this pair
    assert decide(party(), big).path == "text" and decide(party(), party("b"), maps=[offer()]).path == "cache"


def test_a_map_never_crosses_a_failed_check_and_is_no_explicit_mode():
    big = party("b", fingerprint=BIG)
    for other in (replace(big, domain="elsewhere"), replace(big, prefix=PrefixRef.of(list(range(39)) + [7]))):
        assert decide(party(), other, maps=[offer()]).path == "text"
    assert decide(party(), big, HandoffPolicy(max_hops=1), hops=2, maps=[offer()]).path == "text"
    assert decide(party(), big, stale="superseded", maps=[offer()]).path == "text"
    assert decide(party(), big, advice=costs(2.0, 1.0), maps=[offer()]).path == "text"
    explicit = decide(party(), big, HandoffPolicy(mode="full"), maps=[offer()])
    assert explicit.path == "cache" and isinstance(explicit.refusal(), FingerprintMismatchError)


def test_a_mapped_path_keeps_private_spans_home_and_outranks_a_fuser_only_when_earned():
    big = party("b", fingerprint=BIG)
    d = decide(party(private=("role",), exportable=("evidence",)), big, maps=[offer()])
    assert (d.path, d.mode, d.labels) == ("mapped", "slice", ("evidence",)) and "never leave" in d.reason
    assert decide(party(private=("role",)), big, maps=[offer()]).path == "text"  # nothing exportable
    assert decide(party(), big, fuser_available=True, maps=[offer()]).path == "mapped"
    d = decide(party(), big, fuser_available=True, maps=[offer(lo=-0.01)])
    assert d.path == "fused" and "does not clearly beat" in d.reason
    back = fall_back(decide(party(), big, maps=[offer()]), HandoffPolicy(), HandoffError("map failed"))
    assert (back.path, back.map_id) == ("text", None) and "map failed" in back.reason
