"""The arena: a sealed ``memfd`` that the sending side owns, and how a cache lies in it.

A sender makes its arena once (and a bigger one when a cache outgrows it), maps it writable
*before* sealing it against shrinking, growing and new writers, and hands the descriptor to its
peer, which maps it read-only after checking those seals: so reading it can never fault, and
only the two processes ever map it.

Arena bytes (:class:`Layout`): the tensors in artifact order (``k.000, v.000, k.001, ...``), back
to back, each ``[1, kv_heads, T_layer, head_dim]``, then the token ids as ``uint32`` little-endian
(what :func:`c2c.canon.token_digest` hashes), 8-byte aligned. Every shape comes from the
receiver's own fingerprint (:func:`c2c.artifact.codec.cache_layout`), never from the sender.
"""

from __future__ import annotations

import fcntl
import mmap
import os
from dataclasses import dataclass

import numpy as np
import torch

from c2c.artifact.codec import cache_layout, max_artifact_bytes
from c2c.artifact.fingerprint import Fingerprint
from c2c.canon import sha256_hex
from c2c.config import DTYPES
from c2c.errors import ArtifactTooLargeError, ChannelError, RuntimeUnsupportedError
from c2c.runtime.kvcache import KVCache

# no shrinking (a read past the end faults), no growing, and no new writer (F_SEAL_FUTURE_WRITE: write(),
# new writable maps and hole punching are refused; the sender's own map, made first, keeps writing)
_F_SEAL_FUTURE_WRITE = getattr(fcntl, "F_SEAL_FUTURE_WRITE", 0x0010)
REQUIRED_SEALS = getattr(fcntl, "F_SEAL_SHRINK", 0x2) | getattr(fcntl, "F_SEAL_GROW", 0x4) | _F_SEAL_FUTURE_WRITE


@dataclass(frozen=True)
class Layout:
    """Where each tensor of a ``seq_len``-token cache of ``fp``'s model lies in an arena."""

    names: list[str]
    shapes: list[list[int]]            # [1, kv_heads, T_layer, head_dim] per tensor
    spans: list[tuple[int, int]]       # byte range of each tensor in the arena
    windows: tuple[int | None, ...]
    dtype: torch.dtype
    tokens_at: int                     # where the uint32 token ids start
    size: int                          # bytes in all

    @classmethod
    def of(cls, fp: Fingerprint, seq_len: int) -> "Layout":
        dtype = getattr(torch, fp.dtype) if fp.dtype in DTYPES and fp.dtype != "auto" else None
        if dtype is None:
            raise RuntimeUnsupportedError(f"the shared-memory channel carries float32/bfloat16/float16 "
                                          f"caches, not {fp.dtype!r}")
        names, shapes, windows = cache_layout(fp, seq_len)
        item = torch.empty(0, dtype=dtype).element_size()
        spans, at = [], 0
        for s in shapes:
            n = s[1] * s[2] * s[3] * item
            spans.append((at, at + n))
            at += n
        at += -at % 8  # the token ids start 8-byte aligned
        return cls(names, shapes, spans, windows, dtype, at, at + 4 * seq_len)

    def write(self, arena: np.ndarray, cache: KVCache) -> str:
        """Copy ``cache``'s tensors and token ids into ``arena`` (uint8); returns the ids' sha256."""
        # NOTE: numpy copies (one thread, plain memcpy): torch's copy wakes its thread pool, whose
        # spinning threads then compete with the peer process for the cores (2.6 ms against 0.3 ms).
        for (a, b), t in zip(self.spans, ordered(cache)):
            np.copyto(arena[a:b], as_bytes(t))
        ids = np.asarray(cache.token_ids, dtype="<u4")
        arena[self.tokens_at:self.size] = ids.view(np.uint8)
        return sha256_hex(ids.tobytes())

    def copy_out(self, arena: np.ndarray) -> np.ndarray:
        """The one copy: this layout's bytes out of the peer's ``arena``, into memory of our own."""
        try:
            own = np.empty(self.size, dtype=np.uint8)
        except MemoryError:
            raise ArtifactTooLargeError(f"no memory for a {self.size}-byte cache") from None
        np.copyto(own, arena[:self.size])
        return own

    def token_ids(self, own: np.ndarray) -> np.ndarray:
        """``(T,)`` uint32 token ids of a copied-out arena."""
        return own[self.tokens_at:self.size].view("<u4")

    def cache(self, own: np.ndarray, start: int) -> KVCache:
        """The cache in a copied-out arena (its tensors are views of ``own``), at positions ``start...``."""
        flat = torch.from_numpy(own)
        tensors = [flat[a:b].view(self.dtype).view(s) for (a, b), s in zip(self.spans, self.shapes)]
        return KVCache(keys=tuple(tensors[0::2]), values=tuple(tensors[1::2]),
                       token_ids=tuple(self.token_ids(own).tolist()), start=start, windows=self.windows)


