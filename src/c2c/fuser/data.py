"""Data for the fuser: multiple-choice questions, instruction examples, and the prompts built from them.

Evaluation reads an ARC-style jsonl file (or a folder of them) or a folder of
MMLU/C-Eval-style CSVs, with any number of options and any labels. Training
reads only the sources in :data:`TRAIN_SOURCES`; any path under a split we report
(:data:`REPORTED_SPLITS`) is refused.
"""

from __future__ import annotations

import csv
import json
import random
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Sequence

from c2c.config import data_dir
from c2c.errors import FuserDataError

SYSTEM = "You are a helpful assistant."

# Training sources, relative to the data root. ARC-Easy and MMLU dev are not reported.
TRAIN_SOURCES = {
    "lima": "train/lima.json",
    "alpaca": "train/alpaca_en_demo.json",
    "dolly": "train/dolly_hhrlhf_train_small.jsonl",
    "arc_easy": "eval/arc_easy",
    "mmlu_dev": "eval/mmlu/dev",
}
# Splits whose accuracy we report: never trained on.
REPORTED_SPLITS = ("eval/arc_challenge", "eval/openbookqa", "eval/mmlu/val", "eval/ceval/val")


def data_root(root: str | None = None) -> Path:
    """``root``, else ``C2C_DATA``, else ``../shared/data`` beside the checkout (:func:`c2c.config.data_dir`)."""

    return Path(root).expanduser() if root else data_dir()


@dataclass(frozen=True, kw_only=True)
class Question:
    """A multiple-choice question. ``options`` are ``(label, text)`` pairs in order."""

    id: str
    question: str
    options: tuple[tuple[str, str], ...]
    answer: str
    subject: str = ""

    @property
    def labels(self) -> tuple[str, ...]:
        return tuple(label for label, _ in self.options)


@dataclass(frozen=True, kw_only=True)
class Example:
    """A training example: the context messages both models read, and the Receiver's response."""

    messages: tuple[tuple[str, str], ...]   # (role, content)
    response: str
    source: str

    def message_dicts(self) -> list[dict]:
        return [{"role": r, "content": c} for r, c in self.messages]


# ----------------------------------------------------------------- prompts
def question_block(q: Question) -> str:
    head = f"The following is a multiple choice question about {q.subject.replace('_', ' ')}.\n\n" if q.subject else ""
    opts = "\n".join(f"{label}. {text}" for label, text in q.options)
    return f"{head}{q.question.strip()}\n\n{opts}"


def answer_instruction(q: Question) -> str:
    return f"Answer with the label of the correct option ({', '.join(q.labels)})."


def mc_messages(q: Question) -> list[dict]:
    """The chat context a task-tuned fuser trains on for ``q``: the question, its options, the instruction."""
    return [{"role": "system", "content": SYSTEM},
            {"role": "user", "content": f"{question_block(q)}\n\n{answer_instruction(q)}"}]


MC_RESPONSES = ("label", "label_text")


def mc_response(q: Question, style: str = "label") -> str:
    """The answer to ``q`` as the Receiver should write it: ``"B"`` or ``"B. the option's text"``."""
    if style not in MC_RESPONSES:
        raise FuserDataError(f"unknown multiple-choice response style {style!r}; use one of {MC_RESPONSES}")
    return q.answer if style == "label" else f"{q.answer}. {dict(q.options)[q.answer]}"


def mc_example(q: Question, source: str, style: str = "label") -> Example:
    msgs = mc_messages(q)
    return Example(messages=tuple((m["role"], m["content"]) for m in msgs), response=mc_response(q, style),
                   source=source)


def instruction_example(instruction: str, response: str, source: str) -> Example:
    return Example(messages=(("system", SYSTEM), ("user", instruction.strip())), response=response.strip(),
                   source=source)


# ------------------------------------------------------------ eval loaders
def load_questions(path: str | Path) -> list[Question]:
    """Questions from an ARC-style ``.jsonl`` file, a folder of them, or a folder of MMLU/C-Eval CSVs."""
    path = Path(path).expanduser()
    if path.is_file() and path.suffix == ".jsonl":
        return _arc_jsonl(path)
    if path.is_dir():
        csvs, jsonls = sorted(path.glob("*.csv")), sorted(path.glob("*.jsonl"))
        if csvs:
            return [q for f in csvs for q in _mc_csv(f)]
        if jsonls:
            return [q for f in jsonls for q in _arc_jsonl(f)]
    raise FuserDataError(f"{path} is neither an ARC-style .jsonl file nor a folder of .csv/.jsonl questions")


def _arc_jsonl(path: Path) -> list[Question]:
    out = []
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                d = json.loads(line)
                opts = tuple((str(c["label"]).strip(), str(c["text"]).strip()) for c in d["question"]["choices"])
                q = Question(id=str(d.get("id", f"{path.stem}-{n}")), question=str(d["question"]["stem"]),
                             options=opts, answer=str(d["answerKey"]).strip())
            except (ValueError, KeyError, TypeError) as e:
                raise FuserDataError(f"{path}:{n}: not an ARC-style record ({e})") from None
            out.append(_checked(q, f"{path}:{n}"))
    return out


