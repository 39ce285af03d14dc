"""The shared-memory channel (c2c.handoff.shm): a cache across processes, and every refusal on both sides."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading

import numpy as np
import pytest
import torch

from c2c.artifact.prefix import SharedPrefix
from c2c.canon import sha256_hex
from c2c.errors import (
    ArtifactTooLargeError,
    BadSignatureError,
    ChannelError,
    CorruptArtifactError,
    DomainMismatchError,
    FingerprintMismatchError,
    PrefixMismatchError,
    UnknownSignerError,
    UnsignedArtifactError,
)
from c2c.handoff import hand_off
from c2c.handoff.shm import ShmChannel, arena
from c2c.handoff.shm import offer as wire
from c2c.team.agent import Agent, Team
from c2c.trust.keys import Keyring

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the channel is Linux only")

SHARED = SharedPrefix.build("You are a team of two agents.", tools=["calc"])
DOC = "Paris is the capital of France. The Seine flows through it. " * 2


def agents(rt, team, rt_b=None, team_b=None):
    a = Agent("analyst", rt, team, role="You are the analyst.")
    a.read(DOC, label="evidence", private=False)
    return a, Agent("writer", rt_b or rt, team_b or team, role="You are the writer.")


@pytest.fixture
def channel(tmp_path):
    """(sender channel, receiver channel), joined through a real socket in this process."""
    got = {}
    listener = ShmChannel.listen(tmp_path / "c.sock")
    t = threading.Thread(target=lambda: got.setdefault("rx", listener.accept(timeout=10)))
    t.start()
    tx = ShmChannel.connect(tmp_path / "c.sock", timeout=10)
    t.join()
    yield tx, got["rx"]
    tx.close()
    got["rx"].close()
    listener.close()


def exchange(tx, rx, sender, receiver, **send_options):
    """Receive in a thread, send here; returns (sender's record or error, receiver's record or error)."""
    out = {}

    def receive():
        try:
            out["rx"] = rx.receive(receiver, timeout=10)
        except Exception as e:  # noqa: BLE001 - the test inspects it
            out["rx"] = e

    t = threading.Thread(target=receive)
    t.start()
    try:
        out["tx"] = tx.send(sender, timeout=10, **send_options)
    except Exception as e:  # noqa: BLE001
        out["tx"] = e
    t.join()
    return out["tx"], out["rx"]


CHILD = r"""
import json, sys
from c2c.artifact.prefix import SharedPrefix
from c2c.handoff.shm import ShmChannel
from c2c.runtime import zoo
from c2c.team.agent import Agent, Team
from c2c.trust.keys import Keyring
rt = zoo.load("tiny-qwen2")
team = Team(shared=SharedPrefix.build("You are a team of two agents.", tools=["calc"]), domain="lab",
            keyring=Keyring(sys.argv[2]))
w = Agent("writer", rt, team, role="You are the writer.")
with ShmChannel.listen(sys.argv[1]) as listener:
    print("ready", flush=True)
    ch = listener.accept(timeout=60)
    h = ch.receive(w, timeout=60)
    g = w.respond("Where is it?", max_new_tokens=6, min_new_tokens=6)
    ch.close()
print(json.dumps({"used": h.used, "bytes": h.artifact_bytes, "sender": h.sender, "context": list(w.context.token_ids),
                  "answer": list(g.token_ids)}))
