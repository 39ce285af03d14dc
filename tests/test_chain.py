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
