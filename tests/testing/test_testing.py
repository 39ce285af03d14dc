"""c2c.testing's RedisServer: the one launcher for tests and benchmarks never leaves a process behind."""

import os
import stat

import pytest

from c2c.testing import RedisServer


def _fake(tmp_path, body: str) -> str:
    """A stand-in redis-server binary that writes its pid to ``pid`` and then runs ``body``."""
    path = tmp_path / "fake-redis-server"
    path.write_text(f"#!/bin/sh\necho $$ > {tmp_path / 'pid'}\n{body}\n")
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return str(path)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_a_server_that_never_comes_up_is_killed_not_left_running(tmp_path):
    pytest.importorskip("redis")
    server = RedisServer(tmp_path / "r", binary=_fake(tmp_path, "exec sleep 60"))  # never listens
    with pytest.raises(RuntimeError, match=r"did not come up .* within 0.5 s"):
        server.start(timeout=0.5)
    pid = int((tmp_path / "pid").read_text())
    assert server.proc is None and not _alive(pid)


def test_a_server_that_exits_at_once_says_so_and_leaves_nothing(tmp_path):
    pytest.importorskip("redis")
    server = RedisServer(tmp_path / "r", binary=_fake(tmp_path, "exit 3"))
    with pytest.raises(RuntimeError, match="exited with 3"):
        server.start(timeout=5)
    assert server.proc is None and not _alive(int((tmp_path / "pid").read_text()))
