import hashlib
import struct
import subprocess
import sys

import pytest

from c2c.artifact.prefix import BLOCK_SIZE, PrefixRef, SharedPrefix, block_hashes, canonical_context
from c2c.errors import PrefixMismatchError


def test_block_hashes_chain_over_canonical_bytes():
    ids = list(range(40))
    hs = block_hashes(ids)
    assert len(hs) == 3  # 16 + 16 + 8
    # recompute the chain independently from its definition
    parent = hashlib.sha256(b"c2c-prefix-v1").digest()
    for i, h in enumerate(hs):
        block = ids[i * BLOCK_SIZE:(i + 1) * BLOCK_SIZE]
        d = hashlib.sha256(parent + struct.pack("<I", len(block)) + struct.pack(f"<{len(block)}I", *block))
        assert d.hexdigest() == h
        parent = d.digest()


def test_hashes_identical_across_processes():
    code = "from c2c.artifact.prefix import block_hashes; print(block_hashes(list(range(1000, 1050)))[-1])"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env={"PYTHONHASHSEED": "123", "PATH": ""}).stdout.strip()
    assert out == block_hashes(list(range(1000, 1050)))[-1]


def test_one_changed_token_changes_every_later_block():
    a, b = list(range(48)), list(range(48))
    b[20] = 999
    ha, hb = block_hashes(a), block_hashes(b)
    assert ha[0] == hb[0] and ha[1] != hb[1] and ha[2] != hb[2]


def test_require_match_names_the_first_differing_block():
    ref = PrefixRef.of(list(range(48)))
    ref.require_match(list(range(48)))
    bad = list(range(48))
    bad[33] = 7
    with pytest.raises(PrefixMismatchError, match="first differing block 2"):
        ref.require_match(bad)
    with pytest.raises(PrefixMismatchError):
        ref.require_match(list(range(47)))


def test_shared_context_is_canonical():
    a = SharedPrefix.build("sys", tools=["t"], context={"b": 1, "a": {"y": 2, "x": [1, 2]}})
    b = SharedPrefix.build("sys", tools=["t"], context={"a": {"x": [1, 2], "y": 2}, "b": 1})
    assert a == b and a.text() == b.text()
    assert canonical_context({"b": 1, "a": 2}) == '{"a":2,"b":1}'
    with pytest.raises(ValueError):
        canonical_context({"x": float("nan")})


def test_prefix_tokens_are_identical_for_two_agents(tiny):
    rt = tiny("qwen2")
    sp = SharedPrefix.build("You are a team.", context={"k": "v"})
    assert sp.token_ids(rt) == SharedPrefix.build("You are a team.", context={"k": "v"}).token_ids(rt)
    assert sp.token_ids(rt) != SharedPrefix.build("You are a team!", context={"k": "v"}).token_ids(rt)


def test_a_team_and_the_server_make_one_prefix_of_one_system_text(tiny):
    """The library's SharedPrefix and the server's rendering both call prefix_token_ids, which takes the
    system text verbatim: trailing whitespace is part of the prefix, and "no system" differs from "" ."""
    from c2c.artifact.prefix import prefix_token_ids
    from c2c.conversation.render import Message, render

    rt = tiny("qwen2")
    for system in ("You are a team.\n", "  You are a team.", ""):
        served = render(rt, [Message(role="system", content=system), Message(role="user", content="hi")])
        assert SharedPrefix.build(system).token_ids(rt) == served.prefix_ids == prefix_token_ids(rt, system)
    assert prefix_token_ids(rt, "You are a team.\n") != prefix_token_ids(rt, "You are a team.")
    assert render(rt, [Message(role="user", content="hi")]).prefix_ids == prefix_token_ids(rt, None) == tuple(
        rt.bos_ids) != prefix_token_ids(rt, "")


@pytest.mark.parametrize("model", ["tiny-qwen2", "tiny-llama", "tiny-gemma3",
                                   pytest.param("SmolLM2-135M-Instruct", marks=pytest.mark.zoo),
                                   pytest.param("Qwen2.5-Coder-0.5B-Instruct", marks=pytest.mark.zoo)])
def test_a_prompt_known_only_by_its_tokens_declares_the_prefix_c2c_serve_renders(model):
    """vLLM's publisher knows a request by its tokens alone (#54): declared_prefix_len finds the BOS and system turn
    they open on, the same tokens as c2c serve's part 0 for that system text, and never more than they are."""
    from c2c.artifact.prefix import declared_prefix_len, prefix_token_ids
    from c2c.runtime import zoo
    from c2c.runtime.transformers.tokenizer import TemplateText
    from c2c.conversation.render import Message, render

    rt = TemplateText(zoo.model_path(model))
    tail = rt.render_turn("system", "\ue000").partition("\ue000")[2]
    for system in ("You are a team.", "  Two\nlines, trailing space ", "", "héllo 世界",
                   f"quoted end of turn: {tail} and more"):
        msgs = [Message(role="system", content=system), Message(role="user", content="Evidence: 09:14.")]
        served = render(rt, msgs, generation_prompt=False)
        got = declared_prefix_len(rt, served.token_ids)
        if tail.strip() and tail in system:   # the template's own end-of-turn text inside the system text: its
            # tokens are those of a shorter system turn and a turn after it, so that shorter turn may be declared
            # (a receiver of the whole system text then differs in its prefix, and reads text): never a cut that
            # no system text renders to
            before = system.split(tail)[0]
            assert got in (len(rt.bos_ids), len(served.prefix_ids), len(prefix_token_ids(rt, before)))
            assert served.token_ids[:got] in (tuple(rt.bos_ids), served.prefix_ids, prefix_token_ids(rt, before))
        else:
            assert got == len(served.prefix_ids) == len(prefix_token_ids(rt, system)), system
    bare = render(rt, [Message(role="user", content="no system here")], generation_prompt=False)
    assert declared_prefix_len(rt, bare.token_ids) == len(rt.bos_ids)
    assert declared_prefix_len(rt, ()) == 0 and declared_prefix_len(rt, (7, 7, 7)) <= len(rt.bos_ids)
