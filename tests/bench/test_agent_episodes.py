"""The agent workload's episodes: seeded, kept questions inside the policy's window, dropped ones before it."""

import pytest

from c2c.bench import agent_episodes
from c2c.bench.context_qa import contains_answer


@pytest.mark.needs_data  # the responses are cut from train/lima.json
def test_episodes_are_seeded_and_their_questions_follow_the_window(tiny):
    rt = tiny("qwen2")
    eps = agent_episodes.build(rt, 2, steps=16, doc_tokens=80, keep=8, seed=3)
    assert [e.to_dict() for e in eps] == [e.to_dict() for e in agent_episodes.build(rt, 2, steps=16, doc_tokens=80,
                                                                                     keep=8, seed=3)]
    for ep in eps:
        assert len(ep.calls) == len(ep.responses) == 16 and len(ep.questions) == 16
        for q in ep.questions:
            first_kept = max(1, q.step - 8 + 1)
            assert (first_kept <= q.source <= q.step) == (q.kind == "kept")
            assert q.answer in ep.responses[q.source - 1]          # the fact is planted in that response
        assert len({q.question for q in ep.questions}) == 16
        assert sum(q.kind == "dropped" for q in ep.questions) == 4
        msgs = ep.messages(3)
        assert [m["role"] for m in msgs] == ["system", "assistant", "tool", "assistant", "tool", "assistant", "tool"]
        assert msgs[agent_episodes.response_index(2)]["content"] == ep.responses[1]


def test_an_answer_in_a_sentence_counts_but_not_a_longer_word():
    assert contains_answer("Kaith's favorite color is amber.", "amber")
    assert not contains_answer("ambers", "amber") and not contains_answer("", "amber")
    assert contains_answer("Locker 87\nmore", "87") and not contains_answer("871", "87")
