"""The allocator tuning: applied once per process, by the CLI only, and skippable."""

import json
import subprocess
import sys

import pytest

CHECK = r"""
from c2c.runtime import alloc
print(alloc.keep_large_buffers(), alloc.keep_large_buffers())
"""

# import c2c, load a model, run a prefill: nothing process-wide may change
NO_SIDE_EFFECTS = r"""
import json, os
before = dict(os.environ)
import c2c
from c2c.runtime import alloc, zoo
rt = zoo.load("tiny-llama")
rt.prefill([1, 2, 3])
import transformers
print(json.dumps({"env_changed": sorted(set(os.environ.items()) ^ set(before.items())),
                  "alloc_applied": alloc._done, "hf_verbosity": transformers.logging.get_verbosity(),
                  "default_verbosity": transformers.logging.WARNING}))
"""


def _python(code: str, env: dict) -> str:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, env=env).stdout


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc only")
def test_keep_large_buffers_applies_once():
    assert _python(CHECK, {"PATH": "/usr/bin:/bin"}).split() == ["True", "True"]


# the same work with plain transformers: what torch and transformers change themselves
CONTROL = r"""
import json, os, sys
before = dict(os.environ)
import torch, transformers
tok = transformers.AutoTokenizer.from_pretrained(sys.argv[1], local_files_only=True)
model = transformers.AutoModelForCausalLM.from_pretrained(sys.argv[1], local_files_only=True)
model(torch.tensor([[1, 2, 3]]))
print(json.dumps(sorted(set(os.environ.items()) ^ set(before.items()))))
"""


def test_import_and_runtime_leave_environ_and_allocator_alone(tmp_path):
    import os

    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "C2C_HOME": str(tmp_path / "home"),
           "HOME": str(tmp_path), **{k: v for k, v in os.environ.items() if k == "PYTHONPATH"}}
    out = json.loads(_python(NO_SIDE_EFFECTS, env).strip().splitlines()[-1])
    model_dir = tmp_path / "home" / "models" / "tiny-llama"
    control = subprocess.run([sys.executable, "-c", CONTROL, str(model_dir)], capture_output=True, text=True,
                             check=True, env=env).stdout.strip().splitlines()[-1]
    theirs = {tuple(x) for x in json.loads(control)}
    ours = {tuple(x) for x in out["env_changed"]} - theirs
    assert ours == set(), f"c2c changed the environment: {sorted(ours)}"
    assert out["alloc_applied"] is None  # never called
    assert out["hf_verbosity"] == out["default_verbosity"]


def test_the_cli_tunes_malloc_unless_told_not_to(tmp_path):
    import os

    code = ("import sys; from c2c.cli.main import main; from c2c.runtime import alloc; "
            "main(['models', 'list', '--json']); print('ALLOC', alloc._done, file=sys.stderr)")
    for tune, want in (("1", "True"), ("0", "None")):
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "C2C_HOME": str(tmp_path / "home"),
               "C2C_MALLOC_TUNE": tune, **{k: v for k, v in os.environ.items() if k == "PYTHONPATH"}}
        proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True)
        assert f"ALLOC {want}" in proc.stderr, proc.stderr
