"""The channel: a Unix socket between two processes of one user, and one handoff at a time over it.

:class:`ShmListener` listens at a path (0600); :meth:`ShmChannel.connect` joins it. On connect both
sides check the peer's user (``SO_PEERCRED``) and trade nonces; then :meth:`ShmChannel.send` puts a
cache in this side's arena (:mod:`~c2c.handoff.shm.arena`), offers it (:mod:`~c2c.handoff.shm.offer`)
and waits for the answer, and :meth:`ShmChannel.receive` admits an offer
(:mod:`~c2c.handoff.shm.admit`), copies the cache out and attaches it.
"""

from __future__ import annotations

import array
import json
import mmap
import os
import secrets
import socket
import struct
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from c2c import errors
from c2c.artifact.codec import max_artifact_bytes
from c2c.errors import ArtifactTooLargeError, ChannelError, ConfigError, EditedCacheError, RuntimeUnsupportedError
from c2c.handoff.record import Handoff
from c2c.handoff.shm import admit, arena
from c2c.handoff.shm.offer import PROTOCOL, ShmOffer, peer_error, sign_offer
from c2c.team.agent import Agent

MAX_MESSAGE = 192 << 10          # bytes of one control message (an offer is a few KB; the socket's
                                 # default send buffer takes about 208 KiB in one message)
SEND_TIMEOUT = 30.0


def check_platform() -> None:
    if not (sys.platform.startswith("linux") and hasattr(os, "memfd_create") and hasattr(socket, "SO_PEERCRED")):
        raise RuntimeUnsupportedError("the shared-memory channel needs Linux (memfd_create, SCM_RIGHTS, "
                                      "SO_PEERCRED); hand off through c2c.handoff.DirectoryTransport instead")


class ShmListener:
    """A listening socket at ``path`` (created 0600); :meth:`accept` yields one :class:`ShmChannel` per peer."""

    def __init__(self, path: str | Path):
        check_platform()
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
            arena.close_all(fds)
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
        check_platform()
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
        if not cache.exact:  # the arena carries tensors and token ids, not an edit record
            raise EditedCacheError(f"{agent.name}'s cache was edited without a prefill (messages dropped), so it is "
                                   "approximate; the shared-memory channel carries exact caches only: publish it "
                                   "through the store (its header records the edit), or send the text")
        layout = arena.Layout.of(agent.fingerprint, cache.seq_len)
        t1 = time.perf_counter()
        digest = layout.write(self._arena(layout.size), cache)
        t2 = time.perf_counter()
        self._seq_out += 1
        offer = ShmOffer(seq=self._seq_out, nonce=self._peer_nonce, sender_pid=os.getpid(),
                         receiver_pid=self.peer_pid, fingerprint=agent.fingerprint,
                         prefix=agent.prefix, start=cache.start, seq_len=cache.seq_len, token_digest=digest,
                         producer={"agent": agent.name, "domain": agent.team.domain}, labels=span)
        sig = sign_offer(offer, self._signing_key(agent)) if agent.team.keyring is not None else None
        t3 = time.perf_counter()
        self._send({"offer": offer.to_dict(), "sig": sig})
        try:  # half-duplex: the next message must answer this offer
            reply, fds = self._recv(timeout=timeout)
            arena.close_all(fds)
            if reply.get("seq") != offer.seq or not ("ack" in reply or "refused" in reply):
                raise ChannelError(f"the peer answered {str(reply)[:120]} to offer {offer.seq}")
        except errors.C2CError:
            # no answer (or a wrong one): the peer may still be reading the arena, and a late answer
            # would be taken for the next offer's; the channel cannot be used again
            self.close()
            raise
        t4 = time.perf_counter()
        if "refused" in reply:
            raise peer_error(reply["refused"])
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
        cap = arena.capacity(size)
        fd, m = arena.create(cap)
        try:
            self._send({"arena": cap}, fds=[fd])
        except errors.C2CError:
            m.close()
            raise
        finally:
            os.close(fd)  # the map holds its own reference
        self._drop("_out")
        self._out = (m, np.frombuffer(m, dtype=np.uint8))
        return self._out[1]

    # ---------------------------------------------------------------- receiving
    def receive(self, agent: Agent, *, timeout: float | None = None, hops: int = 1) -> Handoff:
        """Wait for an offer, check it (:mod:`~c2c.handoff.shm.admit`), copy the cache out and attach it to
        ``agent``.

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
            arena.close_all(fds)  # descriptors travel with arena messages only
            break
        if "offer" not in msg:  # an answer or anything else, where an offer was due: out of step
            self.close()
            raise ChannelError(f"expected an offer, got {str(msg)[:120]}; the channel is closed")
        t0 = time.perf_counter()
        seq = msg["offer"].get("seq") if isinstance(msg["offer"], dict) else None
        try:
            fingerprint = agent.fingerprint
            offer = admit.authenticate(msg, agent, nonce=self._nonce, peer_pid=self.peer_pid, last_seq=self._seq_in)
            self._seq_in = offer.seq  # used up, even if the offer is refused below
            admit.fits(offer, agent, fingerprint, hops=hops)
            layout = arena.Layout.of(fingerprint, offer.seq_len)
            if self._in is None or layout.size > self._in[1].size:
                raise ChannelError(f"the offer needs {layout.size} arena bytes; the peer's arena holds "
                                   f"{0 if self._in is None else self._in[1].size}")
            if layout.size > max_artifact_bytes():
                raise ArtifactTooLargeError(f"the offer needs {layout.size} bytes, over the limit of "
                                            f"{max_artifact_bytes()} (C2C_MAX_ARTIFACT_BYTES)")
            t1 = time.perf_counter()
            own = layout.copy_out(self._in[1])  # the one copy: from here the cache is ours alone
            t2 = time.perf_counter()
            admit.check_tokens(layout.token_ids(own), offer, agent.runtime.facts.vocab_size)
            cache = layout.cache(own, offer.start)
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

    def _map_arena(self, msg: dict, fds: list[int]) -> None:
        m = arena.open_peer(msg["arena"], fds)
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
            arena.close_all(fds)
            raise ChannelError(f"a control message over {MAX_MESSAGE} bytes (or with extra descriptors) was refused")
        if not data:
            arena.close_all(fds)
            raise ChannelError("the peer closed the channel")
        try:
            obj = json.loads(data)
        except (UnicodeDecodeError, ValueError, RecursionError):
            obj = None
        if not isinstance(obj, dict):
            arena.close_all(fds)
            raise ChannelError("the peer sent a control message that is not a JSON object")
        return obj, fds

    def _drop(self, side: str) -> None:
        """Unmap our arena (``"_out"``) or the peer's (``"_in"``)."""
        held = getattr(self, side)
        if held is not None:
            setattr(self, side, None)
            m, view = held
            del view, held
            arena.close_map(m)

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


