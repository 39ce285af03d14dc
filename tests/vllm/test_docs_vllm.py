"""The README's vLLM snippet, as written, against a real `vllm serve` with the connector (docs blocks marked vllm)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from c2c.testing import doc_blocks

ROOT = Path(__file__).resolve().parents[2]
VLLM_BLOCKS = [b for b in doc_blocks.blocks(ROOT) if b.kind == "vllm"]


def test_the_docs_have_a_vllm_snippet():
    assert [b.path for b in VLLM_BLOCKS] == ["README.md"]


@pytest.mark.vllm
@pytest.mark.slow
@pytest.mark.redis
@pytest.mark.parametrize("block", VLLM_BLOCKS, ids=lambda b: b.id)
def test_the_vllm_snippet_runs_as_written(block, vllm_server, tmp_path):
    assert 'model="smol"' in block.code and vllm_server.name == "smol"   # the name docs/vllm.md's command serves
    script = tmp_path / "snippet.py"
    script.write_text(block.code.replace("http://127.0.0.1:8000/v1", vllm_server.base_url))
    proc = subprocess.run([sys.executable, str(script)], cwd=tmp_path, capture_output=True, text=True, timeout=300,
                          env=dict(os.environ))
    assert proc.returncode == 0, proc.stderr[-3000:]
    path, cached = proc.stdout.split()
    assert path == "cache" and int(cached) > 0        # the writer continued from the analyst's commit


def test_every_documented_vllm_start_sets_its_kv_cache_size():
    """Probe 3, item 9: without VLLM_CPU_KVCACHE_SPACE vLLM's CPU backend asks for 0.92 of the machine's memory
    and does not start on a 24 GiB machine; every command the docs give to start it sets the variable."""
    starts = [b for b in doc_blocks.blocks(ROOT)
              if "vllm.entrypoints.openai.api_server" in b.code or "vllm serve " in b.code.replace("`", "")]
    assert starts, "the docs show no command that starts vLLM"
    for b in starts:
        for line in b.code.splitlines():
            if "vllm.entrypoints.openai.api_server" in line or line.lstrip().startswith("vllm serve "):
                assert "VLLM_CPU_KVCACHE_SPACE=" in line, (b.path, line)
