"""Keep large buffers in the heap, so that moving a cache does not fault in fresh pages each time.

glibc serves every allocation above ``M_MMAP_THRESHOLD`` (at most 32 MB by default)
with a fresh ``mmap``: each of a handoff's buffers (the artifact bytes, the
tensors decoded from them) is then zero-filled page by page, and a 48 MB
handoff took 2.2x the time of a 24 MB one on the 2-core CPU of this project.
Raising the threshold, and the trim threshold with it, lets freed buffers be
reused: the same handoffs became linear in their size and up to 2x faster
(``benchmarks/results/handoff.md``).

:func:`keep_large_buffers` changes the whole process, so the library never calls
it on its own: the ``c2c`` command does at its entry point (unless
``C2C_MALLOC_TUNE=0``), and so do the benchmarks; a program that imports c2c
opts in by calling it. It only exists on glibc (the cost: up to ``limit`` bytes
of freed memory stay with the process instead of going back to the OS).
"""

from __future__ import annotations

import ctypes
import ctypes.util

M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3
_done: bool | None = None


def keep_large_buffers(limit: int = 512 << 20) -> bool:
    """Serve allocations up to ``limit`` bytes from the heap. True when applied (now or before)."""
    global _done
    if _done is not None:
        return _done
    _done = False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):  # not glibc (macOS, musl): nothing to tune
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    _done = bool(mallopt(M_MMAP_THRESHOLD, limit)) and bool(mallopt(M_TRIM_THRESHOLD, limit))
    return _done
