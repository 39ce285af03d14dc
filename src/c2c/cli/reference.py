"""The command line's reference, generated from its argparse definitions (the docs site's CLI page).

``commands()`` walks the parser: every command and sub-command, by its full name
(``"c2c keys new"``). ``markdown()`` writes each one's ``--help`` as the docs page shows it,
so the page is always the installed ``c2c``'s own help. ``flags(name)`` lists what a
command accepts, for checking that the docs name only real flags (``tests/docs``).
"""

from __future__ import annotations

import argparse
import os
from contextlib import contextmanager

from c2c.cli.main import build_parser

WIDTH = "100"  # columns argparse formats for, whatever the terminal


@contextmanager
def _columns():
    old = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = WIDTH
    try:
        yield
    finally:
        if old is None:
            os.environ.pop("COLUMNS", None)
        else:
            os.environ["COLUMNS"] = old


def commands() -> dict[str, argparse.ArgumentParser]:
    """Every command's parser by its full name, ``"c2c"`` first, in help order."""
    out: dict[str, argparse.ArgumentParser] = {}

    def walk(name: str, parser: argparse.ArgumentParser) -> None:
        out[name] = parser
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for sub, p in action.choices.items():
                    walk(f"{name} {sub}", p)

    walk("c2c", build_parser())
    return out


def flags(name: str) -> set[str]:
    """The option strings (``--json``, ``-h``) the command ``name`` accepts."""
    return {s for a in commands()[name]._actions for s in a.option_strings}


def markdown() -> str:
    """Every command's ``--help``, one section each, as Markdown."""
    parts = []
    with _columns():
        for name, parser in commands().items():
            parser.prog = name
            depth = min(name.count(" "), 2)
            parts.append(f"{'#' * (2 + depth)} `{name}`\n\n```text\n{parser.format_help().rstrip()}\n```\n")
    return "\n".join(parts)
