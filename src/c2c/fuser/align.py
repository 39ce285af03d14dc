"""Token and layer alignment between a Receiver and a Sharer.

Token alignment. The Receiver's tokenization is the base: the fused cache has
one entry per Receiver token. Both models render the *same* messages with their
*own* chat template; the rendering is cut into sections, alternately template
text and message content::

    [template][content 0][template][content 1]...[template]

Section ``i`` of one rendering corresponds to section ``i`` of the other.
Content characters map one to one (the text is identical); template characters
map proportionally (``<|im_start|>user\\n`` and ``User: `` have nothing else in
common). Each Receiver token is then mapped to the Sharer tokens that cover the
characters its own characters map to, and we keep the *last* of them: in a
causal model it is the one that has read all of those characters.

Layer alignment. A :data:`LayerMap` pairs each fused Receiver layer with one
Sharer layer. ``terminal`` (default) lines up the last layers; ``uniform``
spreads the shallower model over the deeper one. Add a strategy to
:data:`LAYER_MAPS` to plug in another.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np

from c2c.context import Interval
from c2c.errors import AlignmentError, ConfigError
from c2c.runtime.protocol import Offsets, require

# (receiver_layer, sharer_layer) pairs, receiver layers ascending.
LayerMap = tuple[tuple[int, int], ...]

TEMPLATE, CONTENT = "template", "content"


@dataclass(frozen=True, kw_only=True)
class Section(Interval):
    """Characters ``[start, end)`` of a rendering: template text or a message's content."""

    kind: str


@dataclass(frozen=True, kw_only=True)
class Rendered:
    """One model's rendering of a conversation, tokenized with character spans.

    Attributes:
        text: the rendered string (without BOS).
        sections: ``2 * n_messages + 1`` sections covering ``text`` exactly.
        ids: token ids, starting with ``n_bos`` BOS ids that cover no characters.
        offsets: ``[a, b)`` character span of each token (``(0, 0)`` for BOS).
    """

    text: str
    sections: tuple[Section, ...]
    ids: tuple[int, ...]
    offsets: tuple[tuple[int, int], ...]
    n_bos: int = 0


def split_sections(text: str, contents: Sequence[str]) -> tuple[Section, ...]:
    """Cut ``text`` into template/content sections by finding each content in order.

    Raises:
        AlignmentError: a message's content does not appear verbatim, in order
            (the template rewrote it), so sections cannot be matched.
    """
    out: list[Section] = []
    cursor = 0
    for i, content in enumerate(contents):
        pos = text.find(content, cursor) if content else cursor
        if pos < 0:
            raise AlignmentError(
                f"message {i} does not appear verbatim in the rendered chat (the template changed it); "
                "strip surrounding whitespace from messages or use a model whose template keeps content")
        out.append(Section(kind=TEMPLATE, start=cursor, end=pos))
        out.append(Section(kind=CONTENT, start=pos, end=pos + len(content)))
        cursor = pos + len(content)
    out.append(Section(kind=TEMPLATE, start=cursor, end=len(text)))
    return tuple(out)


def render(runtime, messages: Sequence[dict]) -> Rendered:
    """Render ``messages`` with ``runtime``'s own template (or its plain fallback) and tokenize.

    The rendering has no generation prompt: it is the shared context both models read.
    """
    msgs = [{"role": m["role"], "content": m["content"]} for m in messages]
    text = runtime.render_chat(msgs)
    if text is None:  # base model: the runtime's plain "Role: content" turns
        text = "".join(runtime.render_turn(m["role"], m["content"]) for m in msgs)
    sections = split_sections(text, [m["content"] for m in msgs])
    ids, offsets = require(runtime, Offsets).encode_with_offsets(text)
    bos = tuple(runtime.bos_ids)
    return Rendered(text=text, sections=sections, ids=bos + tuple(ids),
                    offsets=((0, 0),) * len(bos) + tuple(offsets), n_bos=len(bos))


def char_map(receiver: Rendered, sharer: Rendered) -> np.ndarray:
    """For every Receiver character, the Sharer character it corresponds to: ``(len(receiver.text),)``."""
    if len(receiver.sections) != len(sharer.sections):
        raise AlignmentError(
            f"the renderings have {len(receiver.sections)} and {len(sharer.sections)} sections; "
            "render the same messages for both models")
    if not sharer.text:
        raise AlignmentError("the Sharer's rendering is empty")
    out = np.empty(len(receiver.text), dtype=np.int64)
    for r, s in zip(receiver.sections, sharer.sections):
        if r.kind != s.kind:
            raise AlignmentError("section kinds differ between the renderings")
        if r.length == 0:
            continue
        j = np.arange(r.length)
        if r.kind == CONTENT:
            if r.length != s.length:
                raise AlignmentError("a message's content differs between the renderings")
            out[r.start:r.end] = s.start + j
        elif s.length > 0:
            out[r.start:r.end] = s.start + (j * s.length) // r.length  # proportional
        else:  # the Sharer's template has nothing here: use the character just before
            out[r.start:r.end] = max(s.start - 1, 0)
    return out