"""


def test_a_signed_cache_crosses_processes_and_the_writer_continues_exactly(tiny, tmp_path):
    rt = tiny("qwen2")
    ring = Keyring(tmp_path / "keys")
    ring.create_key("lab")
    team = Team(shared=SHARED, domain="lab", keyring=ring)
    a, ref = agents(rt, team)
    hand_off(a, ref, mode="full")  # the same hop through a signed artifact file, for reference
    ref_answer = ref.respond("Where is it?", max_new_tokens=6, min_new_tokens=6).token_ids
    sock = tmp_path / "w.sock"
    proc = subprocess.Popen([sys.executable, "-c", CHILD, str(sock), str(ring.root)], stdout=subprocess.PIPE,
                            text=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
    try:
        assert proc.stdout.readline().strip() == "ready"
        with ShmChannel.connect(sock, timeout=30) as ch:
            h = ch.send(a, timeout=60)
        child = json.loads(proc.stdout.read().strip().splitlines()[-1])
    finally:
        proc.wait(timeout=60)
    assert proc.returncode == 0
    assert (h.used, h.receiver, child["used"], child["sender"]) == ("full", "writer", "full", "analyst")
    assert h.artifact_bytes == child["bytes"] >= a.cache.nbytes
    assert "unsigned" not in h.reason and h.timings["roundtrip_s"] > 0
    assert child["context"] == list(ref.context.token_ids[: len(child["context"])])
    assert child["answer"] == list(ref_answer)  # token-identical to the artifact path


@pytest.mark.parametrize("mode", ["full", "slice"])
def test_the_received_cache_equals_the_artifact_path_and_owns_its_memory(tiny, channel, mode):
    rt = tiny("qwen2")
    team = Team(shared=SHARED)
    a, b = agents(rt, team)
    a2, ref = agents(rt, team)
    labels = ("evidence",) if mode == "slice" else None
    hand_off(a2, ref, mode=mode, **({"labels": labels} if labels else {}))
    tx, rx = channel
    h, got = exchange(tx, rx, a, b, labels=labels)
    assert (h.used, got.used) == (mode, mode) and "unsigned" in h.reason
    assert b.context.token_ids == ref.context.token_ids
    assert b.cache.max_abs_diff(ref.cache) == 0
    before = b.cache.keys[-1].clone()
    a.read("More text that changes the analyst's cache.", label="more", private=False)
    _, again = exchange(tx, rx, a, agents(rt, team)[1])  # the arena is written again
    assert again.used == "full"
    assert torch.equal(b.cache.keys[-1], before)  # the first writer's cache did not move with the arena
    assert b.respond("Where?", max_new_tokens=4).token_ids == ref.respond("Where?", max_new_tokens=4).token_ids


def test_another_model_or_prefix_is_refused_on_both_sides(tiny, channel):
    tx, rx = channel
    team = Team(shared=SHARED)
    a, b = agents(tiny("qwen2"), team, rt_b=tiny("llama"))
    sent, got = exchange(tx, rx, a, b)
    assert isinstance(got, FingerprintMismatchError) and isinstance(sent, FingerprintMismatchError)
    assert "refused" in str(sent)
    a, b = agents(tiny("qwen2"), team, team_b=Team(shared=SharedPrefix.build("Another team.")))
    sent, got = exchange(tx, rx, a, b)
    assert isinstance(got, PrefixMismatchError) and isinstance(sent, PrefixMismatchError)
    assert b.cache.seq_len == b.context.prefix_len  # nothing was attached


def test_domains_and_signatures(tiny, channel, tmp_path):
    tx, rx = channel
    rt = tiny("qwen2")
    a, b = agents(rt, Team(shared=SHARED, domain="red"), team_b=Team(shared=SHARED, domain="blue"))
    assert isinstance(exchange(tx, rx, a, b)[1], DomainMismatchError)
    ring = Keyring(tmp_path / "keys")
    ring.create_key("lab")
    signed = Team(shared=SHARED, domain="lab", keyring=ring)
    a, b = agents(rt, Team(shared=SHARED, domain="lab"), team_b=signed)
    assert isinstance(exchange(tx, rx, a, b)[1], UnsignedArtifactError)
    stranger = Keyring(tmp_path / "stranger")
    stranger.create_key("lab")  # the same domain's name, a key the receiver never trusted
    a, b = agents(rt, Team(shared=SHARED, domain="lab", keyring=stranger), team_b=signed)
    assert isinstance(exchange(tx, rx, a, b)[1], UnknownSignerError)


def test_a_changed_replayed_or_lying_offer_is_refused(tiny, channel, tmp_path, monkeypatch):
    tx, rx = channel
    rt = tiny("qwen2")
    ring = Keyring(tmp_path / "keys")
    ring.create_key("lab")
    team = Team(shared=SHARED, domain="lab", keyring=ring)
    a, _ = agents(rt, team)
    real_send = tx._send
    sent = []

    def tamper(edit):
        def _send(obj, fds=()):
            if "offer" in obj:
                sent.append(json.loads(json.dumps(obj)))
                edit(obj)
            real_send(obj, fds)
        monkeypatch.setattr(tx, "_send", _send)

    tamper(lambda m: m["offer"].update(start=1))  # a field changed after signing
    assert isinstance(exchange(tx, rx, a, agents(rt, team)[1])[1], BadSignatureError)

    def flip_a_token(m):  # the arena's token ids changed after the digest was signed
        tx._out[1][arena.Layout.of(a.fingerprint, m["offer"]["seq_len"]).tokens_at] ^= 1
    tamper(flip_a_token)
    assert isinstance(exchange(tx, rx, a, agents(rt, team)[1])[1], CorruptArtifactError)

    tamper(lambda m: None)
    b = agents(rt, team)[1]
    assert exchange(tx, rx, a, b)[1].used == "full"
    replay = sent[-1]
    t = threading.Thread(target=lambda: real_send(replay))
    t.start()
    with pytest.raises(BadSignatureError, match="replayed"):  # the same signed offer, a second time
        rx.receive(agents(rt, team)[1], timeout=10)
    t.join()


def _unsealed_arena(tx):
    fd = os.memfd_create("unsealed", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
    os.ftruncate(fd, 1 << 20)
    tx._send({"arena": 1 << 20}, fds=[fd])  # no seals: the sender could shrink it under the reader
    os.close(fd)


def _many_descriptors(tx):
    fds = [os.memfd_create(f"extra{i}", os.MFD_CLOEXEC) for i in range(6)]
    tx._send({"arena": 1 << 20}, fds=fds)  # more than the receiver takes: the kernel truncates, it refuses
    for fd in fds:
        os.close(fd)


@pytest.mark.parametrize("hostile, match", [
    (_unsealed_arena, "sealed"),
    (lambda tx: tx._sock.sendmsg([b"\xff not json"]), "JSON"),
    (lambda tx: _many_descriptors(tx), "descriptors"),
    (lambda tx: tx.close(), "closed"),
])
def test_a_peer_that_breaks_the_protocol_gets_the_channel_closed(tiny, channel, hostile, match):
    tx, rx = channel
    w = agents(tiny("qwen2"), Team(shared=SHARED))[1]
    hostile(tx)
    with pytest.raises(ChannelError, match=match):
        rx.receive(w, timeout=10)
    assert rx.closed and w.cache.seq_len == w.context.prefix_len
    with pytest.raises(ChannelError, match="closed"):
        rx.receive(w, timeout=10)


def test_a_malformed_offer_is_refused_and_a_silent_peer_times_out_and_the_channel_goes_on(tiny, channel):
    tx, rx = channel
    rt = tiny("qwen2")
    team = Team(shared=SHARED)
    tx._send({"offer": {"seq": 1}})
    with pytest.raises(ChannelError, match="malformed offer"):
        rx.receive(agents(rt, team)[1], timeout=10)
    refusal, _ = tx._recv(timeout=10)
    assert refusal["refused"]["type"] == "ChannelError"
    with pytest.raises(ChannelError, match="within"):
        rx.receive(agents(rt, team)[1], timeout=0.2)
    a, b = agents(rt, team)
    assert not rx.closed and exchange(tx, rx, a, b)[1].used == "full"


def test_an_offer_larger_than_the_arena_is_refused(tiny, channel):
    tx, rx = channel
    rt = tiny("qwen2")
    team = Team(shared=SHARED)
    a, b = agents(rt, team)
    assert exchange(tx, rx, a, b)[1].used == "full"  # makes and maps the arena
    offer = wire.ShmOffer(seq=2, nonce=tx._peer_nonce, sender_pid=os.getpid(), receiver_pid=os.getpid(),
                         fingerprint=a.fingerprint, prefix=a.prefix, start=0,
                         seq_len=10 ** 6, token_digest="0" * 64, producer={"agent": "x", "domain": team.domain})
    tx._send({"offer": offer.to_dict(), "sig": None})
    with pytest.raises(ChannelError, match="arena bytes"):
        rx.receive(agents(rt, team)[1], timeout=10)


@pytest.mark.skipif(os.getuid() != 0, reason="needs root to run a peer as another user")
def test_a_peer_of_another_user_is_refused():
    import shutil
    import tempfile
    from pathlib import Path

    folder = Path(tempfile.mkdtemp())  # pytest's tmp_path is closed to other users
    sock = folder / "c.sock"
    listener = ShmChannel.listen(sock)
    assert (sock.stat().st_mode & 0o777) == 0o600  # other users cannot even connect ...
    os.chmod(folder, 0o755)
    os.chmod(sock, 0o666)  # ... so open it, to reach the check behind it
    import socket
    import time

    pid = os.fork()
    if pid == 0:  # the peer: another user, socket calls only, then gone
        try:
            os.setuid(65534)
            s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
            s.connect(str(sock))
            time.sleep(5)
        finally:
            os._exit(0)
    try:
        with pytest.raises(ChannelError, match="uid 65534"):
            listener.accept(timeout=10)
    finally:
        os.kill(pid, 9)
        os.waitpid(pid, 0)
        listener.close()
        shutil.rmtree(folder)


def test_the_arena_copy_is_plain_bytes(tiny):
    t = torch.randn(1, 2, 5, 4).to(torch.bfloat16)
    raw = arena.as_bytes(t)
    assert raw.dtype == np.uint8 and raw.size == t.numel() * 2
    back = torch.from_numpy(raw.copy()).view(torch.bfloat16).view(1, 2, 5, 4)
    assert torch.equal(back, t)


def _sealed_arena(size: int) -> int:
    import fcntl

    fd = os.memfd_create("big", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
    os.ftruncate(fd, size)
    fcntl.fcntl(fd, fcntl.F_ADD_SEALS, arena.REQUIRED_SEALS)
    return fd


def test_an_arena_over_the_size_limit_closes_the_channel(tiny, channel, monkeypatch):
    tx, rx = channel
    monkeypatch.setenv("C2C_MAX_ARTIFACT_BYTES", str(1 << 20))
    fd = _sealed_arena(2 << 20)
    tx._send({"arena": 2 << 20}, fds=[fd])
    os.close(fd)
    with pytest.raises(ArtifactTooLargeError):  # refused at mapping, before a byte is read
        rx.receive(agents(tiny("qwen2"), Team(shared=SHARED))[1], timeout=10)
    assert rx.closed


def test_a_sender_refuses_a_cache_over_the_size_limit_before_sending(tiny, channel, monkeypatch):
    tx, rx = channel
    a, _ = agents(tiny("qwen2"), Team(shared=SHARED))
    monkeypatch.setenv("C2C_MAX_ARTIFACT_BYTES", str(1 << 12))
    with pytest.raises(ArtifactTooLargeError):
        tx.send(a, timeout=5)
    assert not tx.closed and tx._out is None  # nothing was sent


def test_token_ids_outside_the_vocabulary_are_refused(tiny, channel, monkeypatch):
    tx, rx = channel
    rt = tiny("qwen2")
    team = Team(shared=SHARED)
    a, b = agents(rt, team)
    real_send = tx._send

    def out_of_vocab(obj, fds=()):
        if "offer" in obj:
            n = obj["offer"]["seq_len"]
            at = arena.Layout.of(a.fingerprint, n).tokens_at
            ids = tx._out[1][at:at + 4 * n].view("<u4")
            ids[-1] = rt.facts.vocab_size + 7
            obj["offer"]["token_digest"] = sha256_hex(ids.tobytes())  # a consistent lie
        real_send(obj, fds)
    monkeypatch.setattr(tx, "_send", out_of_vocab)
    sent, got = exchange(tx, rx, a, b)
    assert isinstance(got, CorruptArtifactError) and "vocabulary" in str(got)
    assert isinstance(sent, CorruptArtifactError) and not rx.closed


def _open_memfds(name: str) -> int:
    n = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            n += os.readlink(f"/proc/self/fd/{fd}").startswith(f"/memfd:{name}")
        except OSError:
            pass
    return n


def test_descriptors_sent_beside_an_offer_are_closed(tiny, channel):
    tx, rx = channel
    rt = tiny("qwen2")
    fd = os.memfd_create("stray-c2c-test", os.MFD_CLOEXEC)
    tx._send({"offer": {"seq": 1}}, fds=[fd])
    os.close(fd)
    assert _open_memfds("stray-c2c-test") == 0  # in flight: held by the socket only
    with pytest.raises(ChannelError, match="malformed offer"):
        rx.receive(agents(rt, Team(shared=SHARED))[1], timeout=10)
    assert _open_memfds("stray-c2c-test") == 0  # the receiver closed the copy it got


def _signed_offer(tx, a, ring, **change):
    fields = dict(seq=tx._seq_out + 1, nonce=tx._peer_nonce, sender_pid=os.getpid(), receiver_pid=tx.peer_pid,
                  fingerprint=a.fingerprint, prefix=a.prefix, start=0, seq_len=a.cache.seq_len,
                  token_digest="0" * 64, producer={"agent": a.name, "domain": "lab"}) | change
    offer = wire.ShmOffer(**fields)
    return {"offer": offer.to_dict(), "sig": wire.sign_offer(offer, ring.signing_key("lab"))}


@pytest.mark.parametrize("change, match", [
    ({"receiver_pid": 1}, "relayed"),             # signed for the process a relay talked to
    ({"nonce": "0" * 64}, "another connection"),  # signed for another connection
    ({"start": 3}, "inside the"),                 # a slice that would overwrite prefix positions
])
def test_a_validly_signed_offer_for_another_channel_or_span_is_refused(tiny, channel, tmp_path, change, match):
    tx, rx = channel
    rt = tiny("qwen2")
    ring = Keyring(tmp_path / "keys")
    ring.create_key("lab")
    team = Team(shared=SHARED, domain="lab", keyring=ring)
    a, b = agents(rt, team)
    assert exchange(tx, rx, a, b)[1].used == "full"  # the arena exists; the signature itself is good
    tx._send(_signed_offer(tx, a, ring, **change))
    with pytest.raises(BadSignatureError if match != "inside the" else CorruptArtifactError, match=match):
        rx.receive(agents(rt, team)[1], timeout=10)


def test_hostile_json_is_a_channel_error(tiny, channel):
    tx, rx = channel
    rt = tiny("qwen2")
    tx._sock.sendmsg([b"[" * 100000])  # nesting that would blow the parser's stack
    with pytest.raises(ChannelError, match="JSON"):
        rx.receive(agents(rt, Team(shared=SHARED))[1], timeout=10)


def test_a_string_that_cannot_be_signed_is_a_channel_error(tiny, channel):
    tx, rx = channel
    rt = tiny("qwen2")
    a, _ = agents(rt, Team(shared=SHARED))
    offer = wire.ShmOffer(seq=1, nonce=tx._peer_nonce, sender_pid=os.getpid(), receiver_pid=tx.peer_pid,
                         fingerprint=a.fingerprint, prefix=a.prefix, start=0, seq_len=3, token_digest="0" * 64,
                         producer={"agent": "\ud800", "domain": "default"})  # a lone surrogate
    tx._sock.sendmsg([json.dumps({"offer": offer.to_dict(), "sig": None}).encode()])
    with pytest.raises(ChannelError, match="valid Unicode"):
        rx.receive(agents(rt, Team(shared=SHARED))[1], timeout=10)


def test_no_answer_or_an_answer_out_of_turn_closes_the_channel(tiny, channel):
    tx, rx = channel
    rt = tiny("qwen2")
    a, _ = agents(rt, Team(shared=SHARED))
    with pytest.raises(ChannelError, match="within"):
        tx.send(a, timeout=0.3)  # nobody receives
    assert tx.closed  # a late ack would be read as the next offer's
    with pytest.raises(ChannelError, match="closed"):
        tx.send(a, timeout=1)


def test_an_answer_where_an_offer_is_due_closes_the_channel(tiny, channel):
    tx, rx = channel
    tx._send({"ack": 1, "seq": 1})
    with pytest.raises(ChannelError, match="expected an offer"):
        rx.receive(agents(tiny("qwen2"), Team(shared=SHARED))[1], timeout=10)
    assert rx.closed
