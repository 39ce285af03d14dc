"""Every command and snippet of the README and docs/ runs in a test, or says why it cannot; the flags the docs
name exist; the docs site builds in strict mode; the README stays short."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from c2c.testing import doc_blocks

from conftest import BLOCKS, ROOT

BIN = str(Path(sys.executable).parent)


def test_every_block_is_run_or_says_why():
    assert len(BLOCKS) >= 15
    unmarked = [b.id for b in BLOCKS if b.kind is None]
    assert unmarked == [], f"blocks without a <!-- test: ... --> marker: {unmarked}"
    assert {b.kind for b in BLOCKS} <= set(doc_blocks.KINDS)
    assert all(b.note for b in BLOCKS if b.kind == "skip"), "a skip says why"
    assert [b.id for b in BLOCKS if b.lang == "bash" and b.kind in ("serve", "vllm")] == []


def test_the_readme_is_short_and_its_snippets_are_short():
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) <= 200
    firsts = [b for b in BLOCKS if b.path == "README.md" and b.lang == "python"]
    assert len(firsts) == 3 and all(len(b.code.splitlines()) < 15 for b in firsts)   # one per front-end


def run_python(code: str, tmp_path: Path, env: dict | None = None, timeout: int = 600) -> subprocess.CompletedProcess:
    from c2c.testing.server_process import make_home

    script = tmp_path / "snippet.py"
    script.write_text(code)
    home = make_home(tmp_path)   # its own keys and store; the pulled models linked
    full = {**os.environ, "C2C_HOME": str(home), "PATH": f"{BIN}:{os.environ.get('PATH', '')}", **(env or {})}
    return subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=full, capture_output=True, text=True,
                          timeout=timeout)


@pytest.mark.parametrize("block", [b for b in BLOCKS if b.kind in ("run", "skip", "serve")], ids=lambda b: b.id)
def test_block(block, tmp_path, request):
    if block.kind == "skip":
        pytest.skip(block.note)
    if block.lang == "bash":
        env = {**os.environ, "PATH": f"{BIN}:{os.environ.get('PATH', '')}"}
        proc = subprocess.run(["bash", "-euo", "pipefail", "-c", block.code], cwd=ROOT, env=env,
                              capture_output=True, text=True, timeout=900)
    elif block.kind == "serve":
        server = request.getfixturevalue("docs_server")
        code = block.code.replace("http://127.0.0.1:8000/v1", server.base_url)
        proc = run_python(code, tmp_path)
    else:
        proc = run_python(doc_blocks.with_context(block, BLOCKS), tmp_path)
    assert proc.returncode == 0, f"{block.id} failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}"
    assert proc.stdout.strip(), f"{block.id} printed nothing"


def test_every_flag_the_docs_name_is_the_commands_own():
    from c2c.cli import reference

    known = set(reference.commands())
    named = [(str(p.relative_to(ROOT)), cmd, flag) for p in doc_blocks.pages(ROOT)
             for cmd, flag in doc_blocks.command_flags(p.read_text(), known)]
    assert len(named) > 50
    wrong = [x for x in named if x[2] not in reference.flags(x[1])]
    assert wrong == [], f"flags the docs name that the command does not take: {wrong}"
    assert doc_blocks.command_flags("`c2c serve --no-such-flag`", known) == [("c2c serve", "--no-such-flag")]


def test_the_docs_site_builds_in_strict_mode_with_the_generated_pages(tmp_path):
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    proc = subprocess.run([f"{BIN}/mkdocs", "build", "--strict", "-q", "-d", str(tmp_path / "site")], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    site = tmp_path / "site"
    cli = (site / "cli" / "index.html").read_text()
    assert "c2c keys new" in cli and "--prefill-chunk" in cli            # generated from the parser
    bench = (site / "benchmarks" / "index.html").read_text()
    pngs = sorted(p.name for p in (ROOT / "benchmarks" / "results").glob("*.png"))
    assert pngs and all(f"results/{name}" in bench for name in pngs)      # every plot is shown
    assert all((site / "results" / name).is_file() for name in pngs)
    home = (site / "index.html").read_text()
    assert "Which front-end" in home and 'href="vllm/"' in home          # the README, its links the site's


def test_the_common_refusals_point_to_their_fix_in_the_docs():
    from c2c import errors

    common = [errors.FingerprintMismatchError, errors.PrefixMismatchError, errors.DomainMismatchError,
              errors.CommitNotVisibleError, errors.StaleCommitError, errors.QuotaExceededError,
              errors.UnverifiableError, errors.RuntimeUnsupportedError, errors.IncompatibleCacheError,
              errors.MapMismatchError]
    trust = (ROOT / "docs" / "trust.md").read_text()
    anchors = set()
    for cls in common:
        page, anchor = cls.doc.split("#")
        anchors.add(anchor)
        assert page == "trust.md" and f"\n### {anchor}\n" in trust and f"`{cls.__name__}`" in trust, cls
        e = cls("attach it in auto")
        assert str(e) == f"attach it in auto (see docs/{cls.doc})"
        assert errors.error_named(cls.__name__, str(e)).__str__() == str(e)      # not twice across a process
        assert errors.error_payload(e)[1]["error"]["message"].endswith(f"(see docs/{cls.doc})")
    assert len(anchors) == 10
    assert errors.ContextEditError.doc is None and str(errors.ContextEditError("x")) == "x"
