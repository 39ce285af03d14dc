import pytest

from c2c.artifact.prefix import SharedPrefix
from c2c.errors import ConfigError
from c2c.flows.pipeline import Pipeline, Stage
from c2c.handoff import HandoffPolicy
from c2c.team.agent import Agent, Team


def agents(rt, n=3):
    team = Team(shared=SharedPrefix.build("A team of agents."))
    return [Agent(f"agent{i}", rt, team, role=f"You are agent {i}.") for i in range(n)]


def test_hybrid_uses_cache_only_on_expensive_hops(tiny):
    a, b, c = agents(tiny("qwen2"))
    run = Pipeline([Stage(agent=a, instruction="Analyse.", max_new_tokens=4),
                    Stage(agent=b, instruction="Draft.", expensive=True, max_new_tokens=4),
                    Stage(agent=c, instruction="Review.", max_new_tokens=4)]).run("Some material.")
    assert [h.handoff.used for h in run.hops] == ["slice", "text"]  # minimized: roles are private
    assert run.hops[0].policy_reason == "hop marked expensive"
    assert "hybrid default" in run.hops[1].policy_reason
    assert set(run.outputs) == {"agent0", "agent1", "agent2"} and run.final == run.outputs["agent2"]


def test_hop_limit_forces_text(tiny):
    ags = agents(tiny("qwen2"), 4)
    stages = [Stage(agent=ags[0], instruction="Go.", max_new_tokens=2)] + [
        Stage(agent=g, instruction="Go on.", expensive=True, max_new_tokens=2) for g in ags[1:]]
    run = Pipeline(stages, handoff=HandoffPolicy(max_hops=2)).run("x")
    assert [h.handoff.used for h in run.hops] == ["slice", "slice", "text"]
    assert "hop limit 2" in run.hops[2].handoff.reason
    assert run.hops[2].handoff.decision["path"] == "text"


def test_the_hop_limit_is_c2c_max_hops(tiny, monkeypatch):
    monkeypatch.setenv("C2C_MAX_HOPS", "1")
    ags = agents(tiny("qwen2"), 3)
    stages = [Stage(agent=ags[0], instruction="Go.", max_new_tokens=2)] + [
        Stage(agent=g, instruction="Go on.", expensive=True, max_new_tokens=2) for g in ags[1:]]
    run = Pipeline(stages).run("x")
    assert [h.handoff.used for h in run.hops] == ["slice", "text"]
    assert "hop limit 1" in run.hops[1].handoff.reason


def test_mixed_models_fall_back_per_hop(tiny):
    team = Team(shared=SharedPrefix.build("A team of agents."))
    a = Agent("a", tiny("qwen2"), team)
    b = Agent("b", tiny("llama"), team)
    run = Pipeline([Stage(agent=a, instruction="Go.", max_new_tokens=2),
                    Stage(agent=b, instruction="Go on.", expensive=True, max_new_tokens=2)]).run("x")
    assert run.hops[0].handoff.used == "text" and "models differ" in run.hops[0].handoff.reason


def test_pipeline_validation(tiny):
    a, b = agents(tiny("qwen2"), 2)
    with pytest.raises(ConfigError):
        Pipeline([Stage(agent=a, instruction="x")])
    with pytest.raises(ConfigError, match="unique"):
        Pipeline([Stage(agent=a, instruction="x"), Stage(agent=a, instruction="y")])


def test_an_expensive_hop_to_another_model_is_mapped_with_an_earned_map(tiny_models, small_to_big, map_offer):
    team = Team(shared=SharedPrefix.build("A team of agents."))
    a, b = Agent("small", tiny_models["small"], team), Agent("big", tiny_models["big"], team, role="You are big.")
    stages = [Stage(agent=a, instruction="Analyse.", max_new_tokens=2),
              Stage(agent=b, instruction="Draft.", expensive=True, max_new_tokens=2)]
    [hop] = Pipeline(stages, maps=[map_offer(small_to_big)]).run("Some material.").hops
    assert (hop.handoff.path, hop.handoff.used, hop.handoff.map_id) == ("mapped", "full", small_to_big.id)
