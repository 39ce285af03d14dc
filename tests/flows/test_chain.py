import pytest

from c2c.demos import stale_chain
from c2c.store.url import open_store


@pytest.mark.parametrize("policy", ["re-pull", "continue"])
def test_chain_goes_stale_and_recovers(tiny, tmp_path, policy):
    with open_store(f"sqlite:///{tmp_path}/store.db") as store:
        rep = stale_chain.run(tiny("qwen2"), store, policy=policy, answer_tokens=3)
        whats = [s.what for s in rep.steps]
        stale_step = rep.steps[whats.index("analyst's commit is now")]
        assert stale_step.stale and "researcher" in stale_step.note
        assert store.show(stale_step.commit).commit.stream == "analyst"
        assert "writer refuses stale context" in whats
        if policy == "re-pull":
            assert whats[-1] == "writer pulls fresh analyst, publishes"
            fresh = rep.steps[-1].commit
            assert not store.show(fresh).stale
            assert {"analyst on researcher v1", "analyst on researcher v2", "writer on researcher v1",
                    "writer on researcher v2"} <= set(rep.answers)
        else:
            assert whats[-1] == "writer continues on stale context (flagged)"
            assert "writer on researcher v1 (stale context)" in rep.answers
        # every downstream commit of researcher v1 is stale, v2 is fresh
        log = store.log("researcher")
        assert [r.commit.version for r in log] == [2, 1]
        assert not log[0].stale and log[1].stale


def test_a_pull_fetches_only_what_the_receiving_agent_lacks(tiny, tmp_path):
    """#33: the writer holds its team's shared prefix, so the commit's chunks of it stay in the store."""
    import torch

    from c2c.artifact.chunks import CHUNK_TOKENS
    from c2c.artifact.prefix import SharedPrefix
    from c2c.flows.chain import publish, pull
    from c2c.team.agent import Agent, Team

    rt = tiny("qwen2")
    team = Team(shared=SharedPrefix.build("You are one of a team of careful agents. " * 20))
    analyst, writer = Agent("analyst", rt, team), Agent("writer", rt, team)
    analyst.read("The outage began at 09:14, right after deploy 7 reached the eu-west pool. " * 3)
    P = writer.context.prefix_len
    assert P >= 2 * CHUNK_TOKENS
    with open_store(f"sqlite:///{tmp_path}/store") as store:
        cid = publish(store, analyst)
        got = pull(store, cid, writer)
        f = got.fetch
        assert not got.stale and f.chunks_held == P // CHUNK_TOKENS and f.chunks_refetched == 0
        assert f.bytes_fetched < f.bytes_referenced == store.show(cid).commit.size
        assert writer.cache.token_ids == analyst.cache.token_ids  # the whole of it, attached exactly
        assert all(torch.equal(x, y) for x, y in zip(writer.cache.keys + writer.cache.values,
                                                     analyst.cache.keys + analyst.cache.values))
