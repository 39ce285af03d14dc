"""c2c.conversation.render: where a request's messages begin with a commit's own tokens (continuation), and turn-by-turn
rendering against the model's own template over the whole conversation."""

from __future__ import annotations

import os

import pytest

from c2c.errors import RuntimeUnsupportedError
from c2c.testing.templates import ALTERNATING_ONLY, MERGING_USER_TURNS
from c2c.conversation import Part, Conversation
from c2c.conversation.render import continuation


class KV:
    """Stands for a KVCache: records the absolute positions it is cut at (or refuses, as a sliding layer does)."""

    def __init__(self, token_ids: tuple[int, ...], start: int = 2, refuse: bool = False):
        self.token_ids, self.start, self.refuse = token_ids, start, refuse

    def slice(self, start: int, end: int):
        if self.refuse:
            raise RuntimeUnsupportedError("layer 3 (sliding window 4) no longer holds positions 2..5")
        return (start, end)


def own(*messages: tuple[int, ...]) -> Conversation:
    return Conversation(parts=(Part(label="prefix", token_ids=(1, 2)),
                            *(Part(label=f"m{i}", token_ids=m) for i, m in enumerate(messages)),
                            Part(label="prompt", token_ids=(9,))))


def test_the_commits_kv_lie_on_the_messages_it_covers_at_their_positions():
    r = own((3, 4), (5,), (6, 7, 8))
    c = continuation(r, (1, 2, 3, 4, 5), Part(label="from:a", token_ids=(3, 4, 5), kv=KV((3, 4, 5))))
    assert c.messages == 2 and c.carried
    assert [p.kv for p in c.rendering.parts] == [None, (2, 4), (4, 5), None, None]
    assert c.rendering.token_ids == r.token_ids


def test_no_continuation_unless_the_messages_begin_with_the_commit_on_a_boundary():
    r = own((3, 4), (5,))
    part = Part(label="from:a", token_ids=(3,), kv=KV((3,)))
    assert continuation(r, (1, 2, 3), part) is None            # ends inside a message
    assert continuation(r, (1, 2, 4, 4), part) is None         # another first message
    assert continuation(r, (1, 7, 3, 4), part) is None         # another prefix
    assert continuation(r, (1, 2), part) is None               # the prefix alone
    assert continuation(r, (1, 2, 3, 4, 5, 9), part) is None   # never the generation prompt


def test_on_the_text_path_or_where_the_kv_cannot_be_cut_the_messages_are_prefilled_as_sent():
    r = own((3, 4), (5,))
    for attached in (None, Part(label="from:a", token_ids=(3, 4)), Part(label="from:a", token_ids=(3, 4),
                                                                         kv=KV((3, 4), refuse=True)),
                     Part(label="from:a", token_ids=(3, 4), kv=KV((8, 8)))):   # K/V of other tokens (mapped)
        c = continuation(r, (1, 2, 3, 4), attached)
        assert c.messages == 1 and not c.carried and c.rendering is r


CONVERSATIONS = {
    "system and turns": [("system", "Be brief."), ("user", "Hi"), ("assistant", "Hello!"), ("user", "And?")],
    "consecutive users": [("system", "S"), ("user", "a"), ("user", "b"), ("assistant", "c")],
    "long turns": [("system", "You read logs. " * 40), ("user", "line " * 300), ("assistant", "ok " * 200)],
    "unicode": [("system", "S"), ("user", "héllo 世界 🚀 \u00a0tab\tend"), ("assistant", "ça va ✓")],
    "no system": [("user", "Hi"), ("assistant", "Hello!"), ("user", "And?")],
}


def _every_zoo_model() -> list:
    from c2c.runtime import zoo

    return [pytest.param(name, marks=() if zoo.ZOO[name].tiny else pytest.mark.zoo) for name in zoo.ZOO]


@pytest.mark.parametrize("model", _every_zoo_model())
def test_turn_by_turn_rendering_is_the_templates_rendering_of_the_whole_conversation(model):
    """The rendering invariant (#54), for every zoo model (its tokenizer and template only, no weights): the tokens
    c2c renders message by message are those of the model's own chat template over the whole conversation, so a
    session's cache is the one a server rendering whole would build. One deliberate difference: without a system
    message, the template inserts its default one (Qwen's "You are Qwen...", SmolLM2's "You are a helpful AI
    assistant..."), which c2c does not: the rest is the same tokens. A model without a chat template (a base model:
    Gemma-3-270M) is written in c2c's plain turns, each a prefix of the next by construction: checked here too."""
    from c2c.runtime import zoo
    from c2c.runtime.transformers.tokenizer import TemplateText
    from c2c.conversation.render import Message, render

    if not zoo.is_pulled(model):
        pytest.skip(f"{model} is not pulled here (c2c models pull {model})")
    rt = TemplateText(zoo.model_path(model))
    templated = rt.render_chat([{"role": "user", "content": "x"}]) is not None
    for name, turns in CONVERSATIONS.items():
        msgs = [Message(role=r, content=c) for r, c in turns]
        ours = render(rt, msgs).token_ids
        if not templated:   # plain turns: messages[:k] always begin messages[:k + 1]
            for k in range(1, len(msgs)):
                shorter = render(rt, msgs[:k], generation_prompt=False).token_ids
                assert render(rt, msgs[:k + 1], generation_prompt=False).token_ids[:len(shorter)] == shorter, name
            continue
        whole = tuple(rt.encode(rt.render_chat([m.to_dict() for m in msgs], add_generation_prompt=True)))
        if name != "no system" or whole == ours:
            assert ours == whole, name
        else:   # the template's default system turn, then exactly ours
            bos = len(rt.bos_ids)
            assert len(whole) > len(ours) and whole[len(whole) - len(ours) + bos:] == ours[bos:], name


