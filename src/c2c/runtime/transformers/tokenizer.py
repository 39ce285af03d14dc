"""A transformers tokenizer behind plain functions: ids, text, character offsets, chat template, identity."""

from __future__ import annotations

import hashlib
import json
from typing import Sequence

from c2c.errors import RuntimeUnsupportedError
from c2c.runtime.turns import ChatTurns


def encode(tokenizer, text: str) -> list[int]:
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


def decode(tokenizer, ids: Sequence[int]) -> str:
    return tokenizer.decode(list(ids), skip_special_tokens=True)


def encode_with_offsets(tokenizer, text: str) -> tuple[list[int], list[tuple[int, int]]]:
    """Token ids of ``text`` (as :func:`encode`) and each token's character span ``[a, b)``.

    Used by the fuser to align two tokenizers by characters. Needs a fast
    tokenizer (every zoo model has one).
    """
    if not getattr(tokenizer, "is_fast", False):
        raise RuntimeUnsupportedError("character offsets need a fast (Rust) tokenizer")
    enc = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    return list(enc["input_ids"]), [(int(a), int(b)) for a, b in enc["offset_mapping"]]


def chars_per_token(tokenizer) -> float | None:
    """The most characters of text that one token can stand for; ``None`` when that is unbounded.

    What lets a server refuse an oversized prompt without tokenizing it: a text of ``n``
    characters is at least ``n / chars_per_token`` tokens. A token stands for at most as
    many characters as its own string holds: in a byte-level vocabulary each of its
    characters is one byte of text (at least one character's worth); elsewhere ``▁`` is one
    space and ``<0x0A>`` one byte. A normalizer that composes Unicode (NFC, NFKC) joins at
    most 4 code points into one, and one of at least 2 bytes from at most 3: x1.5 on a
    byte-level vocabulary, x4 elsewhere. A slow tokenizer, a normalizer that can drop text
    (strip, accents, control characters, an unknown one) and an added token that swallows
    whitespace make the bound unknown: ``None``.
    """
    if not getattr(tokenizer, "is_fast", False):
        return None
    spec = json.loads(tokenizer.backend_tokenizer.to_str())
    if any(t.get("lstrip") or t.get("rstrip") for t in spec.get("added_tokens") or ()):
        return None
    composes = _composes(spec.get("normalizer"))
    if composes is None:
        return None
    longest = max(len(t) for t in tokenizer.get_vocab())  # added tokens included
    byte_level = "ByteLevel" in json.dumps([spec.get("pre_tokenizer"), spec.get("decoder")])
    return float(longest) * ((1.5 if byte_level else 4.0) if composes else 1.0)


def _composes(normalizer: dict | None) -> bool | None:
    """Whether a normalizer (tokenizer.json's) may join characters; ``None`` if it may shrink text otherwise."""
    if normalizer is None:
        return False
    kind = normalizer.get("type")
    if kind == "Sequence":
        each = [_composes(n) for n in normalizer.get("normalizers") or ()]
        return None if None in each else any(each)
    if kind in ("NFC", "NFKC"):
        return True
    if kind in ("NFD", "NFKD", "Prepend", "Lowercase"):
        return False
    if kind == "Replace":
        pattern = (normalizer.get("pattern") or {}).get("String")
        return False if pattern is not None and len(normalizer.get("content", "")) >= len(pattern) else None
    return None


def bos_ids(tokenizer) -> list[int]:
    """The ids a sequence must start with (e.g. Gemma's <bos>); empty for ChatML models."""
    probe = tokenizer("x", add_special_tokens=True)["input_ids"]
    bare = tokenizer("x", add_special_tokens=False)["input_ids"]
    return list(probe[: len(probe) - len(bare)]) if probe[-len(bare):] == bare else []


def render_chat(tokenizer, messages: list[dict], add_generation_prompt: bool = False, *,
                tools: list[dict] | None = None) -> str | None:
    """Render with the tokenizer's chat template (given ``tools``), or ``None`` when it has none."""
    if not tokenizer.chat_template:
        return None
    return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=add_generation_prompt,
                                         tools=tools or None)


def tokenizer_material(tokenizer, *, template: bool = True) -> bytes:
    """Canonical bytes that identify a tokenizer's behaviour (vocab, specials, and the template
    unless ``template=False``)."""
    vocab = tokenizer.get_vocab()
    payload = {
        "vocab": sorted(vocab.items(), key=lambda kv: kv[1]),
        "added": sorted(str(t) for t in tokenizer.all_special_tokens),
        "chat_template": tokenizer.chat_template or "",
        "bos": tokenizer.bos_token_id,
        "class": type(tokenizer).__name__,
    }
    if not template:
        del payload["chat_template"]
    return json.dumps(payload, ensure_ascii=False, sort_keys=True, separators=(",", ":")).encode()


def folder_digest(path) -> str:
    """The tokenizer digest of a model folder, as :class:`TransformersRuntime` records it for a model loaded
    from there: sha256 of :func:`tokenizer_material`. Another engine that loads the folder (vLLM's connector)
    records this digest too, so that the two fingerprints differ only in the engine."""
    from transformers import AutoTokenizer  # lazy: vLLM's connector calls this once per process

    tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True)
    return hashlib.sha256(tokenizer_material(tokenizer)).hexdigest()


def grammar_tokenizer(tokenizer):
    """``tokenizer`` as llguidance reads it (each token's bytes, its end-of-sequence token), for constrained
    decoding (:mod:`c2c.runtime.grammar`)."""
    import llguidance.hf  # lazy: it loads transformers' tokenizer machinery, needed only for structured output

    return llguidance.hf.from_tokenizer(tokenizer)


class TemplateText(ChatTurns):
    """A model folder's tokenizer and chat template without its weights: the text side of a runtime (``encode``,
    ``decode``, ``bos_ids``, ``render_chat``, ``render_turn``), for a front-end whose engine holds the model
    elsewhere (vLLM's connector, which declares a commit's shared prefix with it)."""

    def __init__(self, path):
        from transformers import AutoTokenizer  # lazy: a connector loads it on its first publish

        self._tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True)
        self.bos_ids = tuple(bos_ids(self._tokenizer))

    def encode(self, text: str) -> list[int]:
        return encode(self._tokenizer, text)

    def decode(self, ids: Sequence[int]) -> str:
        return decode(self._tokenizer, ids)

    def render_chat(self, messages: list[dict], add_generation_prompt: bool = False, *,
                    tools: list[dict] | None = None) -> str | None:
        return render_chat(self._tokenizer, messages, add_generation_prompt, tools=tools)