def capacity(size: int) -> int:
    """Bytes of a new arena for a ``size``-byte cache: room to grow, in MiB steps, within the limit.

    Raises:
        ArtifactTooLargeError: ``size`` is over ``C2C_MAX_ARTIFACT_BYTES``.
    """
    limit = max_artifact_bytes()
    if size > limit:
        raise ArtifactTooLargeError(f"the cache needs {size} bytes, over the limit of {limit} "
                                    "(C2C_MAX_ARTIFACT_BYTES)")
    return max(size, min(limit, max(1 << 20, -(-int(size * 1.25) // (1 << 20)) * (1 << 20))))


def create(size: int) -> tuple[int, mmap.mmap]:
    """A new sealed arena of ``size`` bytes: its descriptor (the caller sends it, then closes it) and our
    writable map of it (made before the seals, so it stays the only writable one)."""
    fd = os.memfd_create("c2c-shm-arena", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
    m = None
    try:
        os.ftruncate(fd, size)
        m = mmap.mmap(fd, size)  # before F_SEAL_FUTURE_WRITE: this mapping stays writable, no later one
        fcntl.fcntl(fd, fcntl.F_ADD_SEALS, REQUIRED_SEALS)
    except OSError as e:
        if m is not None:
            m.close()
        os.close(fd)
        raise ChannelError(f"cannot make a {size}-byte shared-memory arena: {e.strerror}") from None
    return fd, m


def open_peer(size: object, fds: list[int]) -> mmap.mmap:
    """Map the peer's arena (the one memfd in ``fds``, announced as ``size`` bytes) read-only, after
    checking its seals and size; every descriptor in ``fds`` is closed.

    Raises:
        ChannelError: not one memfd, not sealed, or not the size announced. ArtifactTooLargeError: over
            ``C2C_MAX_ARTIFACT_BYTES``.
    """
    try:
        if len(fds) != 1 or not isinstance(size, int) or isinstance(size, bool) or size <= 0:
            raise ChannelError("an arena message must carry one memfd and its size")
        fd = fds[0]
        seals = fcntl.fcntl(fd, fcntl.F_GET_SEALS)  # first: only a sealed memfd's size can be trusted
        if seals & REQUIRED_SEALS != REQUIRED_SEALS:
            raise ChannelError(f"the peer's arena (seals {seals:#x}) is not a memfd sealed against "
                               "shrinking, growing and new writers")
        have = os.fstat(fd).st_size
        if size > max_artifact_bytes():
            raise ArtifactTooLargeError(f"the peer's {size}-byte arena is over the limit of "
                                        f"{max_artifact_bytes()} (C2C_MAX_ARTIFACT_BYTES)")
        if have != size:
            raise ChannelError(f"the peer's arena holds {have} bytes, not the {size} it announced")
        return mmap.mmap(fd, size, prot=mmap.PROT_READ)
    except (OSError, ValueError) as e:
        raise ChannelError(f"cannot map the peer's arena: {getattr(e, 'strerror', None) or e}") from None
    finally:
        close_all(fds)


def close_all(fds: list[int]) -> None:
    for fd in fds:
        os.close(fd)


def close_map(m: mmap.mmap) -> None:
    try:
        m.close()
    except BufferError:  # a view is still alive somewhere; the map goes with it
        pass


def ordered(cache: KVCache) -> list[torch.Tensor]:
    return [t for pair in zip(cache.keys, cache.values) for t in pair]


def as_bytes(t: torch.Tensor) -> np.ndarray:
    """The bytes of ``t`` (``(1, H, T, D)``, any float dtype) as a flat uint8 array, without a copy when contiguous."""
    t = t.detach().cpu().contiguous()
    same_size = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[t.element_size()]
    return t.view(same_size).numpy().reshape(-1).view(np.uint8)
