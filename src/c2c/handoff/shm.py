"""Across processes on one machine, within one trust domain: a cache through shared memory.

A :class:`ShmChannel` joins two processes of one user through a Unix socket. Each side that
sends owns an *arena*: a ``memfd`` (anonymous shared memory, with no name in any file
system) handed to its peer once, over the socket. A handoff then copies the cache's tensors
into the arena, sends a small signed *offer* that says what lies there, and waits for the
peer to copy them out and attach them. Nothing is encoded, hashed or written to a file: the
bytes cross at memory speed (``benchmarks/results/handoff_bandwidth.md``).

    # the writer's process                       # the analyst's process
    with ShmChannel.listen(path) as lst:         ch = ShmChannel.connect(path)
        ch = lst.accept()                        ch.send(analyst)          # blocks until attached
        ch.receive(writer)                       # -> Handoff, with the writer's timings

Wire (``SOCK_SEQPACKET``: one message per send, file descriptors beside them)::

    both ways, on connect   {"c2c": "shm-v1", "nonce": <32 random bytes, hex>}
    sender -> receiver      {"arena": size} + the memfd            (first use, or a bigger arena)
    sender -> receiver      {"offer": {...}, "sig": {...} | null}  (one per handoff)
    receiver -> sender      {"ack": seq, "seq": seq, "receiver": name, "timings": {...}}
                            | {"refused": {"type": C2CError subclass, "message": ...}, "seq": seq}

Arena bytes: the tensors in artifact order (``k.000, v.000, k.001, ...``), back to back,
then the token ids as ``uint32`` little-endian (what :func:`c2c.canon.token_digest` hashes).

What the receiver checks, in this order, before it reads an arena byte:

- the peer runs as the same user (``SO_PEERCRED``), else :class:`ChannelError`;
- the arena is a memfd sealed against shrinking, growing and new writers (``F_SEAL_SHRINK |
  F_SEAL_GROW | F_SEAL_FUTURE_WRITE``: no hole can be punched in it either), so reading it can
  never fault, and it has the size it was announced with, within ``C2C_MAX_ARTIFACT_BYTES``;
- the offer's signature, when the receiving team has a keyring (then it is required): a key
  trusted for the receiver's domain signed this offer, for this connection (the receiver's
  nonce), between these two processes (both pids, as ``SO_PEERCRED`` gives them: an offer a
  third process relays names that process) and under a sequence number above every one seen,
  so an offer can be neither replayed nor moved to another channel
  (:class:`~c2c.errors.TrustError` subclasses). The producer's domain must be the receiver's
  (:class:`~c2c.errors.DomainMismatchError`);
- the model fingerprint and the shared prefix (:class:`~c2c.errors.FingerprintMismatchError`,
  :class:`~c2c.errors.PrefixMismatchError`); every shape comes from the receiver's own
  fingerprint (:func:`c2c.artifact.codec.cache_layout`), never from the sender;
- then the tensors and token ids are copied out, and the ids must hash to the signed
  ``token_digest``.

What it does not check: the tensor bytes carry no digest and their values are not scanned,
and the receiving domain's KV verification policy (:class:`~c2c.trust.policy.VerifyPolicy`)
is not run, as for an in-process handoff.
Like :class:`~c2c.handoff.transport.SharedTransport` in one process, this path trusts the
authenticated peer for the bytes it puts in an arena that only the two processes map (and
the sender does not write it again before the ack). It is for one trust domain on one
machine; a cache that crosses domains or goes to a store travels as a signed artifact, whose
every byte is hashed (:class:`~c2c.handoff.transport.DirectoryTransport`, :mod:`c2c.store`).

Linux only (``memfd_create``, ``SCM_RIGHTS``, ``SO_PEERCRED``); elsewhere
:class:`~c2c.errors.RuntimeUnsupportedError`.
"""

from __future__ import annotations

import array
import base64
import binascii
import fcntl
import json
import mmap
import os
import secrets
import socket
import struct
import sys
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch

