"""No command prints a Python traceback for any input of the hostile corpus, on either store backend."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from c2c.cli.main import main
from c2c.testing import RedisServer, hostile

COMMANDS = (
    ("inspect", lambda f, ring, store: ["inspect", f]),
    ("verify", lambda f, ring, store: ["verify", f, "--domain", hostile.DOMAIN, "--keyring", ring]),
    ("verify-sample", lambda f, ring, store: ["verify", f, "--mode", "sample", "--model", "tiny-llama",
                                              "--domain", hostile.DOMAIN, "--keyring", ring]),
    ("store put", lambda f, ring, store: ["store", "put", f, "--store", store]),
    ("continue", lambda f, ring, store: ["continue", f, "--model", "tiny-llama", "--prompt", "Go on.",
                                         "--max-new-tokens", "2"]),
)


@pytest.fixture(scope="module")
def corpus_files(tmp_path_factory):
    root = tmp_path_factory.mktemp("hostile-cli")
    ring, key, other, revoked = hostile.keys_for_corpus(root / "keys")
    files = []
    for i, (name, data, _err, stage) in enumerate(hostile.corpus(key, other, revoked)):
        if stage == "decode-small":
            continue
        p = root / f"{i:03d}.c2c"
        p.write_bytes(data)
        files.append((name, str(p), stage))
    return str(root / "keys"), files


@pytest.mark.parametrize("backend", ["sqlite", pytest.param("redis", marks=pytest.mark.redis)])
def test_no_command_crashes_on_the_corpus(corpus_files, backend, tmp_path, capsys, request):
    ring, files = corpus_files
    if backend == "redis":
        if shutil.which("redis-server") is None and not os.environ.get("CI"):
            pytest.skip("redis-server is not on PATH")
        server = RedisServer(tmp_path / "redis").start()
        request.addfinalizer(server.stop)
        store = f"redis://127.0.0.1:{server.port}/0?domain=hostile"
    else:
        store = f"sqlite:///{tmp_path / 'store'}"
    crashes, codes = [], {}
    stages = {name: stage for name, _, stage in files}
    for name, path, _ in files:
        for cmd, argv in COMMANDS:
            if backend == "redis" and cmd != "store put":
                continue
            try:
                rc = main(argv(path, ring, store))
            except SystemExit as e:  # argparse
                rc = e.code
            except Exception as e:  # noqa: BLE001 - what this test looks for
                crashes.append(f"{cmd} on {name!r}: {type(e).__name__}: {e}")
                continue
            codes[(cmd, name)] = rc
            err = capsys.readouterr().err
            if "Traceback" in err:
                crashes.append(f"{cmd} on {name!r} printed a traceback")
    assert not crashes, crashes
    # malformed inputs are refused by every command: 2 (a c2c error) or 1 (verify's "no");
    # well-formed ones with a bad signature are refused by verify (the store keeps any valid artifact)
    wrong = {k: rc for k, rc in codes.items()
             if (stages[k[1]] == "decode" or k[0].startswith("verify")) and stages[k[1]] != "valid"
             and rc not in (1, 2)}
    assert not wrong, wrong
    assert len(codes) >= 60


def test_the_real_cli_prints_one_line_not_a_traceback(corpus_files, tmp_path):
    """A few corpus entries through the installed `c2c` entry point, in a subprocess."""
    ring, files = corpus_files
    picked = [f[:2] for f in files if f[0] in ("prefix block_size 0 (tokens withheld)", "lone surrogate in metadata",
                                           "deeply nested JSON", "header length 2**63")]
    assert len(picked) == 4
    exe = Path(sys.executable).with_name("c2c")
    for name, path in picked:
        proc = subprocess.run([str(exe), "inspect", path], capture_output=True, text=True, timeout=120,
                              env=dict(os.environ, C2C_HOME=str(tmp_path / "home")))
        assert proc.returncode == 2, (name, proc.stderr)
        assert "Traceback" not in proc.stderr and proc.stderr.startswith("c2c: "), (name, proc.stderr)
        assert len(proc.stderr.strip().splitlines()) == 1, (name, proc.stderr)
