import random

import numpy as np
import pytest

from c2c.errors import AlignmentError, ConfigError
from c2c.fuser.align import (
    CONTENT,
    Rendered,
    align_tokens,
    char_map,
    layer_map,
    render,
    split_sections,
    terminal_map,
    uniform_map,
)

MESSAGES = ["You are a helpful assistant.", "Which is larger, 法律 or 3?\n\nA. one\nB. two"]


def chunked(text: str, contents, rng: random.Random, n_bos: int = 0) -> Rendered:
    """A synthetic tokenization of ``text``: random chunks of 1-4 characters."""
    offsets, i = [], 0
    while i < len(text):
        j = min(len(text), i + rng.randint(1, 4))
        offsets.append((i, j))
        i = j
    return Rendered(text=text, sections=split_sections(text, contents), ids=tuple(range(n_bos + len(offsets))),
                    offsets=((0, 0),) * n_bos + tuple(offsets), n_bos=n_bos)


def chatml(contents):
    return "".join(f"<|im_start|>{r}\n{c}<|im_end|>\n" for r, c in zip(["system", "user"], contents))


def plain(contents):
    return "".join(f"{r.capitalize()}: {c}\n\n" for r, c in zip(["system", "user"], contents))


def test_sections_alternate_and_cover_the_text():
    text = chatml(MESSAGES)
    secs = split_sections(text, MESSAGES)
    assert len(secs) == 5
    assert secs[0].start == 0 and secs[-1].end == len(text)
    assert all(a.end == b.start for a, b in zip(secs, secs[1:]))
    assert [text[s.start:s.end] for s in secs if s.kind == CONTENT] == MESSAGES


def test_a_rewritten_message_cannot_be_aligned():
    with pytest.raises(AlignmentError):
        split_sections(chatml(["sys", "hello"]), ["sys", "HELLO"])


@pytest.mark.parametrize("seed", range(20))
def test_each_receiver_token_maps_to_the_last_sharer_token_covering_its_characters(seed):
    rng = random.Random(seed)
    r = chunked(chatml(MESSAGES), MESSAGES, rng)
    s = chunked(plain(MESSAGES), MESSAGES, rng, n_bos=rng.randint(0, 1))
    idx = align_tokens(r, s)
    cmap = char_map(r, s)
    # every receiver character has a sharer character, inside the sharer's text
    assert len(cmap) == len(r.text) and cmap.min() >= 0 and cmap.max() < len(s.text)
    covered = np.zeros(len(r.text), bool)
    for t, (a, b) in enumerate(r.offsets):
        covered[a:b] = True
        lo, hi = s.offsets[idx[t]]
        # the chosen sharer token covers the mapped image of the token's last character
        assert lo <= cmap[b - 1] < hi
        # and no later sharer token covers any of the mapped characters
        assert all(not (s.offsets[u][0] <= cmap[c] < s.offsets[u][1])
                   for u in range(idx[t] + 1, len(s.ids)) for c in range(a, b))
    assert covered.all()  # alignment covers every receiver character
    assert (np.diff(idx) >= 0).all()


def test_content_characters_map_one_to_one():
    r = chunked(chatml(MESSAGES), MESSAGES, random.Random(0))
    s = chunked(plain(MESSAGES), MESSAGES, random.Random(1))
    cmap = char_map(r, s)
    for rs, ss in zip(r.sections, s.sections):
        if rs.kind == CONTENT:
            assert r.text[rs.start:rs.end] == s.text[ss.start:ss.end]
            assert list(cmap[rs.start:rs.end]) == list(range(ss.start, ss.end))


def test_same_tokenization_is_the_identity():
    r = chunked(chatml(MESSAGES), MESSAGES, random.Random(3))
    assert list(align_tokens(r, r)) == list(range(len(r.ids)))


def test_receiver_bos_maps_to_sharer_bos():
    r = chunked(chatml(MESSAGES), MESSAGES, random.Random(3), n_bos=1)
    s = chunked(chatml(MESSAGES), MESSAGES, random.Random(4), n_bos=1)
    idx = align_tokens(r, s)
    assert idx[0] == 0 and idx[1:].min() >= 1


def test_render_with_tiny_models_same_tokenizer_is_identity(tiny_rt):
    msgs = [{"role": "system", "content": MESSAGES[0]}, {"role": "user", "content": MESSAGES[1]}]
    a, b = render(tiny_rt("qwen2"), msgs), render(tiny_rt("llama"), msgs)
    assert a.ids == b.ids
    assert list(align_tokens(a, b)) == list(range(len(a.ids)))
    covered = np.zeros(len(a.text), bool)
    for x, y in a.offsets:
        covered[x:y] = True
    assert covered.all()


def test_layer_maps():
    assert terminal_map(24, 30) == tuple((i, i + 6) for i in range(24))
    assert terminal_map(24, 18) == tuple((i + 6, i) for i in range(18))
    u = uniform_map(24, 28)
    assert u[0] == (0, 0) and u[-1] == (23, 27) and len({s for _, s in u}) == 24
    u = uniform_map(24, 18)
    assert u[0] == (0, 0) and u[-1] == (23, 17) and len({r for r, _ in u}) == 18
    assert layer_map([[1, 0], [0, 2]], 4, 3) == ((0, 2), (1, 0))
    with pytest.raises(ConfigError):
        layer_map([[0, 0], [0, 1]], 4, 3)
    with pytest.raises(ConfigError):
        layer_map("diagonal", 4, 3)


@pytest.mark.zoo
def test_real_qwen_and_smollm_align_on_english_and_chinese(real_rt):
    r, s = real_rt("Qwen2.5-Coder-0.5B-Instruct"), real_rt("SmolLM2-135M-Instruct")
    for user in ["Which technology was developed most recently?\n\nA. cellular telephone\nB. television",
                 "下列关于法律推理的表述，能够成立的是____。\n\nA. 演绎推理\nB. 归纳推理"]:
        msgs = [{"role": "system", "content": "You are a helpful assistant."}, {"role": "user", "content": user}]
        R, S = render(r, msgs), render(s, msgs)
        idx = align_tokens(R, S)
        assert len(idx) == len(R.ids) and (np.diff(idx) >= 0).all() and idx.max() < len(S.ids)
        covered = np.zeros(len(R.text), bool)
        for a, b in R.offsets:
            covered[a:b] = True
        assert covered.all()
        cmap = char_map(R, S)
        for t, (a, b) in enumerate(R.offsets):  # the chosen sharer token holds the token's last character
            lo, hi = S.offsets[idx[t]]
            assert lo <= cmap[b - 1] < hi