@pytest.mark.zoo
@pytest.mark.parametrize("model", ["SmolLM2-135M-Instruct", "Qwen2.5-Coder-0.5B-Instruct"])
def test_the_template_text_side_renders_as_the_loaded_runtime_does(model):
    """TemplateText (the tokenizer and template alone, what vLLM's publisher loads) gives the runtime's tokens."""
    from c2c.runtime import zoo
    from c2c.runtime.transformers.tokenizer import TemplateText
    from c2c.conversation.render import Message, render

    rt, text = zoo.load(model), TemplateText(zoo.model_path(model))
    msgs = [Message(role=r, content=c) for r, c in CONVERSATIONS["unicode"]]
    assert render(rt, msgs).token_ids == render(text, msgs).token_ids and tuple(rt.bos_ids) == text.bos_ids


class _Counting:
    """A template's text side (a byte tokenizer, ChatML or the merging template) that counts its renders."""

    def __init__(self, template: str | None = None):
        from c2c.runtime.transformers.tiny import byte_tokenizer
        from c2c.runtime.transformers.tokenizer import TemplateText

        self.inner = TemplateText.__new__(TemplateText)
        self.inner._tokenizer = byte_tokenizer()
        if template is not None:
            self.inner._tokenizer.chat_template = template
        self.inner.bos_ids = ()
        self.renders, self.name = 0, "merging-test" if template else "chatml-test"

    def render_chat(self, messages, add_generation_prompt=False, *, tools=None):
        self.renders += 1
        return self.inner.render_chat(messages, add_generation_prompt, tools=tools)

    def render_turn(self, role, content):
        return type(self.inner).render_turn(self, role, content)

    def generation_prompt(self):
        return type(self.inner).generation_prompt(self)

    def __getattr__(self, name):   # encode, decode, bos_ids
        return getattr(self.inner, name)


def test_a_template_is_checked_for_prefix_stability_once_and_an_unstable_one_is_named():
    from c2c.conversation.render import template_stability

    stable, merging = _Counting(), _Counting(MERGING_USER_TURNS)
    assert template_stability(stable).stable
    found = template_stability(merging)
    assert not found.stable
    assert "merging-test" in found.reason and "'consecutive users'" in found.reason and "rendered whole" in found.reason
    before = (stable.renders, merging.renders)
    assert template_stability(stable).stable and template_stability(merging) == found   # once per runtime
    assert (stable.renders, merging.renders) == before


def test_where_a_template_is_not_prefix_stable_every_conversation_is_rendered_whole_never_into_other_tokens():
    """The fallback (#54): turn by turn would give other tokens than the template; c2c renders the conversation
    whole and cuts it at its messages, and a session holding the shorter conversation reuses its cache up to the
    first token that differs, never past it."""
    from c2c.conversation.render import Message, prefix_ids, render, turn

    rt = _Counting(MERGING_USER_TURNS)
    msgs = [Message(role=r, content=c) for r, c in [("system", "S"), ("user", "a"), ("user", "b"),
                                                   ("assistant", "c")]]
    whole = tuple(rt.encode(rt.render_chat([m.to_dict() for m in msgs], add_generation_prompt=True)))
    one_by_one = prefix_ids(rt, msgs[0]) + sum((turn(rt, m).token_ids for m in msgs[1:]), ()) + \
        tuple(rt.encode(rt.generation_prompt()))
    assert one_by_one != whole                    # the check could fail: turn by turn is wrong on this template
    ours = render(rt, msgs)
    assert ours.token_ids == whole
    assert [p.label for p in ours.parts] == ["prefix", "user", "user", "assistant", "prompt"]
    shorter = render(rt, msgs[:2], generation_prompt=False).token_ids    # what a session held a turn before
    kept = len(os.path.commonprefix([shorter, whole]))
    assert 0 < kept < len(shorter)                # the merged turn changes the end of message 1, and no more
    assert whole[:kept] == shorter[:kept]



def test_a_template_that_refuses_a_probe_is_checked_on_the_others_and_never_stops_a_start():
    """A template that raises on two user messages in a row (raise_exception) is no error at load: the probe it
    refuses is named, the others decide (here: stable), and an alternating chat renders as before."""
    from c2c.conversation.render import Message, render, template_stability

    rt = _Counting(ALTERNATING_ONLY)
    found = template_stability(rt)
    assert found.stable and "refuses 'consecutive users'" in found.reason and "TemplateError" in found.reason
    msgs = [Message(role=r, content=c) for r, c in [("system", "S"), ("user", "a"), ("assistant", "b")]]
    whole = tuple(rt.encode(rt.render_chat([m.to_dict() for m in msgs], add_generation_prompt=True)))
    assert render(rt, msgs).token_ids == whole
