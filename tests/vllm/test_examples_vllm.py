"""The examples that tests/serve/test_examples.py runs against `c2c serve`, unchanged against a real `vllm serve`
with c2c's connector: only C2C_BASE_URL differs (the model is the one the server serves)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.vllm, pytest.mark.slow, pytest.mark.redis]

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def run(script: str, server) -> str:
    env = {"C2C_BASE_URL": server.base_url, "PATH": "/usr/bin:/bin", "HOME": str(server.home)}
    proc = subprocess.run([sys.executable, str(EXAMPLES / script)], env=env, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc.stdout


def test_openai_client_example(vllm_server):
    out = run("openai_client.py", vllm_server)
    assert out.startswith("reply:") and "analyst published commit" in out
    assert "(stream example-incident-notes v" in out
    assert "handoff took the cache path (full): " in out          # the writer went on from the analyst's K/V
    line = next(x for x in out.splitlines() if x.startswith("commit tokens"))
    tokens = int(line.split()[2].rstrip(":"))
    # prefix caching is off on this server: every token of the commit the prompt holds is imported
    assert tokens > 0 and line == f"commit tokens {tokens}: imported {tokens}, reused 0, prefilled 0", line


@pytest.mark.parametrize("script, needs", [
    ("langgraph_handoff.py", ("langgraph", "langchain_openai")),
    ("agents_sdk_handoff.py", ("agents",)),
])
def test_framework_example_hands_over_the_cache(vllm_server, script, needs):
    for module in needs:
        pytest.importorskip(module)
    lines = dict(line.split(": ", 1) for line in run(script, vllm_server).splitlines() if ": " in line)
    assert len(lines["commit"]) == 64
    assert lines["handoff"] == f"{lines['commit'][:12]}:full"
