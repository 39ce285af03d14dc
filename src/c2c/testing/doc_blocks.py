"""The commands and snippets of the README and ``docs/``, as tests run them.

Every fenced ``bash`` or ``python`` block carries a marker on the line before it::

    <!-- test: run -->                     run as written (a shell block from the repository root,
                                           a Python block in a fresh folder, with a private C2C_HOME)
    <!-- test: run continue: WHY -->       a Python block that goes on from the one before it
    <!-- test: serve -->                   Python against a real ``c2c serve`` of the default model
    <!-- test: vllm -->                    Python against a real ``vllm serve`` with the connector
    <!-- test: skip WHY -->                not run here, and why

A block without a marker fails the test that lists them (``tests/docs``): a new snippet is
either run or says why it cannot be. Blocks of other languages (text, JSON, Mermaid) are
not commands. :func:`command_flags` finds every ``c2c ...`` command line the docs name, so
that its flags can be checked against the parser (:mod:`c2c.cli.reference`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

LANGS = {"bash": "bash", "sh": "bash", "shell": "bash", "console": "bash", "python": "python", "py": "python"}
KINDS = ("run", "serve", "vllm", "skip")
_FENCE = re.compile(r"^```([A-Za-z]*)[^\n]*\n(.*?)^```[ \t]*$", re.M | re.S)
_MARKER = re.compile(r"<!--\s*test:\s*(\w+)\s*(.*?)\s*-->\s*$")


@dataclass(frozen=True)
class Block:
    """One fenced block of a page: where, its language, its marker (None: missing) and its code."""

    path: str
    line: int
    lang: str
    kind: str | None
    note: str
    code: str

    @property
    def id(self) -> str:
        return f"{self.path}:{self.line}"

    @property
    def continues(self) -> bool:
        return self.kind == "run" and self.note.startswith("continue")


def pages(root: Path) -> list[Path]:
    """The README and every page of ``docs/``."""
    return [root / "README.md"] + sorted((root / "docs").glob("*.md"))


def blocks(root: Path) -> list[Block]:
    """Every bash and Python block of :func:`pages`, in order."""
    out = []
    for page in pages(root):
        text = page.read_text()
        for m in _FENCE.finditer(text):
            lang = LANGS.get(m.group(1).lower())
            if lang is None:
                continue
            line = text.count("\n", 0, m.start()) + 1
            before = text[:m.start()].rstrip("\n").rsplit("\n", 1)[-1]
            marker = _MARKER.search(before)
            kind, note = (marker.group(1), marker.group(2)) if marker else (None, "")
            out.append(Block(path=str(page.relative_to(root)), line=line, lang=lang, kind=kind, note=note,
                             code=m.group(2)))
    return out


def with_context(block: Block, every: list[Block]) -> str:
    """A ``run continue`` block's code after the blocks it goes on from (same page, in order)."""
    if not block.continues:
        return block.code
    same = [b for b in every if b.path == block.path and b.lang == "python" and b.line < block.line]
    chain = []
    for b in reversed(same):
        chain.insert(0, b.code)
        if not b.continues:
            break
    return "".join(chain) + block.code


_COMMAND = re.compile(r"(?:^|[\s`(])(?:\.venv/bin/)?c2c((?: [a-z][a-z0-9-]*)+)([^`\n|;&)]*)")


def command_flags(text: str, known: set[str]) -> list[tuple[str, str]]:
    """``(command, flag)`` for every ``--flag`` written after a ``c2c`` command in ``text`` (in the same
    code span or line, up to a pipe or ``;``); ``known`` holds the full command names (``"c2c keys new"``)."""
    out = []
    for m in _COMMAND.finditer(text):
        words = m.group(1).split()
        name = "c2c"
        for i, w in enumerate(words):
            if f"{name} {w}" in known:
                name = f"{name} {w}"
            else:
                rest = " ".join(words[i:]) + m.group(2)
                break
        else:
            rest = m.group(2)
        if name == "c2c":  # prose ("the c2c command ..."), not a command line
            continue
        for flag in re.findall(r"(?<![\w-])(--[a-z][a-z0-9-]*)", rest.split(" # ")[0]):
            out.append((name, flag))
    return out
