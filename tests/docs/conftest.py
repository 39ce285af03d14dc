"""The docs tests' fixtures: the blocks of the README and docs/, a real `c2c serve` for the server snippets,
and a closing line that counts the blocks run and skipped, with the reasons."""

from __future__ import annotations

from pathlib import Path

import pytest

from c2c.testing import doc_blocks

ROOT = Path(__file__).resolve().parents[2]
BLOCKS = doc_blocks.blocks(ROOT)
OUTCOMES: dict[str, str] = {}


@pytest.fixture(scope="session")
def docs_server(tmp_path_factory):
    """`c2c serve` of the default model, open access on loopback, as the docs start it."""
    from c2c.testing.server_process import ServeProcess, make_home

    server = ServeProcess(make_home(tmp_path_factory.mktemp("docs-serve"))).start()
    yield server
    server.stop()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    report = (yield).get_result()
    block = getattr(item, "callspec", None) and item.callspec.params.get("block")
    if isinstance(block, doc_blocks.Block) and report.when in ("setup", "call"):
        if report.skipped:
            OUTCOMES[block.id] = "skipped: " + (report.longrepr[2] if isinstance(report.longrepr, tuple) else "")
        elif report.when == "call":
            OUTCOMES[block.id] = "ran" if report.passed else "failed"


def pytest_terminal_summary(terminalreporter):
    if not OUTCOMES:
        return
    ran = sum(v == "ran" for v in OUTCOMES.values())
    skipped = {k: v for k, v in OUTCOMES.items() if v.startswith("skipped")}
    terminalreporter.write_line(f"docs blocks: {ran} ran, {len(skipped)} skipped, "
                                f"{sum(v == 'failed' for v in OUTCOMES.values())} failed, of {len(BLOCKS)}")
    for k, v in sorted(skipped.items()):
        terminalreporter.write_line(f"  {k} {v.removeprefix('skipped: Skipped: ')}")
