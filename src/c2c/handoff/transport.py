"""How artifact bytes travel from sender to receiver: a one-method-each-way interface."""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Protocol

from c2c._io import private_dir, private_tempdir, write_atomic
from c2c.artifact.codec import read_file
from c2c.errors import ConfigError


class Transport(Protocol):
    """Moves artifact bytes from sender to receiver. One method each way."""

    def send(self, key: str, payload: bytes) -> None: ...

    def receive(self, key: str) -> bytes: ...


class SharedTransport:
    """In one process, within one trust domain: the cache itself crosses, no bytes at all.

    :class:`~c2c.handoff.paths.CachePath` hands the sender's tensors to the receiver as
    they are: nothing is encoded, hashed, signed, written or read, because nothing crosses
    a process or a trust boundary. A :class:`~c2c.runtime.kvcache.KVCache` is never written
    in place (every growth makes new tensors), so sharing is copy-on-write by construction.
    The hop is still decided (:func:`c2c.handoff.decide.decide`: domain, fingerprint, prefix,
    hops), checked again at attach (fingerprint and prefix) and recorded (``bytes_moved`` 0).
    A receiver in another domain never gets here: the decision sends text.
    """

    def send(self, key: str, payload: bytes) -> None:
        raise ConfigError("SharedTransport moves no bytes: CachePath shares the cache itself")

    receive = send


class DirectoryTransport:
    """Artifacts as files in a directory, written atomically and privately (0600, see :mod:`c2c._io`).

    With ``root`` the files are durable (fsynced, with their directory) and stay;
    a missing ``root`` is created 0700, an existing one is used as it is.
    Without it they go to a fresh private temporary folder (``mkdtemp``: random
    name, 0700), each is deleted once received (one-shot handoffs leave nothing
    behind), and they are not fsynced: such a file lives for one handoff on one
    machine, its digest is checked when it is read, and after a crash the sender
    still holds the cache it came from. Skipping the fsync takes the handoff's
    most variable step out of it.
    """

    def __init__(self, root: str | Path | None = None):
        self.ephemeral = root is None
        self._root = None if root is None else private_dir(root)
        self._pending = 0

    @property
    def root(self) -> Path:
        if self._root is None:  # ephemeral: made on first use, removed when its last file is received
            self._root = private_tempdir("c2c-handoff-")
        return self._root

    def _path(self, key: str) -> Path:
        if not key or "/" in key or key.startswith("."):
            raise ConfigError(f"transport key {key[:80]!r} must be a plain file name")
        return self.root / f"{key}.c2c"

    def send(self, key: str, payload: bytes) -> None:
        write_atomic(self._path(key), payload, durable=not self.ephemeral)
        self._pending += 1

    def receive(self, key: str) -> bytes:
        path = self._path(key)
        try:
            return read_file(path)
        finally:  # a refused (tampered) file goes too: nothing one-shot is left behind
            if self.ephemeral:
                path.unlink(missing_ok=True)
                self._pending = max(self._pending - 1, 0)
                if not self._pending:
                    with contextlib.suppress(OSError):
                        self._root.rmdir()
                    self._root = None