from c2c import errors
from c2c.artifact.codec import cache_layout, max_artifact_bytes
from c2c.artifact.fingerprint import Fingerprint
from c2c.artifact.header import MAX_TOKENS
from c2c.artifact.prefix import PrefixRef
from c2c.canon import canonical_json, sha256_hex
from c2c.config import DTYPES
from c2c.errors import (
    ArtifactTooLargeError,
    BadSignatureError,
    ChannelError,
    ConfigError,
    CorruptArtifactError,
    DomainMismatchError,
    RuntimeUnsupportedError,
    UnsignedArtifactError,
)
from c2c.handoff.decide import Party, decide
from c2c.handoff.policy import HandoffPolicy
from c2c.handoff.record import Handoff
from c2c.runtime.kvcache import KVCache
from c2c.team.agent import Agent

PROTOCOL = "shm-v1"
MAX_MESSAGE = 192 << 10          # bytes of one control message (an offer is a few KB; the socket's
                                 # default send buffer takes about 208 KiB in one message)
SEND_TIMEOUT = 30.0
# no shrinking (a read past the end faults), no growing, and no new writer (F_SEAL_FUTURE_WRITE: write(),
# new writable maps and hole punching are refused; the sender's own map, made first, keeps writing)
_F_SEAL_FUTURE_WRITE = getattr(fcntl, "F_SEAL_FUTURE_WRITE", 0x0010)
_REQUIRED_SEALS = getattr(fcntl, "F_SEAL_SHRINK", 0x2) | getattr(fcntl, "F_SEAL_GROW", 0x4) | _F_SEAL_FUTURE_WRITE


@dataclass(frozen=True, kw_only=True)
class ShmOffer:
    """What one handoff put in the sender's arena; the part of the wire the signature covers."""

    seq: int                      # 1, 2, ... per channel and direction
    nonce: str                    # the receiver's nonce for this connection (hex)
    sender_pid: int               # both ends as the kernel names them (SO_PEERCRED): an offer relayed
    receiver_pid: int             # by a third process names that process, not the receiver
    fingerprint: Fingerprint
    prefix: PrefixRef
    start: int                    # absolute position of the first token
    seq_len: int                  # T
    token_digest: str             # sha256 of the T ids as uint32 LE (they follow the tensors in the arena)
    producer: dict[str, str] = field(default_factory=dict)   # {"agent": ..., "domain": ...}
    labels: dict[str, str] = field(default_factory=dict)     # the span labels of a slice

    def to_dict(self) -> dict[str, Any]:
        return {"seq": self.seq, "nonce": self.nonce, "sender_pid": self.sender_pid,
                "receiver_pid": self.receiver_pid, "fingerprint": self.fingerprint.to_dict(),
                "prefix": self.prefix.to_dict(), "start": self.start, "seq_len": self.seq_len,
                "token_digest": self.token_digest, "producer": dict(self.producer), "labels": dict(self.labels)}

    @classmethod
    def from_dict(cls, d: Any) -> "ShmOffer":
        """Validate and build; anything malformed raises :class:`ChannelError`."""
        want = {"seq", "nonce", "sender_pid", "receiver_pid", "fingerprint", "prefix", "start", "seq_len",
                "token_digest", "producer", "labels"}
        if not isinstance(d, dict) or set(d) != want:
            raise ChannelError(f"malformed offer: expected the fields {sorted(want)}")
        for name, lo, hi in (("seq", 1, 1 << 62), ("start", 0, MAX_TOKENS), ("seq_len", 1, MAX_TOKENS),
                             ("sender_pid", 1, 1 << 31), ("receiver_pid", 1, 1 << 31)):
            v = d[name]
            if not isinstance(v, int) or isinstance(v, bool) or not lo <= v <= hi:
                raise ChannelError(f"malformed offer: {name} must be an integer in [{lo}, {hi}]")
        for name in ("producer", "labels"):
            v = d[name]
            if not isinstance(v, dict) or len(v) > 64 or not all(
                    isinstance(k, str) and isinstance(x, str) and len(k) + len(x) < 4096 for k, x in v.items()):
                raise ChannelError(f"malformed offer: {name} must map strings to strings")
        if not (isinstance(d["token_digest"], str) and len(d["token_digest"]) == 64
                and isinstance(d["nonce"], str) and len(d["nonce"]) == 64):
            raise ChannelError("malformed offer: token_digest and nonce must be 64 hex characters")
        try:
            fp, prefix = Fingerprint.from_dict(d["fingerprint"]), PrefixRef.from_dict(d["prefix"])
        except (ValueError, TypeError) as e:
            raise ChannelError(f"malformed offer: {e}") from None
        offer = cls(seq=d["seq"], nonce=d["nonce"], sender_pid=d["sender_pid"], receiver_pid=d["receiver_pid"],
                    fingerprint=fp, prefix=prefix, start=d["start"], seq_len=d["seq_len"],
                    token_digest=d["token_digest"], producer=dict(d["producer"]), labels=dict(d["labels"]))
        try:
            offer.canonical()  # e.g. a lone surrogate in a string cannot be signed or checked
        except (UnicodeError, ValueError):
            raise ChannelError("malformed offer: a string that is not valid Unicode") from None
        return offer

    def canonical(self) -> bytes:
        return canonical_json(self.to_dict())


