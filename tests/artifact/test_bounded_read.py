"""Rejecting a huge file with a bad header costs O(header) memory, on every path that reads one.

Each case runs in a fresh interpreter, which reports its peak RSS (``ru_maxrss``)
before and after the rejections, like ``/usr/bin/time -v`` would. The files are
sparse, so making them costs no disk.
"""

from __future__ import annotations

import json
import os
import struct
import subprocess
import sys
from pathlib import Path

import pytest

from c2c.testing.synthetic import synthetic_artifact

GB = 1 << 30

_CHILD = r"""
import json, resource, sys, io, contextlib
from c2c.artifact.codec import Artifact
from c2c.cli.main import main
from c2c.errors import C2CError

def peak_mb():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024

files, store = json.loads(sys.argv[1]), sys.argv[2]
# warm up every code path on a small bad file, so that imports and caches are in the baseline
warm = files.pop("warm")
for argv in (["inspect", warm], ["store", "put", warm, "--store", store], ["verify", warm, "--unsigned-ok"]):
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        main(argv)
before = peak_mb()
out = {}
for name, path in files.items():
    try:
        Artifact.read(path)
        out[name] = "accepted"
    except C2CError as e:
        out[name] = type(e).__name__
    codes = []
    for argv in (["inspect", path], ["store", "put", path, "--store", store], ["verify", path, "--unsigned-ok"]):
        err = io.StringIO()
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):
            codes.append(main(argv))
        assert "Traceback" not in err.getvalue(), err.getvalue()
    out[name + ":cli"] = codes
print(json.dumps({"before_mb": before, "after_mb": peak_mb(), "results": out}))
"""


def _sparse(path: Path, head: bytes, size: int = GB) -> str:
    with open(path, "wb") as f:
        f.write(head)
        f.truncate(size)
    return str(path)


@pytest.mark.slow
def test_rejecting_a_1gb_file_with_a_garbage_header_costs_under_50mb(tmp_path):
    good = synthetic_artifact().encode()
    (n,) = struct.unpack("<Q", good[:8])
    files = {
        "warm": _sparse(tmp_path / "warm.c2c", b"", 4096),
        "zeros": _sparse(tmp_path / "zeros.c2c", b""),                                 # header length 0
        "random length": _sparse(tmp_path / "random.c2c", os.urandom(8)),            # header length ~2**63
        "12 MB of junk JSON": _sparse(tmp_path / "junk.c2c", struct.pack("<Q", 12 << 20) + b'{"a":' * 1000),
        "valid header, lying size": _sparse(tmp_path / "lying.c2c", good[: 8 + n]),  # data section is 1 GB
    }
    store = f"sqlite:///{tmp_path / 'store'}"
    env = dict(os.environ, OMP_NUM_THREADS="1")
    proc = subprocess.run([sys.executable, "-c", _CHILD, json.dumps(files), store], capture_output=True,
                          text=True, timeout=300, env=env, cwd=Path(__file__).resolve().parents[2])
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    res = report["results"]
    assert res["zeros"] == "CorruptArtifactError"
    assert res["random length"] == "ArtifactTooLargeError"
    assert res["12 MB of junk JSON"] == "CorruptArtifactError"
    assert res["valid header, lying size"] == "CorruptArtifactError"
    for name in ("zeros", "random length", "12 MB of junk JSON", "valid header, lying size"):
        # inspect and store put: a c2c error (2); verify: refused (1). Never a crash (1 from a traceback).
        assert res[name + ":cli"] == [2, 2, 1], (name, res[name + ":cli"])
    extra = report["after_mb"] - report["before_mb"]
    print(f"peak RSS before {report['before_mb']:.0f} MB, after {report['after_mb']:.0f} MB")
    assert extra < 50, f"rejecting 1 GB files raised peak RSS by {extra:.0f} MB: {json.dumps(report)}"
