"""An Agent holds one Conversation, rendered as c2c serve renders a session (#54): the same tokens for the same
messages, the reply closed as the template closes it, and the whole re-rendered where a template is not
prefix-stable."""

from c2c.artifact.prefix import SharedPrefix
from c2c.conversation.render import render, template_stability
from c2c.team.agent import Agent, Team
from c2c.testing.templates import MERGING_USER_TURNS


def test_an_agents_tokens_are_the_servers_rendering_of_its_messages(tiny):
    rt = tiny("qwen2")
    a = Agent("analyst", rt, Team(shared=SharedPrefix.build("You are a careful agent.")), role="Be terse.")
    a.read("The outage began at 09:14.")
    g = a.respond("When did it begin?", max_new_tokens=6)
    a.read("A second note.", label="evidence-2")
    whole = render(rt, a.history, generation_prompt=False)
    assert whole.token_ids == a.context.token_ids == a.cache.token_ids
    assert [p.label for p in whole.parts[1:]] == [s.label for s in a.context.spans] == \
        ["role", "evidence", "instruction", "conclusion", "evidence-2"]
    assert a.context.spans[0].private and not a.context.spans[3].private
    assert a.history[0].role == "system" and (a.history[4].role, a.history[4].content) == ("assistant", g.text)
    # the reply's message ends as the template ends a turn (the next user turn follows a closed one)
    end = tuple(rt.encode("<|im_end|>\n"))
    assert a.context.token_ids[a.context.spans[3].end - len(end):a.context.spans[3].end] == end


def test_on_a_template_that_is_not_prefix_stable_the_agent_re_renders_whole_and_reuses_up_to_the_change():
    from c2c.runtime import zoo

    rt = zoo.load("tiny-qwen2", dtype="float32")   # its own tokenizer: the template change stays here
    rt.tokenizer.chat_template = MERGING_USER_TURNS
    assert not template_stability(rt).stable
    a = Agent("analyst", rt, Team(shared=SharedPrefix.build("You are a careful agent.")))
    a.read("first")
    before = a.cache.token_ids
    a.read("second", label="evidence-2")   # merges into the first turn: its end is rewritten
    msgs = [m.to_dict() for m in a.history]
    truth = tuple(rt.encode(rt.render_chat(msgs)))
    assert a.cache.token_ids == a.context.token_ids == truth      # the template's tokens, never turn by turn
    assert truth[:len(before)] != before                          # the earlier rendering was cut, not kept
    _, fresh = rt.prefill(list(truth))
    assert a.cache.max_abs_diff(fresh) < 1e-4                      # and its K/V are those of the new tokens


def test_a_reply_is_private_by_its_label_and_costs_no_pass_of_its_own(tiny):
    """A reply labelled ``scratch`` stays private (by label, as every span); and respond runs only the prompt's
    prefill and the decode: the rest of the reply's message (its last token, the end of turn) rides along with
    whatever is read next, and a cache read in between is brought up to date."""
    rt = tiny("qwen2")
    a = Agent("analyst", rt, Team(shared=SharedPrefix.build("You are a careful agent.")))
    a.read("Some evidence.")
    before = a.stats.prefilled
    asked = len(rt.encode(rt.render_turn("user", "Think.") + rt.generation_prompt()))
    a.respond("Think.", max_new_tokens=4, label="scratch")
    assert a.stats.prefilled == before + asked                     # no pass for the reply's own end
    assert a.context.spans[-1].label == "scratch" and a.context.spans[-1].private
    assert "scratch" not in a.exportable_labels()
    a.read("More.", label="evidence-2")
    assert a.cache.token_ids == a.context.token_ids == render(rt, a.history, generation_prompt=False).token_ids