@dataclass(frozen=True)
class _Layout:
    names: list[str]
    shapes: list[list[int]]            # [1, kv_heads, T_layer, head_dim] per tensor
    spans: list[tuple[int, int]]       # byte range of each tensor in the arena
    windows: tuple[int | None, ...]
    dtype: torch.dtype
    tokens_at: int                     # where the uint32 token ids start
    size: int                          # bytes in all

    @classmethod
    def of(cls, fp: Fingerprint, seq_len: int) -> "_Layout":
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


def _check_platform() -> None:
    if not (sys.platform.startswith("linux") and hasattr(os, "memfd_create") and hasattr(socket, "SO_PEERCRED")):
        raise RuntimeUnsupportedError("the shared-memory channel needs Linux (memfd_create, SCM_RIGHTS, "
                                      "SO_PEERCRED); hand off through c2c.handoff.DirectoryTransport instead")


class ShmListener:
    """A listening socket at ``path`` (created 0600); :meth:`accept` yields one :class:`ShmChannel` per peer."""

    def __init__(self, path: str | Path):
        _check_platform()
        self.path = Path(path)
        if self.path.exists():
            raise ConfigError(f"{self.path} already exists; remove it or choose another socket path")
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        old = os.umask(0o177)
        try:
            self._sock.bind(str(self.path))
        except OSError as e:
            self._sock.close()
            raise ConfigError(f"cannot listen at {self.path}: {e.strerror}") from None
        finally:
            os.umask(old)
        self._sock.listen(8)

    def accept(self, *, timeout: float | None = None, name: str = "") -> "ShmChannel":
        self._sock.settimeout(timeout)
        try:
            conn, _ = self._sock.accept()
        except TimeoutError:
            raise ChannelError(f"no peer connected to {self.path} within {timeout} s") from None
        except OSError as e:
            raise ChannelError(f"cannot accept at {self.path}: {e.strerror or e}") from None
        return ShmChannel(conn, name=name)

    def close(self) -> None:
        self._sock.close()
        self.path.unlink(missing_ok=True)

    def __enter__(self) -> "ShmListener":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class ShmChannel:
    """One connection between two processes of the same user, one handoff at a time (half-duplex).

    :meth:`send` blocks until the peer has attached the cache (or refused it, which raises the
    peer's error here too); :meth:`receive` blocks until an offer arrives. Either side may send,
    from its own arena, but never both at once: a message out of turn (or no answer within the
    timeout) closes the channel, since a late answer would be taken for the next offer's.
    """

    def __init__(self, sock: socket.socket, *, name: str = ""):
        self._sock = sock
        self.name = name
        self._seq_out = 0
        self._seq_in = 0
        self._out: tuple[mmap.mmap, np.ndarray] | None = None        # our arena: map, uint8 view
        self._in: tuple[mmap.mmap, np.ndarray] | None = None         # the peer's arena, read-only
        self._keys: dict[str, Any] = {}
        self.closed = False
        try:
            pid, uid, _ = struct.unpack("iII", sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED,
                                                               struct.calcsize("iII")))
            if uid != os.geteuid():
                raise ChannelError(f"the peer (pid {pid}) runs as uid {uid}, not as this process's uid "
                                   f"{os.geteuid()}: the shared-memory channel joins one user's processes")
            self.peer_pid = pid
            self._nonce = secrets.token_hex(32)
            self._send({"c2c": PROTOCOL, "nonce": self._nonce})
            hello, fds = self._recv(timeout=30.0)
            _close_all(fds)
            if hello.get("c2c") != PROTOCOL or not isinstance(hello.get("nonce"), str) or len(hello["nonce"]) != 64:
                raise ChannelError(f"the peer does not speak c2c {PROTOCOL}: {str(hello)[:120]}")
            self._peer_nonce = hello["nonce"]
        except BaseException:
            sock.close()
            raise

    @classmethod
    def listen(cls, path: str | Path) -> ShmListener:
        return ShmListener(path)

    @classmethod
    def connect(cls, path: str | Path, *, timeout: float = 30.0, name: str = "") -> "ShmChannel":
        """Connect to a :class:`ShmListener` at ``path``, waiting up to ``timeout`` s for it to appear."""
        _check_platform()
        deadline = time.monotonic() + timeout
        while True:
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
            try:
                sock.connect(str(path))
                return cls(sock, name=name)
            except (FileNotFoundError, ConnectionRefusedError):
                sock.close()
                if time.monotonic() > deadline:
                    raise ChannelError(f"nobody listens at {path} (waited {timeout} s); start the receiver's "
                                       "ShmChannel.listen first") from None
                time.sleep(0.02)
            except OSError as e:
                sock.close()
                raise ChannelError(f"cannot connect to {path}: {e.strerror or e}") from None

    # ------------------------------------------------------------------ sending
    def send(self, agent: Agent, *, labels: tuple[str, ...] | None = None, isolation: str = "recompute",
             timeout: float | None = 60.0) -> Handoff:
        """Put ``agent``'s cache (whole, or the slice of ``labels``) in the arena, offer it, wait for the peer.

        ``isolation`` cuts a slice as :class:`~c2c.handoff.policy.HandoffPolicy` does (``"recompute"``
        by default: re-prefilled after the shared prefix, no trace of earlier spans).

        Returns the sender's record (``roundtrip_s`` runs from the offer to the peer's ack, so it
        holds the peer's checks, copy and attach). The peer's refusal raises the same :class:`~c2c.errors.C2CError` subclass here.
        """
        t0 = time.perf_counter()
        cache, span = agent.export_cache(labels=labels, isolation=isolation)
        layout = _Layout.of(agent.fingerprint, cache.seq_len)
        t1 = time.perf_counter()
        arena = self._arena(layout.size)
        # NOTE: numpy copies (one thread, plain memcpy): torch's copy wakes its thread pool, whose
        # spinning threads then compete with the peer process for the cores (2.6 ms against 0.3 ms).
        for (a, b), t in zip(layout.spans, _ordered(cache)):
            np.copyto(arena[a:b], _as_bytes(t))
        ids = np.asarray(cache.token_ids, dtype="<u4")
        arena[layout.tokens_at:layout.size] = ids.view(np.uint8)
        digest = sha256_hex(ids.tobytes())
        t2 = time.perf_counter()
        self._seq_out += 1
        offer = ShmOffer(seq=self._seq_out, nonce=self._peer_nonce, sender_pid=os.getpid(),
                         receiver_pid=self.peer_pid, fingerprint=agent.fingerprint,
                         prefix=agent.prefix, start=cache.start, seq_len=cache.seq_len, token_digest=digest,
                         producer={"agent": agent.name, "domain": agent.team.domain}, labels=span)
        sig = _sign(offer, self._signing_key(agent)) if agent.team.keyring is not None else None
        t3 = time.perf_counter()
        self._send({"offer": offer.to_dict(), "sig": sig})
        try:  # half-duplex: the next message must answer this offer
            reply, fds = self._recv(timeout=timeout)
            _close_all(fds)
            if reply.get("seq") != offer.seq or not ("ack" in reply or "refused" in reply):
                raise ChannelError(f"the peer answered {str(reply)[:120]} to offer {offer.seq}")
        except errors.C2CError:
            # no answer (or a wrong one): the peer may still be reading the arena, and a late answer
            # would be taken for the next offer's; the channel cannot be used again
            self.close()
            raise
        t4 = time.perf_counter()
        if "refused" in reply:
            raise _peer_error(reply["refused"])
        mode = "slice" if labels is not None else "full"
        return Handoff(sender=agent.name, receiver=str(reply.get("receiver", "?"))[:200], requested=mode, used=mode,
                       reason=f"shared memory across processes (peer pid {self.peer_pid}), offer {offer.seq}"
                              + ("" if sig else ", unsigned"),
                       artifact_bytes=layout.size,
                       timings={"export_s": t1 - t0, "copy_s": t2 - t1, "sign_s": t3 - t2,
                                "roundtrip_s": t4 - t3})

    def _signing_key(self, agent: Agent):
        domain = agent.team.domain
        key = (str(agent.team.keyring.root), domain)
        if key not in self._keys:  # read from that keyring once per channel
            self._keys[key] = agent.team.keyring.signing_key(domain)
        return self._keys[key]

    def _arena(self, size: int) -> np.ndarray:
        """Our arena as a uint8 array of at least ``size`` bytes; a new one is made and sent when it is short."""
        if self._out is not None and self._out[1].size >= size:
            return self._out[1]
        limit = max_artifact_bytes()
        if size > limit:
            raise ArtifactTooLargeError(f"the cache needs {size} bytes, over the limit of {limit} "
                                        "(C2C_MAX_ARTIFACT_BYTES)")
        cap = max(size, min(limit, max(1 << 20, -(-int(size * 1.25) // (1 << 20)) * (1 << 20))))  # MiB steps
        fd = os.memfd_create("c2c-shm-arena", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
        m = None
        try:
            os.ftruncate(fd, cap)
            m = mmap.mmap(fd, cap)  # before F_SEAL_FUTURE_WRITE: this mapping stays writable, no later one
            fcntl.fcntl(fd, fcntl.F_ADD_SEALS, _REQUIRED_SEALS)
            self._send({"arena": cap}, fds=[fd])
        except (OSError, errors.C2CError) as e:
            if m is not None:
                m.close()
            if isinstance(e, errors.C2CError):
                raise
            raise ChannelError(f"cannot make a {cap}-byte shared-memory arena: {e.strerror}") from None
        finally:
            os.close(fd)  # the map holds its own reference
        self._drop("_out")
        self._out = (m, np.frombuffer(m, dtype=np.uint8))
        return self._out[1]

    # ---------------------------------------------------------------- receiving
    def receive(self, agent: Agent, *, timeout: float | None = None, hops: int = 1) -> Handoff:
        """Wait for an offer, check it (module docstring), copy the cache out and attach it to ``agent``.

        ``hops``: cache hops in the chain once this one is made (as :func:`c2c.handoff.hand_off` takes it).

        A refused offer is answered with the error (the sender raises it too) and raised here; the
        channel goes on. A peer that breaks the protocol (a malformed message, an unsealed or oversized
        arena) gets the channel closed: it is raised here, and the sender sees the channel closed.
        """
        while True:
            try:
                msg, fds = self._recv(timeout=timeout)
                if "arena" in msg:
                    self._map_arena(msg, fds)
                    continue
            except _Silent:
                raise
            except errors.C2CError:
                self.close()
                raise
            _close_all(fds)  # descriptors travel with arena messages only
            break
        if "offer" not in msg:  # an answer or anything else, where an offer was due: out of step
            self.close()
            raise ChannelError(f"expected an offer, got {str(msg)[:120]}; the channel is closed")
        t0 = time.perf_counter()
        seq = msg["offer"].get("seq") if isinstance(msg["offer"], dict) else None
        try:
            fingerprint = agent.fingerprint
            offer = self._admit(agent, fingerprint, msg, hops)
            layout = _Layout.of(fingerprint, offer.seq_len)
            if self._in is None or layout.size > self._in[1].size:
                raise ChannelError(f"the offer needs {layout.size} arena bytes; the peer's arena holds "
                                   f"{0 if self._in is None else self._in[1].size}")
            if layout.size > max_artifact_bytes():
                raise ArtifactTooLargeError(f"the offer needs {layout.size} bytes, over the limit of "
                                            f"{max_artifact_bytes()} (C2C_MAX_ARTIFACT_BYTES)")
            t1 = time.perf_counter()
            try:
                own = np.empty(layout.size, dtype=np.uint8)
            except MemoryError:
                raise ArtifactTooLargeError(f"no memory for a {layout.size}-byte cache") from None
            np.copyto(own, self._in[1][:layout.size])  # the one copy: from here the cache is ours alone
            t2 = time.perf_counter()
            ids = own[layout.tokens_at:].view("<u4")
            if sha256_hex(ids.tobytes()) != offer.token_digest:
                raise CorruptArtifactError("the token ids in the arena do not match the offer's token_digest")
            vocab = agent.runtime.facts.vocab_size
            if len(ids) and vocab and int(ids.max()) >= vocab:
                raise CorruptArtifactError(f"a token id in the offer ({int(ids.max())}) is outside the model's "
                                           f"vocabulary of {vocab}")
            flat = torch.from_numpy(own)
            tensors = [flat[a:b].view(layout.dtype).view(s) for (a, b), s in zip(layout.spans, layout.shapes)]
            cache = KVCache(keys=tuple(tensors[0::2]), values=tuple(tensors[1::2]),
                            token_ids=tuple(ids.tolist()), start=offer.start, windows=layout.windows)
            agent.attach_cache(cache, fingerprint=offer.fingerprint, prefix=offer.prefix,
                               source=offer.producer.get("agent", "?"))
            t3 = time.perf_counter()
        except Exception as e:  # noqa: BLE001 - every refusal is answered, and raised as a C2CError
            err = e if isinstance(e, errors.C2CError) else ChannelError(f"the offer failed here: {type(e).__name__}: {e}")
            self._send({"refused": {"type": type(err).__name__, "message": str(err)[:2000]}, "seq": seq})
            if err is e:
                raise
            raise err from e
        timings = {"check_s": t1 - t0, "copy_s": t2 - t1, "attach_s": t3 - t2}
        self._send({"ack": offer.seq, "seq": offer.seq, "receiver": agent.name, "timings": timings})
        mode = "slice" if offer.labels.get("span") else "full"
        return Handoff(sender=offer.producer.get("agent", "?"), receiver=agent.name, requested=mode, used=mode,
                       reason=f"shared memory across processes (peer pid {self.peer_pid}), offer {offer.seq}",
                       artifact_bytes=layout.size, timings=timings)

    def _admit(self, agent: Agent, fingerprint: Fingerprint, msg: dict, hops: int) -> ShmOffer:
        """Signature, sequence, then decide()'s domain, model, prefix and hop checks: everything checked
        before an arena byte is read."""
        offer = ShmOffer.from_dict(msg["offer"])
        ring, domain = agent.team.keyring, agent.team.domain
        if ring is not None:
            _verify(offer, msg.get("sig"), ring, domain)
        if offer.nonce != self._nonce:
            raise BadSignatureError("the offer was made for another connection (nonce differs): replayed")
        if (offer.sender_pid, offer.receiver_pid) != (self.peer_pid, os.getpid()):
            raise BadSignatureError(f"the offer was made by pid {offer.sender_pid} for pid {offer.receiver_pid}, "
                                    f"not by this channel's peer {self.peer_pid} for this process {os.getpid()}: "
                                    "relayed")
        if offer.seq <= self._seq_in:  # numbers only grow (a refused offer uses one up too)
            raise BadSignatureError(f"offer {offer.seq} arrived after offer {self._seq_in}: replayed")
        self._seq_in = offer.seq
        # the hop rules (domain, model, shared prefix, hop limit) are decide()'s, as for every hop
        sender = Party(name=offer.producer.get("agent", "?"), domain=offer.producer.get("domain"),
                       fingerprint=offer.fingerprint, prefix=offer.prefix)
        receiver = replace(Party.of(agent), fingerprint=fingerprint)
        mode = "slice" if offer.labels.get("span") else "full"
        refusal = decide(sender, receiver, HandoffPolicy(mode=mode), hops=hops).refusal()
        if refusal is not None:
            raise refusal
        if offer.start != 0 and offer.start < offer.prefix.length:  # a slice follows the shared prefix
            raise CorruptArtifactError(f"a slice starting at {offer.start} lies inside the "
                                       f"{offer.prefix.length}-token shared prefix")
        return offer

    def _map_arena(self, msg: dict, fds: list[int]) -> None:
        try:
            size = msg["arena"]
            if len(fds) != 1 or not isinstance(size, int) or isinstance(size, bool) or size <= 0:
                raise ChannelError("an arena message must carry one memfd and its size")
            fd = fds[0]
            seals = fcntl.fcntl(fd, fcntl.F_GET_SEALS)  # first: only a sealed memfd's size can be trusted
            if seals & _REQUIRED_SEALS != _REQUIRED_SEALS:
                raise ChannelError(f"the peer's arena (seals {seals:#x}) is not a memfd sealed against "
                                   "shrinking, growing and new writers")
            have = os.fstat(fd).st_size
            if size > max_artifact_bytes():
                raise ArtifactTooLargeError(f"the peer's {size}-byte arena is over the limit of "
                                            f"{max_artifact_bytes()} (C2C_MAX_ARTIFACT_BYTES)")
            if have != size:
                raise ChannelError(f"the peer's arena holds {have} bytes, not the {size} it announced")
            m = mmap.mmap(fd, size, prot=mmap.PROT_READ)
        except (OSError, ValueError) as e:
            raise ChannelError(f"cannot map the peer's arena: {getattr(e, 'strerror', None) or e}") from None
        finally:
            _close_all(fds)
        view = np.frombuffer(m, dtype=np.uint8)  # read-only: every cache is copied out of it first
        self._drop("_in")
        self._in = (m, view)

    # ------------------------------------------------------------------ plumbing
    def _send(self, obj: dict, fds: list[int] = ()) -> None:
        if self.closed:
            raise ChannelError("the channel is closed")
        data = json.dumps(obj, separators=(",", ":")).encode()
        if len(data) > MAX_MESSAGE:
            raise ChannelError(f"a {len(data)}-byte control message is over the {MAX_MESSAGE}-byte limit")
        anc = [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds).tobytes())] if fds else []
        try:
            self._sock.settimeout(SEND_TIMEOUT)  # a control message is small: a peer that takes none is gone
            self._sock.sendmsg([data], anc)
        except OSError as e:
            raise ChannelError(f"the peer is gone ({e.strerror or e})") from None

    def _recv(self, *, timeout: float | None) -> tuple[dict, list[int]]:
        if self.closed:
            raise ChannelError("the channel is closed")
        self._sock.settimeout(timeout)
        try:
            data, anc, flags, _ = self._sock.recvmsg(MAX_MESSAGE, socket.CMSG_SPACE(4 * 4),
                                                     getattr(socket, "MSG_CMSG_CLOEXEC", 0))
        except TimeoutError:
            raise _Silent(f"no message from the peer within {timeout} s") from None
        except OSError as e:
            raise ChannelError(f"the peer is gone ({e.strerror or e})") from None
        fds: list[int] = []
        for level, kind, raw in anc:
            if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                fds.extend(array.array("i", raw[: len(raw) - len(raw) % 4]))
        if flags & (socket.MSG_TRUNC | socket.MSG_CTRUNC):
            _close_all(fds)
            raise ChannelError(f"a control message over {MAX_MESSAGE} bytes (or with extra descriptors) was refused")
        if not data:
            _close_all(fds)
            raise ChannelError("the peer closed the channel")
        try:
            obj = json.loads(data)
        except (UnicodeDecodeError, ValueError, RecursionError):
            obj = None
        if not isinstance(obj, dict):
            _close_all(fds)
            raise ChannelError("the peer sent a control message that is not a JSON object")
        return obj, fds

    def _drop(self, side: str) -> None:
        """Unmap our arena (``"_out"``) or the peer's (``"_in"``)."""
        held = getattr(self, side)
        if held is not None:
            setattr(self, side, None)
            m, view = held
            del view, held
            _close_map(m)

    def close(self) -> None:
        self._drop("_out")
        self._drop("_in")
        self._sock.close()
        self.closed = True

    def __enter__(self) -> "ShmChannel":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class _Silent(ChannelError):
    """No message within the timeout: nothing is wrong with the channel (it stays open)."""


def _close_all(fds: list[int]) -> None:
    for fd in fds:
        os.close(fd)


def _close_map(m: mmap.mmap) -> None:
    try:
        m.close()
    except BufferError:  # a view is still alive somewhere; the map goes with it
        pass


def _ordered(cache: KVCache) -> list[torch.Tensor]:
    return [t for pair in zip(cache.keys, cache.values) for t in pair]


def _as_bytes(t: torch.Tensor) -> np.ndarray:
    """The bytes of ``t`` (``(1, H, T, D)``, any float dtype) as a flat uint8 array, without a copy when contiguous."""
    t = t.detach().cpu().contiguous()
    same_size = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[t.element_size()]
    return t.view(same_size).numpy().reshape(-1).view(np.uint8)


def _sign(offer: ShmOffer, key) -> dict[str, str]:
    return {"domain": key.domain, "key_id": key.key_id,
            "sig": base64.b64encode(key.sign(b"c2c-shm-offer-v1\n" + offer.canonical())).decode()}


def _verify(offer: ShmOffer, sig: Any, ring, domain: str) -> None:
    if sig is None:
        raise UnsignedArtifactError("the offer is not signed; the receiving team has a keyring, so the sending "
                                    "team needs one too (its domain's signing key)")
    if not isinstance(sig, dict) or set(sig) != {"domain", "key_id", "sig"} or not all(
            isinstance(v, str) for v in sig.values()):
        raise BadSignatureError("malformed offer signature: expected string fields domain, key_id, sig")
    if sig["domain"] != domain:
        raise DomainMismatchError(f"the offer was signed for trust domain {sig['domain']!r}, not {domain!r}; "
                                  "caches do not cross trust domains, hand off by text")
    public = ring.public_key(sig["key_id"], domain)  # raises RevokedSignerError / UnknownSignerError
    try:
        raw = base64.b64decode(sig["sig"], validate=True)
    except (binascii.Error, ValueError):
        raise BadSignatureError("offer signature bytes are not valid base64") from None
    if len(raw) != 64 or not public.verify(raw, b"c2c-shm-offer-v1\n" + offer.canonical()):
        raise BadSignatureError(f"offer signature by key {sig['key_id'][:16]} does not verify: the offer was changed")


def _peer_error(refusal: Any) -> errors.C2CError:
    """The peer's refusal as the same C2CError subclass (ChannelError when the name is not one of ours)."""
    if not isinstance(refusal, dict):
        return ChannelError(f"the peer refused the offer: {str(refusal)[:200]}")
    name, message = str(refusal.get("type", ""))[:80], str(refusal.get("message", ""))[:2000]
    cls = getattr(errors, name, None)
    if not (isinstance(cls, type) and issubclass(cls, errors.C2CError)):
        cls = ChannelError
    return cls(f"the receiving process refused the cache: {message}")
