"""A document-QA task the zoo models can do: a fact planted in real text, answered by exact match.

Each question takes a window of real English prose (the outputs of the LIMA corpus
in ``$C2C_DATA/train/lima.json``) of about ``doc_tokens`` tokens and plants one
made-up fact in it as a plain sentence, between two of its sentences::

    "The access code of the north depot is 4817."   ->   "What is the access code of the north depot?"

The values are drawn at random (seeded), so no model knows them beforehand: a
model answers right only by reading the document (the ``none`` condition, without
the document, measures that floor). Answers are scored by exact match after
SQuAD's normalization (lower case, no punctuation, no articles, single spaces) of
the reply's first line.

Every approximate path of c2c (a slice at its original positions, repair, noise,
another role adapter's cache) can be measured on it against the text baseline.
"""

from __future__ import annotations

import random
import re
import string
from dataclasses import asdict, dataclass

from c2c.bench.handoff import corpus_text

SYSTEM = "You answer questions about a document. Reply with the exact answer only: no other words."
_SYLLABLES = ("ka", "lo", "mi", "ren", "tes", "vo", "dar", "ul", "sen", "bri", "qua", "nox", "fel", "ith", "mor")
_PLACES = ("north depot", "east archive", "river lab", "old mill", "glass tower", "south hangar", "blue annex",
           "harbor office", "hill station", "stone vault")
_ITEMS = ("red ledger", "spare battery", "brass key", "field radio", "first-aid kit", "survey map", "signal lamp")
_DAYS = ("Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday")
_COLORS = ("amber", "violet", "teal", "crimson", "ochre", "indigo", "silver", "olive")


@dataclass(frozen=True, kw_only=True)
class Question:
    id: str
    doc_tokens: int
    document: str
    fact: str
    question: str
    answer: str

    def to_dict(self) -> dict:
        return asdict(self)


def _name(rng: random.Random) -> str:
    return "".join(rng.choice(_SYLLABLES) for _ in range(rng.randint(2, 3))).capitalize()


def fact(rng: random.Random) -> tuple[str, str, str]:
    """(sentence, question, answer) of one made-up fact with random values."""
    kind = rng.randrange(6)
    if kind == 0:
        place, code = rng.choice(_PLACES), str(rng.randint(1000, 9999))
        return (f"The access code of the {place} is {code}.", f"What is the access code of the {place}?", code)
    if kind == 1:
        who, num = _name(rng), str(rng.randint(100, 999))
        return f"{who}'s badge number is {num}.", f"What is {who}'s badge number?", num
    if kind == 2:
        who, day = _name(rng), rng.choice(_DAYS)
        return (f"The meeting with {who} is on {day}.", f"On which day is the meeting with {who}?", day)
    if kind == 3:
        who, city = _name(rng), _name(rng)
        return f"{who} was born in the town of {city}.", f"In which town was {who} born?", city
    if kind == 4:
        item, num = rng.choice(_ITEMS), str(rng.randint(10, 99))
        return (f"The {item} is kept in locker {num}.", f"In which locker is the {item} kept?", num)
    color, who = rng.choice(_COLORS), _name(rng)
    return (f"{who}'s favorite color is {color}.", f"What is {who}'s favorite color?", color)


def build(runtime, n: int, doc_tokens: int, *, seed: int = 0) -> list[Question]:
    """``n`` questions over documents of about ``doc_tokens`` tokens of ``runtime``'s tokenizer."""
    paragraphs = prose()
    rng = random.Random(seed * 1_000_003 + doc_tokens)
    out = []
    for i in range(n):
        sentences = window(runtime, paragraphs, rng, doc_tokens)
        sentence, question, answer = fact(rng)
        document = plant(sentences, [sentence], rng)
        out.append(Question(id=f"cqa-{doc_tokens}-{seed}-{i}", doc_tokens=doc_tokens, document=document,
                            fact=sentence, question=question, answer=answer))
    return out


def prose() -> list[str]:
    """The corpus's paragraphs of real prose (LIMA's outputs) that documents are cut from."""
    return [p for p in corpus_text(2_000_000).split("\n\n") if len(p) > 200]


def window(runtime, paragraphs: list[str], rng: random.Random, doc_tokens: int) -> list[str]:
    """The sentences of a window of about ``doc_tokens`` tokens of ``paragraphs``, from a random one on:
    whole paragraphs until long enough, then cut at a sentence end."""
    j = rng.randrange(len(paragraphs))
    chunk, ids = "", []
    while len(ids) < doc_tokens:
        chunk += ("\n\n" if chunk else "") + paragraphs[j % len(paragraphs)]
        j += 1
        ids = runtime.encode(chunk)
    sentences = re.split(r"(?<=[.!?])\s+", runtime.decode(ids[:doc_tokens]))
    return sentences[:-1] if len(sentences) > 1 else sentences  # without the cut-off tail


def plant(sentences: list[str], facts: list[str], rng: random.Random) -> str:
    """``sentences`` joined, with each of ``facts`` inserted between two of them at random."""
    out = list(sentences)
    for f in facts:
        out.insert(rng.randint(0, len(out)), f)
    return " ".join(out)


def normalize(text: str) -> str:
    """SQuAD's answer normalization: lower case, no punctuation, no articles, single spaces."""
    text = text.lower()
    text = "".join(ch for ch in text if ch not in set(string.punctuation))
    text = re.sub(r"\b(a|an|the)\b", " ", text)
    return " ".join(text.split())


def contains_answer(reply: str, answer: str) -> bool:
    """The normalized answer appears, as whole words, in the reply's first line, normalized (a reply that
    answers in a sentence, "Kaith's favorite color is amber.", counts)."""
    first = reply.strip().split("\n", 1)[0] if reply.strip() else ""
    return f" {normalize(answer)} " in f" {normalize(first)} "


def exact_match(reply: str, answer: str) -> bool:
    """The reply's first line, normalized, equals the normalized answer."""
    first = reply.strip().split("\n", 1)[0] if reply.strip() else ""
    return normalize(first) == normalize(answer)
