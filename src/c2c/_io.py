"""The one way c2c writes and reads files that hold KV-caches or key material.

Policy (stated in the README):

- **Private by default.** Every file is created mode 0600 and every directory
  c2c creates is 0700. A directory that already exists is never ``chmod``-ed:
  it may be a shared folder the user pointed us at.
- **Created safely.** A write goes to a temporary file made by
  :func:`tempfile.mkstemp` in the destination directory (``O_CREAT|O_EXCL``, a
  random name, so a planted file or symlink is never opened), is fsynced, and
  is renamed over the destination. ``rename`` replaces a symlink at the
  destination instead of following it. Readers see all of the file or none.
- **Bounded reads.** :func:`read_bounded` checks the size before reading and
  never allocates more than the file holds.

Only errors are translated here: the caller passes the :class:`~c2c.errors.C2CError`
subclass that names its domain (an artifact write, a key file, a store blob).
"""

from __future__ import annotations

import contextlib
import os
import stat
import tempfile
from pathlib import Path
from typing import Callable

from c2c.errors import ArtifactTooLargeError, ArtifactWriteError, C2CError, CorruptArtifactError

FILE_MODE = 0o600
DIR_MODE = 0o700


def private_dir(path: str | Path, *, error: Callable[[str], C2CError] = ArtifactWriteError) -> Path:
    """Create ``path`` (and missing parents) mode 0700; an existing directory is left as it is.

    Raises:
        ``error``: the directory cannot be made (permission denied, disk full, a file in the way).
    """
    path = Path(path)
    try:
        _make_private_dirs(path)
    except OSError as e:
        raise error(f"cannot create the directory {path}: {e.strerror or e}") from e
    return path


def _make_private_dirs(path: Path) -> None:
    if not path.is_dir():
        # mkdir(mode=) applies to every directory it creates; parents get 0700 too.
        missing = []
        p = path
        while not p.exists() and p != p.parent:
            missing.append(p)
            p = p.parent
        for d in reversed(missing):
            with contextlib.suppress(FileExistsError):
                os.mkdir(d, DIR_MODE)


def private_tempdir(prefix: str = "c2c-") -> Path:
    """A fresh directory with a random name under the system temp folder, mode 0700 (``mkdtemp``)."""
    return Path(tempfile.mkdtemp(prefix=prefix))


def write_atomic(path: str | Path, payload: bytes | bytearray | memoryview, *, durable: bool = True,
                 error: type[C2CError] = ArtifactWriteError) -> int:
    """Write ``payload`` to ``path`` (mode 0600) so that readers see all of it or nothing.

    ``durable`` also fsyncs the file and its directory, so that it survives a power
    loss; only throwaway files (a one-shot handoff inside one machine) skip it.

    Returns:
        the number of bytes written.

    Raises:
        ``error`` (default :class:`ArtifactWriteError`): disk full, permission
            denied, no such directory; no partial file is left behind.
    """
    path = Path(path)
    tmp = None
    try:
        if path.is_dir():
            raise IsADirectoryError(21, "is a directory")
        fd, name = tempfile.mkstemp(prefix=f".{path.name[:64]}.", suffix=".tmp", dir=path.parent)
        tmp = Path(name)
        with os.fdopen(fd, "wb") as f:
            f.write(payload)
            f.flush()
            if durable:
                os.fsync(f.fileno())
        os.replace(tmp, path)
        tmp = None
        if durable:
            fsync_dir(path.parent)
    except OSError as e:
        if tmp is not None:
            with contextlib.suppress(OSError):
                tmp.unlink()
        raise error(f"could not write {path}: {e.strerror or e}; nothing was written") from e
    return len(payload)


def create_private(path: str | Path) -> int:
    """Open a new file at ``path`` for writing, mode 0600, refusing an existing file or symlink.

    Returns the file descriptor (the caller closes it). Raises ``OSError``.
    """
    return os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), FILE_MODE)


_IOV_MAX = min(1024, os.sysconf("SC_IOV_MAX")) if hasattr(os, "sysconf") else 1024


