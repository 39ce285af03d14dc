"""The chunk files of a SQLite store: ``chunks/<domain>/ab/<digest>``, written through ``tmp/``.

A chunk's bytes lie in many runs of an artifact (one per layer, K/V and head): they are
written with one ``writev`` and read with one ``readv`` each, straight from and into the
artifact's buffer, several chunks at once (the disk overlaps their flushes), each fsynced
before it is renamed to its content address. Which files may be deleted, and when, is the
store's business (:mod:`c2c.store.sqlite`): it decides under its write lock.
"""

from __future__ import annotations

import os
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Sequence

from c2c import _io
from c2c.errors import ChunkCorruptError, ChunkMissingError, StoreError, StoreWriteError

WRITERS = 4            # chunk files written (and fsynced) at once: the disk overlaps their flushes
READERS = 2            # chunk files read and hashed at once


class ChunkFiles:
    """The chunk files under ``root``."""

    def __init__(self, root: Path):
        self.root = root

    def path(self, domain: str, digest: str) -> Path:
        return self.root / "chunks" / domain / digest[:2] / digest

    def stage(self, view: memoryview, manifest, which: Sequence[int]) -> dict[int, Path]:
        """Write chunks ``which`` to fresh temp files, several at once, each fsynced (ingest threads)."""
        """Write chunks ``which`` to fresh temp files, several at once, each fsynced (ingest threads)."""

        def write(i: int) -> tuple[int, Path]:
            tmp = self.root / "tmp" / uuid.uuid4().hex
            try:
                fd = _io.create_private(tmp)  # 0600; renamed into chunks/ as it is
                try:
                    _io.writev_all(fd, manifest.chunks[i].views(view))
                    os.fsync(fd)
                finally:
                    os.close(fd)
            except OSError as e:
                unlink_count(tmp)
                raise StoreWriteError(f"cannot write a chunk under {self.root}: {e.strerror or e}; "
                                      "nothing was written") from e
            return i, tmp

        staged: dict[int, Path] = {}
        failure = None
        with ThreadPoolExecutor(max_workers=WRITERS, thread_name_prefix="c2c-chunk-write") as pool:
            for f in [pool.submit(write, i) for i in which]:
                try:
                    i, tmp = f.result()
                    staged[i] = tmp
                except BaseException as e:  # noqa: BLE001 - the first is raised once every writer is done
                    failure = failure or e
        if failure is not None:
            self.discard(staged)
            raise failure
        return staged

    @staticmethod
    def discard(staged: dict[int, Path]) -> None:
        for tmp in staged.values():
            unlink_count(tmp)

    def read(self, domain: str, manifest, indices: list[int], out: memoryview, commit_id: str) -> int:
        """Read chunks ``indices`` of ``manifest`` into their runs of ``out``, each checked; the bytes read."""
        def read(i: int) -> int:
            ref = manifest.chunks[i]
            path = self.path(domain, ref.digest)
            views = ref.views(out)
            try:
                fd = os.open(path, os.O_RDONLY)
            except FileNotFoundError:
                raise ChunkMissingError(f"chunk {i} of commit {commit_id[:12]} is missing ({path}); run "
                                        "`c2c store verify`") from None
            except OSError as e:
                raise StoreError(f"cannot read {path}: {e.strerror or e}") from e
            try:
                n = _io.readv_all(fd, views)
                longer = bool(os.read(fd, 1))
            except OSError as e:
                raise StoreError(f"cannot read {path}: {e.strerror or e}") from e
            finally:
                os.close(fd)
            if n != ref.size or longer:
                raise ChunkCorruptError(f"chunk {i} of commit {commit_id[:12]} is {'longer than' if longer else n} "
                                        f"of {ref.size} bytes ({path}): tampered; run `c2c store verify`")
            ref.verify(views, commit=commit_id, index=i)
            return n

        if len(indices) <= 1:
            return sum(read(i) for i in indices)
        with ThreadPoolExecutor(max_workers=READERS, thread_name_prefix="c2c-chunk-read") as pool:
            return sum(pool.map(read, indices))


def unlink_count(path: Path) -> int:
    """Remove ``path``: 1 if it went, 0 if it was not there (or could not go)."""
    try:
        os.unlink(path)
        return 1
    except OSError:
        return 0
