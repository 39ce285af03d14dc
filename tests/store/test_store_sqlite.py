"""SQLiteStore specifics: WAL mode, content-addressed blob files, sweeping orphans."""

from __future__ import annotations

import os
import sqlite3
import time

from store_helpers import artifact_bytes

from c2c.store import GCPolicy, collect, open_store


def test_layout_wal_and_content_addressed_blobs(tmp_path):
    store = open_store(f"sqlite:///{tmp_path / 's'}")
    data = artifact_bytes(1)
    c = store.put(data, stream="a")
    blob = tmp_path / "s" / "blobs" / c.blob[:2] / c.blob
    assert blob.read_bytes() == data
    with sqlite3.connect(tmp_path / "s" / "store.sqlite3") as db:
        assert db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    assert list((tmp_path / "s" / "tmp").iterdir()) == []


def test_two_handles_on_one_directory_see_each_other(tmp_path):
    url = f"sqlite:///{tmp_path / 's'}"
    one, two = open_store(url), open_store(url)
    c = one.put(artifact_bytes(1), stream="a")
    assert two.get(c.id).commit == c
    assert two.put(artifact_bytes(2), stream="a").version == 2


def test_sweep_removes_only_old_unreferenced_files(tmp_path):
    store = open_store(f"sqlite:///{tmp_path / 's'}")
    keep = store.put(artifact_bytes(1), stream="a")
    old = time.time() - 7200
    stale_tmp = store.root / "tmp" / "dead-writer"
    young_tmp = store.root / "tmp" / "busy-writer"
    orphan = store.root / "blobs" / "ab" / ("ab" + "0" * 62)
    orphan.parent.mkdir(exist_ok=True)
    for p in (stale_tmp, young_tmp, orphan):
        p.write_bytes(b"partial")
    os.utime(stale_tmp, (old, old))
    os.utime(orphan, (old, old))
    os.utime(store.root / "blobs" / keep.blob[:2] / keep.blob, (old, old))  # old but referenced
    report = collect(store, GCPolicy(orphan_grace_s=3600))
    assert report.orphans_removed == 2 and report.removed == ()
    assert not stale_tmp.exists() and not orphan.exists() and young_tmp.exists()
    assert store.verify() == []
