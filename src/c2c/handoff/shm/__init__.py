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

One job per module:

- :mod:`~c2c.handoff.shm.offer`: the wire: its messages, the signed :class:`ShmOffer`, a refusal
  turned back into its :class:`~c2c.errors.C2CError`;
- :mod:`~c2c.handoff.shm.arena`: the sealed ``memfd`` and how a cache lies in it;
- :mod:`~c2c.handoff.shm.admit`: what the receiver checks, in order, before it reads an arena byte
  (peer's user, seals and size, signature for this connection and sequence, domain, model, prefix)
  and after the copy (the token ids);
- :mod:`~c2c.handoff.shm.channel`: :class:`ShmListener` and :class:`ShmChannel`, the socket between them.

What it does not check: the tensor bytes carry no digest and their values are not scanned,
and the receiving domain's KV verification policy (:class:`~c2c.trust.verify_policy.VerifyPolicy`)
is not run, as for an in-process handoff.
Like :class:`~c2c.handoff.transport.SharedTransport` in one process, this path trusts the
authenticated peer for the bytes it puts in an arena that only the two processes map (and
the sender does not write it again before the ack). It is for one trust domain on one
machine; a cache that crosses domains or goes to a store travels as a signed artifact, whose
every byte is hashed (:class:`~c2c.handoff.transport.DirectoryTransport`, :mod:`c2c.store`).

Linux only (``memfd_create``, ``SCM_RIGHTS``, ``SO_PEERCRED``); elsewhere
:class:`~c2c.errors.RuntimeUnsupportedError`.
"""

from c2c.handoff.shm.channel import ShmChannel, ShmListener
from c2c.handoff.shm.offer import PROTOCOL, ShmOffer

__all__ = ["PROTOCOL", "ShmChannel", "ShmListener", "ShmOffer"]