def _char_to_token(rendered: Rendered) -> np.ndarray:
    """Index of the (last) token covering each character; gaps take the token before."""
    owner = np.full(len(rendered.text), -1, dtype=np.int64)
    for t in range(rendered.n_bos, len(rendered.ids)):
        a, b = rendered.offsets[t]
        owner[a:b] = t
    first = rendered.n_bos if len(rendered.ids) > rendered.n_bos else 0
    last = first
    for c in range(len(owner)):  # forward fill (rare: trimmed whitespace)
        if owner[c] < 0:
            owner[c] = last
        last = owner[c]
    return owner


def _groups(rendered: Rendered) -> tuple[np.ndarray, np.ndarray]:
    """Position of each token in its run of tokens with the same span, and the run's length.

    Byte-level tokenizers split one character into several tokens that all report
    that character's span; such a run is aligned position by position.
    """
    n = len(rendered.ids)
    pos, size = np.zeros(n, dtype=np.int64), np.ones(n, dtype=np.int64)
    t = rendered.n_bos
    while t < n:
        u = t
        while u + 1 < n and rendered.offsets[u + 1] == rendered.offsets[t]:
            u += 1
        pos[t:u + 1] = np.arange(u - t + 1)
        size[t:u + 1] = u - t + 1
        t = u + 1
    return pos, size


def align_tokens(receiver: Rendered, sharer: Rendered) -> np.ndarray:
    """For each Receiver token, the index of the Sharer token aligned to it: ``(T_r,)``.

    A Receiver token covering characters ``[a, b)`` maps to the last Sharer token
    covering any of the characters those map to. When both sides split one
    character into a run of tokens (byte-level BPE), the ``j``-th of ``m`` Receiver
    tokens maps proportionally into the Sharer's run of ``n``, the last to the last.
    BOS tokens map to the Sharer's last BOS (or its first token); a token with no
    characters repeats its predecessor's mapping. The result never decreases.
    """
    cmap = char_map(receiver, sharer)
    owner = _char_to_token(sharer)
    r_pos, r_size = _groups(receiver)
    s_pos, s_size = _groups(sharer)
    bos_target = max(sharer.n_bos - 1, 0)
    out = np.empty(len(receiver.ids), dtype=np.int64)
    prev = bos_target
    for t, (a, b) in enumerate(receiver.offsets):
        if t < receiver.n_bos:
            out[t] = bos_target
        elif b > a:
            u = int(owner[cmap[a:b]].max())           # last token of its run
            first, n = u - int(s_pos[u]), int(s_size[u])
            # never step back: overlapping byte-level spans could otherwise reorder tokens
            out[t] = max(prev, first + max(0, ((int(r_pos[t]) + 1) * n) // int(r_size[t]) - 1))
        else:
            out[t] = prev
        prev = out[t]
    return out


# ------------------------------------------------------------------ layers
def terminal_map(n_receiver: int, n_sharer: int) -> LayerMap:
    """Line up the last layers: receiver ``L_r - 1 - i`` with sharer ``L_s - 1 - i``."""
    n = min(n_receiver, n_sharer)
    return tuple((n_receiver - n + i, n_sharer - n + i) for i in range(n))


def uniform_map(n_receiver: int, n_sharer: int) -> LayerMap:
    """Every layer of the shallower model, spread evenly over the deeper one, ends aligned."""
    if n_receiver <= n_sharer:
        return tuple((i, round(i * (n_sharer - 1) / max(n_receiver - 1, 1))) for i in range(n_receiver))
    return tuple((round(j * (n_receiver - 1) / max(n_sharer - 1, 1)), j) for j in range(n_sharer))


LAYER_MAPS: dict[str, Callable[[int, int], LayerMap]] = {"terminal": terminal_map, "uniform": uniform_map}


def layer_map(spec: str | Sequence[Sequence[int]], n_receiver: int, n_sharer: int) -> LayerMap:
    """A :data:`LayerMap` from a strategy name or explicit ``[[receiver, sharer], ...]`` pairs."""
    if isinstance(spec, str):
        if spec not in LAYER_MAPS:
            raise ConfigError(f"unknown layer map {spec!r}; use one of {sorted(LAYER_MAPS)} or explicit pairs")
        return LAYER_MAPS[spec](n_receiver, n_sharer)
    pairs = tuple(sorted((int(r), int(s)) for r, s in spec))
    rs = [r for r, _ in pairs]
    if len(set(rs)) != len(rs) or not all(0 <= r < n_receiver and 0 <= s < n_sharer for r, s in pairs):
        raise ConfigError(f"layer map {list(pairs)} is out of range for {n_receiver} receiver and "
                          f"{n_sharer} sharer layers, or maps a receiver layer twice")
    return pairs
