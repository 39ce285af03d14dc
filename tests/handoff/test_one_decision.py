"""Every hop asks decide(): with decide replaced by one that refuses, every path that moves context refuses.

hand_off (every mode), the shared-memory channel, the store chain's pull, the server's Exchange, Router, and
the forecast behind `c2c advise` and POST /v1/c2c/advise; and the mapped path between two models with a
cross-model map on offer (hand_off, Router, the server's Exchange with `--map`). A path that decided by
itself would go on.
"""

from __future__ import annotations

import sys

import pytest

from test_shm import agents, channel, exchange  # noqa: F401  (channel is a fixture)

import c2c.flows.chain
import c2c.flows.router
import c2c.handoff
import c2c.handoff.shm.admit
from c2c.advise import Calibration
from c2c.artifact.prefix import SharedPrefix
from c2c.errors import ChannelError
from c2c.flows.chain import publish, pull
from c2c.handoff import forecast, hand_off
from c2c.store import open_store
from c2c.team.agent import Agent, Team
from c2c.trust.keys import Keyring

SHARED = SharedPrefix.build("You are a team of two agents.", tools=["calc"])
CAL = Calibration(model="m", decode_s_per_token=0.1, decode_s_per_position=0.0, prefill_s_fixed=0.01,
                  prefill_s_per_token=0.005, prefill_s_per_pair=0.0, prefill_s_per_past=0.0,
                  kv_bytes_per_token=1000, handoff_points=((10**6, 0.01),))


class Asked(Exception):
    """decide() was asked."""


@pytest.fixture
def no_decisions(monkeypatch):
    def refuse(*args, **kwargs):
        raise Asked()

    import c2c.handoff.gate  # the one gate of the store's commits: pull, the server's Exchange, vLLM's Attacher

    # (the package re-exports forecast(), which shadows its module's name)
    for module in (c2c.handoff, c2c.handoff.shm.admit, c2c.handoff.gate, c2c.flows.router,
                   sys.modules["c2c.handoff.forecast"]):
        monkeypatch.setattr(module, "decide", refuse)
    for front_end in ("c2c.flows.chain", "c2c.serve.exchange", "c2c.vllm.commits"):  # they decide through the gate
        __import__(front_end)
        assert not hasattr(sys.modules[front_end], "decide"), front_end


@pytest.fixture
def team(tmp_path):
    ring = Keyring(tmp_path / "keys")
    ring.create_key("lab")
    return Team(shared=SHARED, domain="lab", keyring=ring)


@pytest.mark.parametrize("mode", ["auto", "full", "slice", "text"])
def test_hand_off_asks_decide_in_every_mode(tiny, team, no_decisions, mode):
    a, b = agents(tiny("qwen2"), team)
    with pytest.raises(Asked):
        hand_off(a, b, mode=mode)


def test_the_channel_asks_decide_before_reading_the_arena(tiny, team, channel, no_decisions):
    a, b = agents(tiny("qwen2"), team)
    sent, got = exchange(*channel, a, b)
    assert isinstance(got, ChannelError) and isinstance(got.__cause__, Asked)


def test_a_pull_from_the_store_asks_decide(tiny, team, tmp_path, no_decisions):
    a, b = agents(tiny("qwen2"), team)
    with open_store(f"sqlite:///{tmp_path / 'store'}") as store:
        cid = publish(store, a)
        with pytest.raises(Asked):
            pull(store, cid, b)


def test_the_router_and_the_advisor_ask_decide(tiny, team, no_decisions):
    a, b = agents(tiny("qwen2"), team)
    with pytest.raises(Asked):
        c2c.flows.router.Router().hand_off(a, b)
    with pytest.raises(Asked):
        forecast(CAL, message_tokens=64)


def test_the_servers_exchange_asks_decide(tiny, team, tmp_path, no_decisions):
    from c2c.serve.auth import Principal
    from c2c.serve.exchange import Exchange

    rt = tiny("qwen2")
    a, _ = agents(rt, team)
    with open_store(f"sqlite:///{tmp_path / 'store'}?domain=lab") as store:
        art = a.export()
        cid = store.put(art.encode(), stream="a").id
        exchange = Exchange(store, team.keyring)
        with pytest.raises(Asked):
            exchange.attach(cid, runtime=rt, principal=Principal(agent="w", domain="lab"),
                            prefix_ids=a.context.token_ids[:a.context.prefix_len], mode="auto")


def test_the_mapped_path_asks_decide_in_the_library_the_router_and_the_server(tiny_models, small_to_big, map_offer,
                                                                           tmp_path, no_decisions):
    from c2c.serve.auth import Principal
    from c2c.serve.exchange import Exchange
    from c2c.serve.mapped import ServedMap

    ring = Keyring(tmp_path / "keys")
    ring.create_key("lab")
    team = Team(shared=SHARED, domain="lab", keyring=ring)
    small, big = tiny_models["small"], tiny_models["big"]
    a, b = Agent("analyst", small, team), Agent("writer", big, team)
    a.read("The deploy is on Friday.")
    offer = map_offer(small_to_big)
    with pytest.raises(Asked):
        hand_off(a, b, maps=[offer])
    with pytest.raises(Asked):
        c2c.flows.router.Router(maps=[offer]).hand_off(a, b)
    with open_store(f"sqlite:///{tmp_path / 'store'}?domain=lab") as store:
        cid = store.put(a.export().encode(), stream="a").id
        exchange = Exchange(store, ring, maps=[ServedMap(offer=offer, source=small, target=big)])
        with pytest.raises(Asked):
            exchange.attach(cid, runtime=big, principal=Principal(agent="w", domain="lab"),
                            prefix_ids=b.context.token_ids[:b.context.prefix_len], mode="auto")