def writev_all(fd: int, buffers: list) -> int:
    """Write ``buffers`` (bytes-like, in order) with as few ``writev`` calls as the kernel allows.

    A cache chunk lies in many runs of an artifact (one per layer and head); this writes them
    without joining them first. Returns the bytes written; raises ``OSError``.
    """
    views = [memoryview(b).cast("B") for b in buffers if len(b)]
    total = 0
    while views:
        n = os.writev(fd, views[:_IOV_MAX])
        total += n
        advance(views, n)
    return total


def readv_all(fd: int, buffers: list) -> int:
    """Fill ``buffers`` (writable, in order) from ``fd`` with ``readv``; returns the bytes read,
    fewer than asked only at the end of the file."""
    views = [memoryview(b).cast("B") for b in buffers if len(b)]
    total = 0
    while views:
        n = os.readv(fd, views[:_IOV_MAX])
        if n == 0:
            break
        total += n
        advance(views, n)
    return total


def advance(views: list[memoryview], n: int) -> None:
    """Drop the first ``n`` bytes of the byte views ``views`` (in place), after a scatter/gather call moved them."""
    while views and n >= len(views[0]):
        n -= len(views[0])
        views.pop(0)
    if n:
        views[0] = views[0][n:]


def fsync_dir(path: str | Path) -> None:
    """fsync a directory so that a rename in it is durable (best effort where unsupported)."""
    with contextlib.suppress(OSError):
        dfd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)


@contextlib.contextmanager
def open_for_read(path: str | Path, what: str = "file"):
    """``open(path, "rb")`` whose failures (missing, a directory, unreadable) are c2c errors naming ``what``.

    Raises:
        CorruptArtifactError: naming the path and what is wrong with it.
    """
    path = Path(path)
    try:
        # O_NONBLOCK: a FIFO planted at the path must not block the open; only regular files are read
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    except FileNotFoundError:
        raise CorruptArtifactError(f"no {what} at {path}") from None
    except IsADirectoryError:
        raise CorruptArtifactError(f"{path} is a directory, not a {what}") from None
    except (OSError, ValueError) as e:  # permission, a symlink loop, a name too long, a NUL in the path...
        raise CorruptArtifactError(f"cannot read {path}: {getattr(e, 'strerror', None) or e}") from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise CorruptArtifactError(f"{path} is not a regular file, not a {what}")
    if hasattr(os, "set_blocking"):
        os.set_blocking(fd, True)
    try:
        with os.fdopen(fd, "rb") as f:
            yield f
    except OSError as e:  # an I/O error while reading
        raise CorruptArtifactError(f"cannot read {path}: {e.strerror or e}") from None


def read_bounded(path: str | Path, max_bytes: int) -> bytearray:
    """Read a whole file of at most ``max_bytes`` into a fresh ``bytearray``.

    The size is checked before any byte is read, and the buffer is exactly the
    file's size (a file that grows while being read is refused).

    Raises:
        ArtifactTooLargeError: the file is, or grew, larger than ``max_bytes``.
        CorruptArtifactError: no such file, a directory, or unreadable.
    """
    with open_for_read(path) as f:
        size = os.fstat(f.fileno()).st_size
        if size > max_bytes:
            raise ArtifactTooLargeError(f"{path} is {size} bytes, over the limit of {max_bytes}")
        buf = bytearray(size)
        got = f.readinto(buf)
        if got != size or f.read(1):
            raise ArtifactTooLargeError(f"{path} changed size while being read; refusing it")
        return buf


def read_private(path: str | Path, max_bytes: int, *, error: Callable[[str], C2CError], what: str = "file") -> bytes:
    """Read a secret file (a key, a tokens file) that must be private to its owner and small.

    Raises:
        ``error``: missing, unreadable, readable by group or others (on POSIX), or over ``max_bytes``.
    """
    path = Path(path).expanduser()
    try:
        st = path.stat()
        if os.name == "posix" and st.st_mode & (stat.S_IRWXG | stat.S_IRWXO):
            raise error(f"{path} is readable by others (mode {stat.S_IMODE(st.st_mode):o}); run `chmod 600 {path}`")
        if st.st_size > max_bytes:
            raise error(f"{path} is {st.st_size} bytes; a {what} is at most {max_bytes}")
        return path.read_bytes()
    except FileNotFoundError:
        raise error(f"no {what} at {path}") from None
    except OSError as e:
        raise error(f"cannot read the {what} {path}: {e.strerror or e}") from None
