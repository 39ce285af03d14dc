"""Files that hold KV or key material are private (0600 / 0700) and created safely (see c2c._io).

The last test drives the export, handoff, store and key commands end to end and
checks every file and folder they wrote.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from c2c._io import private_dir, read_bounded, write_atomic
from c2c.errors import ArtifactTooLargeError, ArtifactWriteError, KeyringError
from c2c.testing.synthetic import synthetic_artifact


def _mode(p: Path) -> int:
    return stat.S_IMODE(os.lstat(p).st_mode)


def test_write_atomic_creates_0600_in_a_shared_dir_without_touching_the_dir(tmp_path):
    shared = tmp_path / "shared"
    shared.mkdir(mode=0o777)
    os.chmod(shared, 0o777)
    n = synthetic_artifact().write(shared / "a.c2c")
    assert n == (shared / "a.c2c").stat().st_size
    assert _mode(shared / "a.c2c") == 0o600
    assert _mode(shared) == 0o777
    assert [p.name for p in shared.iterdir()] == ["a.c2c"]  # no temp file left


def test_a_symlink_planted_at_a_predictable_temp_name_is_never_followed(tmp_path):
    victim = tmp_path / "victim.txt"
    victim.write_text("precious")
    out = tmp_path / "out.c2c"
    # the names the old code used: .NAME.PID.tmp next to the destination
    (tmp_path / f".out.c2c.{os.getpid()}.tmp").symlink_to(victim)
    synthetic_artifact().write(out)
    assert victim.read_text() == "precious"
    assert not out.is_symlink() and _mode(out) == 0o600


def test_a_symlink_at_the_destination_is_replaced_not_followed(tmp_path):
    victim = tmp_path / "victim.txt"
    victim.write_text("precious")
    out = tmp_path / "out.c2c"
    out.symlink_to(victim)
    write_atomic(out, b"payload")
    assert victim.read_text() == "precious"
    assert not out.is_symlink() and out.read_bytes() == b"payload"


def test_write_failures_are_c2c_errors_and_leave_nothing(tmp_path):
    with pytest.raises(ArtifactWriteError, match="nothing was written"):
        write_atomic(tmp_path / "missing-dir" / "x", b"x")
    with pytest.raises(KeyringError):
        write_atomic(tmp_path, b"x", error=KeyringError)  # a directory
    assert list(tmp_path.iterdir()) == []


def test_private_dir_makes_0700_and_leaves_existing_dirs_alone(tmp_path):
    made = private_dir(tmp_path / "a" / "b")
    assert _mode(tmp_path / "a") == 0o700 and _mode(made) == 0o700
    open_dir = tmp_path / "open"
    open_dir.mkdir()
    os.chmod(open_dir, 0o755)
    private_dir(open_dir)
    assert _mode(open_dir) == 0o755


def test_read_bounded_checks_the_size_first(tmp_path):
    p = tmp_path / "big"
    with open(p, "wb") as f:
        f.truncate(1 << 30)
    with pytest.raises(ArtifactTooLargeError):
        read_bounded(p, 1 << 20)
    p.write_bytes(b"abc")
    assert read_bounded(p, 3) == bytearray(b"abc")


def test_ephemeral_handoff_dirs_are_fresh_private_and_never_a_planted_one(tmp_path):
    import tempfile

    from c2c.handoff import DirectoryTransport

    planted = Path(tempfile.gettempdir()) / f"c2c-handoff-{os.getpid()}"  # the old predictable name
    planted.mkdir(exist_ok=True)
    os.chmod(planted, 0o777)
    try:
        t = DirectoryTransport()
        data = synthetic_artifact().encode()
        t.send("k", data)
        root = t.root
        assert root != planted and _mode(root) == 0o700
        assert _mode(root / "k.c2c") == 0o600
        assert list(planted.iterdir()) == []
        assert t.receive("k") == data
        assert not root.exists()  # one-shot: the folder goes with its last file
    finally:
        planted.rmdir()


def test_seal_key_export_does_not_chmod_the_target_dir(tmp_path, capsys, monkeypatch):
    from c2c.cli.main import main

    monkeypatch.setenv("C2C_HOME", str(tmp_path / "home"))
    shared = tmp_path / "shared"
    shared.mkdir()
    os.chmod(shared, 0o755)
    ring = ["--keyring", str(tmp_path / "keys")]
    assert main(["keys", "new", "--domain", "lab", *ring]) == 0
    assert main(["keys", "seal-key", "--domain", "lab", "--export", str(shared / "lab.seal.json"), *ring]) == 0
    assert _mode(shared) == 0o755
    assert _mode(shared / "lab.seal.json") == 0o600


def _leaky(root: Path, skip: tuple[Path, ...] = ()) -> list[str]:
    bad = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = [d for d in dirnames if Path(dirpath) / d not in skip]
        for name in dirnames + filenames:
            p = Path(dirpath) / name
            if not p.is_symlink() and _mode(p) & 0o077:
                bad.append(f"{oct(_mode(p))} {p.relative_to(root)}")
    return bad


def test_everything_export_handoff_store_and_keys_write_is_private(tiny, tmp_path, monkeypatch, capsys):
    """`ls -l` of all that c2c wrote: no file or folder readable by group or others."""
    from c2c.artifact.prefix import SharedPrefix
    from c2c.cli.main import main
    from c2c.handoff import DirectoryTransport, hand_off
    from c2c.team.agent import Agent, Team

    out = tmp_path / "out"   # what c2c creates itself starts here
    monkeypatch.setenv("C2C_HOME", str(out / "home"))
    keys = ["--keyring", str(out / "keys")]
    store = ["--store", f"sqlite:///{out / 'store'}"]
    assert main(["keys", "new", "--domain", "lab", *keys]) == 0
    out.joinpath("files").mkdir(mode=0o700)
    art = out / "files" / "a.c2c"
    assert main(["export", "--model", "tiny-llama", "--prompt", "Hello there", "--out", str(art),
                 "--sign-as", "lab", *keys]) == 0
    assert main(["keys", "seal", str(art), "--domain", "lab", "--out", str(art) + ".sealed", *keys]) == 0
    assert main(["keys", "unseal", str(art) + ".sealed", "--domain", "lab", "--out", str(out / "files" / "b.c2c"),
                 *keys]) == 0
    assert main(["store", "put", str(art), *store]) == 0
    cid = capsys.readouterr().out.strip().splitlines()[-1]
    assert main(["store", "get", cid, "--out", str(out / "files" / "got.c2c"), *store]) == 0
    assert main(["store", "invalidate", cid, "--reason", "test", *store]) == 0
    assert main(["store", "graph", *store, "--png", str(out / "files" / "graph.png")]) in (0, 2)

    rt = tiny("llama")
    team = Team(shared=SharedPrefix.build("A team."))
    a, b = Agent("a", rt, team, role="Analyst."), Agent("b", rt, team)
    a.read("Some evidence to pass on.")
    kept = DirectoryTransport(out / "handoffs")
    assert hand_off(a, b, mode="slice", labels=("evidence",), transport=kept).used == "slice"
    once = DirectoryTransport()
    a2, b2 = Agent("a2", rt, team), Agent("b2", rt, team)
    a2.read("More evidence.")
    assert hand_off(a2, b2, mode="full", transport=once).used == "full"

    written = sorted(p.name for p in out.iterdir())
    assert {"home", "keys", "files", "store", "handoffs"} <= set(written), written
    assert list((out / "handoffs").glob("*.c2c")), "the kept transport should have left its artifact"
    # model weights are public files (the tiny model was built there); everything else is KV or keys
    assert _leaky(out, skip=(out / "home" / "models",)) == []


def test_reads_refuse_fifos_loops_and_bad_names_with_c2c_errors(tmp_path):
    from c2c.artifact.codec import read_file
    from c2c.errors import CorruptArtifactError

    fifo = tmp_path / "fifo.c2c"
    os.mkfifo(fifo)
    loop = tmp_path / "loop.c2c"
    loop.symlink_to(loop)
    (tmp_path / "plain").write_text("x")
    for bad in (fifo, loop, tmp_path / "plain" / "under-a-file.c2c", tmp_path / ("n" * 300), "nul\x00.c2c"):
        with pytest.raises(CorruptArtifactError):  # never blocks on the FIFO, never a raw OSError
            read_file(bad)
        with pytest.raises(CorruptArtifactError):
            read_bounded(bad, 1 << 20)
