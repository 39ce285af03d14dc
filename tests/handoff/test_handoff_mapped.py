"""hand_off between two models with a cross-model map on offer: the mapped path, and every way it is not taken."""

from __future__ import annotations

import pytest

from c2c.artifact.prefix import SharedPrefix
from c2c.errors import ConfigError, FingerprintMismatchError
from c2c.flows.router import Router
from c2c.handoff import HandoffPolicy, hand_off
from c2c.team.agent import Agent, Team
from c2c.xmodel import MapOffer, map_cache

SHARED = SharedPrefix.build("You are a team of two agents.")
DOC = "The deploy is on Friday at 09:14. Ticket 7731 tracks it."


def agents(tiny_models, *, sender="small", receiver="big", role="", receiver_role="You are the writer."):
    team = Team(shared=SHARED, domain="lab")
    a = Agent("analyst", tiny_models[sender], team, role=role)
    b = Agent("writer", tiny_models[receiver], team, role=receiver_role)
    a.read(DOC, label="evidence")
    return a, b


def test_the_mapped_path_attaches_the_mapped_cache_and_the_receiver_continues_unprefilled(
        tiny_models, small_to_big, map_offer):
    a, b = agents(tiny_models, receiver_role="")
    offer = map_offer(small_to_big)
    expected = map_cache(small_to_big, a.cache, source=a.runtime, target=b.runtime,
                         prefix=b.team.prefix_cache(b.runtime))
    before = b.stats.prefilled
    h = hand_off(a, b, maps=[offer])
    assert (h.path, h.used, h.requested, h.map_id) == ("mapped", "full", "auto", offer.map_id)
    assert h.decision["path"] == "mapped" and h.decision["map_id"] == offer.map_id
    assert "beats the source alone" in h.reason and {"export_s", "map_s", "import_s"} <= set(h.timings)
    assert h.to_dict()["path"] == "mapped" and h.tokens_prefilled == 0 and b.stats.prefilled == before
    # the writer holds the analyst's tokens as its model's K/V, exactly what the map makes of them
    assert b.cache.token_ids == a.cache.token_ids and b.cache.max_abs_diff(expected) == 0.0
    assert b.context.token_ids == a.cache.token_ids and b.messages == a.messages
    assert [s.label for s in b.context.spans] == [s.label for s in a.context.spans]   # message by message
    question = b.runtime.encode(b.runtime.render_turn("user", "When is the deploy?") + b.runtime.generation_prompt())
    g = b.respond("When is the deploy?", max_new_tokens=3, min_new_tokens=3)
    # only the question (and the reply's own message, as the template closes it) was prefilled, not the mapped context
    assert before + len(question) <= b.stats.prefilled <= before + len(question) + b.context.spans[-1].length
    assert b.context.spans[-1].label == "conclusion" and len(a.context.token_ids) > b.context.spans[-1].length
    assert g.token_ids == b.runtime.generate(question, expected, max_new_tokens=3, min_new_tokens=3).token_ids


def test_a_sender_with_a_private_role_maps_only_the_spans_after_it(tiny_models, small_to_big, map_offer):
    a, b = agents(tiny_models, role="You are the analyst (secret instructions).")
    b.read_role()
    own = b.cache.seq_len
    h = hand_off(a, b, maps=[map_offer(small_to_big)])
    ev = a.context.spans_labelled("evidence")[0]
    assert (h.path, h.used) == ("mapped", "slice") and "never leave" in h.reason
    assert b.cache.seq_len == own + ev.length  # the writer's own context, then the evidence alone
    assert b.context.token_ids[own:] == a.context.token_ids[ev.start:ev.end]
    role = a.context.spans_labelled("role")[0]
    assert a.context.token_ids[role.start:role.end] != b.context.token_ids[own:own + role.length]


@pytest.mark.parametrize("receiver, earned, why", [
    ("big", False, "does not clearly beat the source alone"),
    ("big", None, "no calibration record"),
    ("big_other", True, "no map for this pair"),  # the map's target shapes, other weights
])
def test_without_an_earned_map_for_the_pair_the_hop_is_text(tiny_models, small_to_big, map_offer, receiver, earned,
                                                            why):
    a, b = agents(tiny_models, receiver=receiver)
    h = hand_off(a, b, maps=[map_offer(small_to_big, earned)], message_tokens=2)
    assert h.path == "text" and h.map_id is None and why in h.reason and h.message is not None


def test_an_explicit_cache_mode_is_refused_and_a_failed_map_falls_back_to_text(tiny_models, small_to_big, map_offer):
    a, b = agents(tiny_models)
    with pytest.raises(FingerprintMismatchError):
        hand_off(a, b, mode="full", maps=[map_offer(small_to_big)])
    earned = map_offer(small_to_big)
    descriptor = MapOffer(map_id=earned.map_id, source=earned.source, target=earned.target,
                          calibration=earned.calibration)  # decides, cannot map
    h = hand_off(a, b, maps=[descriptor], message_tokens=2)
    assert h.path == "text" and "ConfigError" in h.reason and h.decision["path"] == "text"


def test_the_router_escalates_to_the_big_model_through_the_map(tiny_models, small_to_big, map_offer):
    a, b = agents(tiny_models)
    router = Router(maps=[map_offer(small_to_big)])
    path, why = router.route(a, b)
    assert path == "mapped" and "beats the source alone" in why
    assert router.route(b, a)[0] == "text"  # no map back down
    h = router.hand_off(a, b)
    assert h.path == "mapped" and h.map_id == small_to_big.id and b.cache.token_ids == a.cache.token_ids


def test_the_router_keeps_the_callers_policy_options_and_refuses_to_be_told_the_path(tiny_models, small_to_big,
                                                                                      map_offer):
    a, b = agents(tiny_models)
    router = Router(maps=[map_offer(small_to_big)])
    for bad in ({"mode": "full"}, {"maps": []}, {"policy": HandoffPolicy()}):
        with pytest.raises(ConfigError, match="chooses the path itself"):
            router.hand_off(a, b, **bad)
    h = router.hand_off(a, b, max_hops=0, message_tokens=2)  # the caller's hop limit holds: no cache hop at all
    hops = next(c for c in h.decision["checks"] if c["name"] == "hops")
    assert h.path == "text" and hops["ok"] is False and "hop limit 0" in hops["detail"]