def _mc_csv(path: Path) -> list[Question]:
    """MMLU (no header: question, options..., answer) or C-Eval (header id,question,A,..,answer[,explanation])."""
    subject = re.sub(r"_(dev|val|test)$", "", path.stem)
    with open(path, encoding="utf-8", newline="") as f:
        rows = [r for r in csv.reader(f) if r]
    if not rows:
        return []
    out = []
    if rows[0] and rows[0][0].strip().lower() == "id" and "answer" in [c.strip().lower() for c in rows[0]]:
        head = [c.strip() for c in rows[0]]
        qi, ai = head.index("question"), [c.lower() for c in head].index("answer")
        opt_cols = [i for i, c in enumerate(head) if re.fullmatch(r"[A-Z]", c)]
        for n, r in enumerate(rows[1:], 2):
            try:
                q = Question(id=f"{subject}-{r[0]}", question=r[qi], answer=r[ai].strip(), subject=subject,
                             options=tuple((head[i], r[i].strip()) for i in opt_cols))
            except IndexError:
                raise FuserDataError(f"{path}:{n}: row has {len(r)} columns, header has {len(head)}") from None
            out.append(_checked(q, f"{path}:{n}"))
    else:
        for n, r in enumerate(rows, 1):
            if len(r) < 4:
                raise FuserDataError(f"{path}:{n}: expected question, at least two options and an answer")
            labels = [chr(ord("A") + i) for i in range(len(r) - 2)]
            q = Question(id=f"{subject}-{n}", question=r[0], answer=r[-1].strip(), subject=subject,
                         options=tuple(zip(labels, (c.strip() for c in r[1:-1]))))
            out.append(_checked(q, f"{path}:{n}"))
    return out


def _checked(q: Question, where: str) -> Question:
    if len(q.options) < 2 or len(set(q.labels)) != len(q.labels):
        raise FuserDataError(f"{where}: needs at least two options with distinct labels")
    if q.answer not in q.labels:
        raise FuserDataError(f"{where}: answer {q.answer!r} is not one of the labels {list(q.labels)}")
    return q


def subset(questions: Sequence[Question], limit: int | None, seed: int = 0) -> list[Question]:
    """A fixed random subset of ``limit`` questions (all of them when ``limit`` is None), in file order."""
    if limit is None or limit >= len(questions):
        return list(questions)
    keep = sorted(random.Random(seed).sample(range(len(questions)), limit))
    return [questions[i] for i in keep]


# ----------------------------------------------------------- train loaders
def check_not_reported(path: Path, root: Path) -> None:
    """Refuse a training path inside a split we report accuracy on."""
    p = path.resolve()
    for split in REPORTED_SPLITS:
        r = (root / split).resolve()
        if p == r or r in p.parents or p in r.parents:
            raise FuserDataError(f"{path} is (or contains) the reported split {split}; never train on it")


def load_source(name: str, root: str | Path | None = None, mc_style: str = "label") -> list[Example]:
    """All examples of one training source (see :data:`TRAIN_SOURCES`), in file order.

    ``mc_style`` is how multiple-choice answers are written (see :func:`mc_response`).
    """
    if name not in TRAIN_SOURCES:
        raise FuserDataError(f"unknown training source {name!r}; use one of {sorted(TRAIN_SOURCES)}")
    base = data_root(str(root) if root else None)
    path = base / TRAIN_SOURCES[name]
    check_not_reported(path, base)
    if not path.exists():
        raise FuserDataError(f"training source {name} not found at {path}; set C2C_DATA to the data folder")
    if name in ("arc_easy", "mmlu_dev"):
        return [mc_example(q, name, mc_style) for q in load_questions(path)]
    if name == "dolly":
        out = []
        with open(path, encoding="utf-8") as f:
            for line in f:
                if line.strip():
                    d = json.loads(line)
                    out.append(instruction_example(_strip_template(d["prompt"]), d["response"], name))
        return out
    rows = json.loads(path.read_text(encoding="utf-8"))
    return [instruction_example(r["instruction"] + (f"\n\n{r['input']}" if r.get("input") else ""),
                                r["output"], name) for r in rows]


_DOLLY = re.compile(r"### Instruction:\s*(.*?)\s*### Response:\s*$", re.S)


def _strip_template(prompt: str) -> str:
    """Dolly prompts come wrapped in an Alpaca template; keep the instruction only."""
    m = _DOLLY.search(prompt)
    return m.group(1) if m else prompt


def mixture(counts: dict[str, int], *, seed: int, root: str | Path | None = None,
            mc_style: str = "label") -> list[Example]:
    """Up to ``counts[name]`` examples of each source, drawn with ``seed``, then shuffled together."""
    rng = random.Random(seed)
    out: list[Example] = []
    for name, pool, picked in _draws(counts, rng, root, mc_style):
        out.extend(pool[i] for i in picked)
    rng.shuffle(out)
    return out


def held_out(sources: Sequence[str], runs: Sequence[tuple[dict[str, int], int]], *,
             root: str | Path | None = None) -> list[Example]:
    """The examples of ``sources`` that no run drew: each run is ``(counts, seed)`` as given to
    :func:`mixture`. In source order (sorted names), then file order; nothing is shuffled."""
    taken: dict[str, set[int]] = {}
    for counts, seed in runs:
        for name, _, picked in _draws(counts, random.Random(seed), root, "label"):
            taken.setdefault(name, set()).update(picked)
    out: list[Example] = []
    for name in sorted(set(sources)):
        pool = load_source(name, root)
        out.extend(e for i, e in enumerate(pool) if i not in taken.get(name, ()))
    return out


def _draws(counts: dict[str, int], rng: random.Random, root: str | Path | None, mc_style: str):
    """``(name, pool, drawn indices)`` per source, in sorted order, advancing ``rng`` as :func:`mixture` does."""
    for name in sorted(counts):
        pool = load_source(name, root, mc_style)
        yield name, pool, rng.sample(range(len(pool)), min(counts[name], len(pool)))


def iter_nonempty(examples: Iterable[Example]) -> Iterable[Example]:
    return (e for e in examples if e.response and all(c for _, c in e.messages))
