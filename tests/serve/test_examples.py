"""The examples run against a real server."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from serve_helpers import TOKENS

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def test_openai_client_example(tiny_server):
    """Run as a user runs it: only the base URL (and a token) set; the model is the one the server serves. The same
    script against vLLM: tests/vllm/test_examples_vllm.py."""
    env = {"C2C_BASE_URL": tiny_server.base_url, "C2C_API_KEY": TOKENS["analyst"][0], "PATH": "/usr/bin:/bin"}
    for run in range(2):  # a rerun publishes a new version and imports its commit
        proc = subprocess.run([sys.executable, str(EXAMPLES / "openai_client.py")], env=env, capture_output=True,
                              text=True, timeout=120)
        assert proc.returncode == 0, proc.stderr[-2000:]
        out = proc.stdout
        assert out.startswith("reply:") and "analyst published commit" in out
        assert f"(stream example-incident-notes v{run + 1})" in out  # its own stream, a version per run
        assert "handoff took the cache path (full): same model, same shared prefix, same trust domain" in out
        line = next(x for x in out.splitlines() if x.startswith("commit tokens"))
        tokens = int(line.split()[2].rstrip(":"))
        assert line == f"commit tokens {tokens}: imported {tokens}, reused 0, prefilled 0", line


@pytest.mark.parametrize("script, needs", [
    ("langgraph_handoff.py", ("langgraph", "langchain_openai")),   # an analyst node and a writer node
    ("agents_sdk_handoff.py", ("agents",)),                        # two OpenAI Agents SDK agents
])
def test_framework_example_hands_over_the_cache(tiny_server, script, needs):
    for module in needs:
        pytest.importorskip(module)
    env = {"C2C_BASE_URL": tiny_server.base_url, "C2C_API_KEY": TOKENS["writer"][0], "PATH": "/usr/bin:/bin",
           "HOME": str(tiny_server.home)}
    proc = subprocess.run([sys.executable, str(EXAMPLES / script)], env=env, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    lines = dict(line.split(": ", 1) for line in proc.stdout.splitlines() if ": " in line)
    assert len(lines["commit"]) == 64
    assert lines["handoff"] == f"{lines['commit'][:12]}:full"   # the writer went on from the analyst's cache


@pytest.fixture(scope="module")
def roomy_server(tmp_path_factory):
    """tiny-qwen2 with room for a session of ~400 byte-level tokens (the shared tiny_server keeps 0.25 MB per
    tenant: 1 KiB of K/V per token, so the agent examples' sessions would be evicted, and rebuilt)."""
    from serve_helpers import ServeProcess, make_home, write_tokens

    root = tmp_path_factory.mktemp("serve-roomy")
    server = ServeProcess(make_home(root), "--model", "tiny-qwen2", "--tokens", str(write_tokens(root / "t.json")),
                          "--session-budget-mb", "16").start()
    yield server
    server.stop()


@pytest.mark.zoo
def test_agent_context_example_calls_its_tool_and_drops_old_results_from_the_cache(qwen_server):
    """A real tool loop on the default model: each step's reply is a read_log call, its result goes back with the
    call's id, and from the fourth result on the oldest leave the session's cache."""
    env = {"C2C_BASE_URL": qwen_server.base_url, "C2C_API_KEY": TOKENS["analyst"][0],
           "C2C_MODEL": "Qwen2.5-Coder-0.5B-Instruct", "PATH": "/usr/bin:/bin"}
    proc = subprocess.run([sys.executable, str(EXAMPLES / "agent_context.py")], env=env, capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    steps = [line for line in proc.stdout.splitlines() if line.startswith("step ")]
    assert len(steps) == 6 and all("read_log({'service': " in s for s in steps), steps
    assert all("(messages [])" in s and "exact True" in s for s in steps[:4])
    for s, newly in zip(steps[4:], ("[3]", "[5]")):   # the message index of the oldest tool result kept, dropped
        assert f"(messages {newly})" in s and "exact False" in s and "dropped 0 tokens" not in s, s
    cached = [int(s.split("cached ")[1].split(",")[0]) for s in steps]
    assert all(c > 0 for c in cached[1:])   # every later step continues from the session's (edited) cache
    assert "dropped: [3, 5, 7]" in proc.stdout and "answer:" in proc.stdout


def test_agent_context_langgraph_example_drops_through_the_graph(roomy_server):
    tiny_server = roomy_server
    for module in ("langgraph", "langchain_openai"):
        pytest.importorskip(module)
    env = {"C2C_BASE_URL": tiny_server.base_url, "C2C_API_KEY": TOKENS["writer"][0], "C2C_MODEL": "tiny-qwen2",
           "PATH": "/usr/bin:/bin", "HOME": str(tiny_server.home)}
    proc = subprocess.run([sys.executable, str(EXAMPLES / "agent_context_langgraph.py")], env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    steps = [line for line in proc.stdout.splitlines() if line.startswith("step ")]
    assert steps[0] == "step 1: dropped [], edit -, cached 0" and steps[-1].startswith("step 6: dropped [2, 4, 6]")
    assert "exact=false" in steps[3] and "dropped=0," not in steps[3]   # step 4 drops the first tool result
    cached = [int(s.rsplit(" ", 1)[1]) for s in steps]
    assert all(c > 0 for c in cached[1:])       # every later step continues from the session's (edited) cache
    assert "messages kept in the graph: 13" in proc.stdout and "dropped: [2, 4, 6]" in proc.stdout


@pytest.mark.zoo
def test_two_tool_using_agents_in_langgraph_hand_over_the_cache(qwen_server):
    """The analyst's conversation holds its tool calls and their results; the writer, with the same catalogue,
    goes on from its K/V (the continuation shape)."""
    for module in ("langgraph", "langchain_openai"):
        pytest.importorskip(module)
    env = {"C2C_BASE_URL": qwen_server.base_url, "C2C_API_KEY": TOKENS["writer"][0], "PATH": "/usr/bin:/bin",
           "HOME": str(qwen_server.home)}
    proc = subprocess.run([sys.executable, str(EXAMPLES / "langgraph_tools_handoff.py")], env=env,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    lines = dict(line.split(": ", 1) for line in proc.stdout.splitlines() if ": " in line)
    assert lines["calls"] == "api-1, db-2"                       # each forced call read the service asked for
    assert lines["handoff"] == f"{lines['commit'][:12]}:full"   # the writer went on from the analyst's cache
