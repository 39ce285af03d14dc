"""The router: cache on the same model, fused with a trained fuser, text otherwise."""

import pytest
import torch

from c2c.artifact.prefix import SharedPrefix
from c2c.flows.router import Router
from c2c.team.agent import Agent, Team


def fused_receiver(receiver, sharer):
    from c2c.fuser import checkpoint as ckpt
    from c2c.fuser.align import layer_map
    from c2c.fuser.infer import FusedReceiver, Link, side_record
    from c2c.fuser.model import CacheFuser, FuserConfig

    rf, sf = receiver.facts, sharer.facts
    cfg = FuserConfig(receiver_layers=rf.num_layers, receiver_kv_heads=rf.kv_heads,
                      receiver_head_dim=rf.head_dim, sharer_kv_heads=sf.kv_heads, sharer_head_dim=sf.head_dim,
                      layer_map=layer_map("terminal", rf.num_layers, sf.num_layers), hidden=16)
    fuser = CacheFuser(cfg).eval()
    with torch.no_grad():  # a non-trivial (untrained) fuser, so fusing changes the cache
        g = torch.Generator().manual_seed(0)
        for p in fuser.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 0.3)
    meta = ckpt.FuserMeta(fuser=cfg, receiver=side_record(receiver), sharer=side_record(sharer), fuser_id="0" * 64)
    return FusedReceiver(receiver, [Link(fuser=fuser, meta=meta, sharer=sharer)])


@pytest.fixture
def team():
    return Team(shared=SharedPrefix.build("A routed team."))


def test_routes(tiny, team):
    q, l, g = tiny("qwen2"), tiny("llama"), tiny("gemma3")
    router = Router([fused_receiver(q, l)])
    a_l, b_q, c_q, d_g = Agent("a", l, team), Agent("b", q, team), Agent("c", q, team), Agent("d", g, team)
    assert router.route(b_q, c_q)[0] == "cache"
    assert router.route(a_l, b_q)[0] == "fused"
    path, why = router.route(b_q, d_g)
    assert path == "text" and "no trained fuser" in why
    other = Agent("x", l, Team(shared=team.shared, domain="other"))
    assert router.route(other, b_q)[0] == "text"


def test_fused_hop_continues_from_the_fused_cache(tiny, team):
    q, l = tiny("qwen2"), tiny("llama")
    router = Router([fused_receiver(q, l)])
    a, b = Agent("a", l, team, role="You are a."), Agent("b", q, team, role="You are b.")
    a.read("The deploy is on Friday.")
    h = router.hand_off(a, b)
    assert h.used == "fused" and "trained fuser" in h.reason
    # the receiver holds the fused cache of the whole conversation, not its plain prefill
    _, plain_cache = q.prefill(list(b.cache.token_ids))
    assert b.cache.max_abs_diff(plain_cache) > 1e-3
    g = b.respond("When is the deploy?", max_new_tokens=3)
    assert len(g.token_ids) >= 1


def test_same_model_hop_is_a_cache_handoff(tiny, team):
    q = tiny("qwen2")
    a, b = Agent("a", q, team), Agent("b", q, team)
    a.read("x")
    h = Router().hand_off(a, b)
    assert h.used == "full"
    c = Agent("c", tiny("gemma3"), team)
    h = Router().hand_off(b, c, message_tokens=3)
    assert h.used == "text" and h.requested == "route" and "no trained fuser" in h.reason
