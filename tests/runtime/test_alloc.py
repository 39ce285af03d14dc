"""The allocator tuning: applied once per process, and skippable."""

import subprocess
import sys

import pytest

CHECK = r"""
from c2c.runtime import alloc
print(alloc.keep_large_buffers(), alloc.keep_large_buffers())
"""


def _run(env_tune: str) -> tuple[str, str]:
    out = subprocess.run([sys.executable, "-c", CHECK], capture_output=True, text=True, check=True,
                         env={"C2C_MALLOC_TUNE": env_tune, "PATH": "/usr/bin:/bin"}).stdout.split()
    return out[0], out[1]


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc only")
def test_keep_large_buffers_applies_once_and_can_be_disabled():
    applied, again = _run("1")
    assert (applied, again) == ("True", "True")
    applied, again = _run("0")
    assert (applied, again) == ("False", "False")


def test_a_runtime_applies_it(tiny):
    from c2c.runtime import alloc

    tiny("qwen2")
    assert alloc._done is not None  # decided once the first Runtime exists
