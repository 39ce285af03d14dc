"""RedisStore specifics: URL options, chunk keys, expiring uploads, TLS (rediss://), the layout-1 migration."""

from __future__ import annotations

import datetime
import ipaddress

import pytest
from store_helpers import RedisServer, chunk_location, make_artifact
from store_helpers import artifact_bytes, sized_artifact_bytes

from c2c.artifact import Artifact
from c2c.artifact.chunks import CHUNK_TOKENS
from c2c.errors import ChunkCorruptError, ConfigError
from c2c.store import open_store
from c2c.store.manifest import Manifest
from c2c.store.redis.backend import _s
from c2c.store.redis.config import RedisConfig, key_prefix


def test_url_options_are_ours_and_the_rest_goes_to_redis_py():
    cfg = RedisConfig.from_url("redis://u:secret@10.0.0.5:6380/2?domain=team-a&chunk_mb=2&socket_timeout=3")
    assert (cfg.domain, cfg.chunk_bytes) == ("team-a", 2 << 20)
    assert cfg.connection_url == "redis://u:secret@10.0.0.5:6380/2?socket_timeout=3"
    assert "secret" not in cfg.url and cfg.url == "redis://u@10.0.0.5:6380/2?domain=team-a"
    assert RedisConfig.from_url("rediss://h:1/0").connection_url.startswith("rediss://")
    assert RedisConfig.from_url("redis://h").domain == "default"
    for bad in ("redis://h/0?domain=bad domain", "redis://h/0?chunk_mb=x", "redis://h/0?chunk_mb=1000",
                "http://h/0", "redis:///nohost"):
        with pytest.raises(ConfigError):
            RedisConfig.from_url(bad)
    assert key_prefix("team-a") == "c2c:{team-a}:"  # one Redis Cluster hash slot per domain
    cfg = RedisConfig.from_url("redis://h:7000/0?cluster=1&connect_timeout_s=0.5&socket_timeout_s=2")
    assert (cfg.cluster, cfg.connect_timeout_s, cfg.socket_timeout_s) == (True, 0.5, 2.0)
    assert cfg.connection_url == "redis://h:7000/0" and cfg.url.endswith("&cluster=1")
    defaults = RedisConfig.from_url("redis://h")
    assert (defaults.cluster, defaults.connect_timeout_s, defaults.socket_timeout_s) == (False, 5.0, 10.0)
    for bad in ("redis://h/0?cluster=maybe", "redis://h/3?cluster=1", "redis://h/0?connect_timeout_s=soon",
                "redis://h/0?socket_timeout_s=0", "redis://h/0?connect_timeout_s=-1"):
        with pytest.raises(ConfigError):
            RedisConfig.from_url(bad)


@pytest.mark.redis
def test_chunks_are_keys_of_the_domain_and_uploads_expire(redis_server):
    # #33: a commit is kept as its artifact's chunks (one key each, under the domain's hash tag), not as a blob
    store = open_store(redis_server.url())
    data = sized_artifact_bytes(1, 1 << 20)
    c = store.put(data, stream="s")
    fetched = store.fetch(c.id)
    digests = [ref.digest for ref in fetched.manifest.chunks]
    assert c.chunks == len(digests) == -(-Artifact.decode(data).header.seq_len // CHUNK_TOKENS) > 1
    keys = sorted(_s(k) for k in store._r.scan_iter(match=f"{store.prefix}chunk:*"))
    assert keys == sorted(f"{store.prefix}chunk:{d}" for d in digests)
    assert all(k.startswith("c2c:{") and store._r.ttl(k) == -1 for k in keys)
    assert store._r.hgetall(f"{store.prefix}refs") == {d.encode(): b"1" for d in digests}
    assert store.get(c.id).data == data and fetched.record.data == data
    # an upload that never got committed (writer died) expires on its own
    art = make_artifact(2)
    m = Manifest.for_put(memoryview(art.encode()), art.header, piece_bytes=1 << 20)
    which = store._upload("deadbeef", memoryview(art.encode()), m, range(len(m.chunks)))
    ttls = [store._r.ttl(f"{store.prefix}up:deadbeef:{i}") for i in which]
    assert ttls and all(0 < t <= store.config.upload_ttl_s for t in ttls)
    assert store.log() and len(store.log()) == 1


@pytest.fixture
def tls_server(tmp_path):
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "c2c-test")])
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(hours=2))
            .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
                           critical=False)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .sign(key, hashes.SHA256()))
    cert_path, key_path = tmp_path / "cert.pem", tmp_path / "key.pem"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    server = RedisServer(tmp_path / "redis", tls=(cert_path, key_path))
    try:
        server.start()
    except RuntimeError as e:
        pytest.skip(f"this redis-server cannot serve TLS: {e}")
    yield server
    server.stop()


@pytest.mark.redis
def test_rediss_works_end_to_end(tls_server):
    url = tls_server.url()
    assert url.startswith("rediss://")
    store = open_store(url)
    a = store.put(artifact_bytes(1), stream="a")
    data = artifact_bytes(2)
    b = store.put(data, stream="b", parents=[a.id])
    assert store.get(b.id).data == data
    assert [e.commit for e in store.invalidate(a.id, reason="tls check")] == [a.id, b.id]


@pytest.mark.redis
def test_both_blob_read_paths_verify_what_they_read(redis_server, monkeypatch):
    from c2c.errors import StoreCorruptError

    store = open_store(redis_server.url(chunk_mb=0.25))
    assert store._direct_reads  # c2c.store.redis.resp by default; the pipelined path follows cluster redirects
    data = sized_artifact_bytes(3, 600_000)
    c = store.put(data, stream="s")
    for direct in (True, False):
        monkeypatch.setattr(store, "_direct_reads", direct)
        assert store.get(c.id).data == data
    key = chunk_location(store, c, 1)
    store._r.append(key, b"x")  # a chunk grew: longer than recorded
    for direct in (True, False):
        monkeypatch.setattr(store, "_direct_reads", direct)
        with pytest.raises(ChunkCorruptError, match="wrong size"):
            store.get(c.id)
    store._r.setrange(key, 0, b"\xff")  # the right size again, one byte changed
    store._r.set(key, store._r.get(key)[:-1])
    for direct in (True, False):
        monkeypatch.setattr(store, "_direct_reads", direct)
        with pytest.raises(ChunkCorruptError, match=r"chunk 1 \(tokens 64\.\.127\) of commit .* does not hash"):
            store.get(c.id)
    store._r.delete(key)
    for direct in (True, False):
        monkeypatch.setattr(store, "_direct_reads", direct)
        with pytest.raises(StoreCorruptError, match="chunk 1 of commit .* is missing"):
            store.get(c.id)
    monkeypatch.undo()
    assert store.show(c.id).commit == c  # the connection is still usable after a failed read


@pytest.mark.redis
def test_a_redis_py_without_the_internals_resp_reads_fails_loudly(redis_server, monkeypatch):
    import redis

    from c2c.errors import StoreError
    from c2c.store.redis import resp

    class NoSock(redis.Connection):  # a redis-py whose connections keep their socket elsewhere
        def __init__(self, **kw):
            super().__init__(**kw)
            del self._sock

    class NoSend(redis.Connection):
        send_packed_command = None

    for cls, missing in ((NoSock, r"Connection\._sock"), (NoSend, r"Connection\.send_packed_command")):
        client = redis.Redis(connection_pool=redis.ConnectionPool(host="127.0.0.1", port=redis_server.port,
                                                                  connection_class=cls))
        with pytest.raises(StoreError, match=rf"redis-py's {missing}, which redis-py \S+ does not have; "
                                             r"install .*redis>=8\.1,<9"):
            resp.require(client)
    resp.require(redis_server.client())  # this redis-py has them all

    def refuse(client):
        raise StoreError("c2c.store.redis.resp reads blobs through redis-py's X")

    monkeypatch.setattr(resp, "require", refuse)  # the store checks at open, before any read
    with pytest.raises(StoreError, match="redis-py's X"):
        open_store(redis_server.url())


def _as_layout_1(store) -> None:
    """Rewrite a domain of format-1 commits as layout 1 kept it: each commit's artifact in ``blob:<sha>:<i>``
    pieces (sha: of the whole artifact), the hash's ``chunks`` field their count; no refs, usage or heads."""
    import hashlib
    import json

    r, p = store._r, store.prefix
    for cid in (_s(c) for c in r.zrange(f"{p}all", 0, -1)):
        pieces = json.loads(r.hget(f"{p}c:{cid}", "chunks"))
        parts = [r.get(f"{p}chunk:{d}") for d, _, _ in pieces]
        blob = hashlib.sha256(b"".join(parts)).hexdigest()
        for i, part in enumerate(parts):
            r.set(f"{p}blob:{blob}:{i}", part)
        r.hset(f"{p}c:{cid}", mapping={"blob": blob, "chunks": len(parts)})
        r.hdel(f"{p}c:{cid}", "format", "nchunks")
    for key in [*r.scan_iter(match=f"{p}chunk:*"), f"{p}refs", f"{p}usage", f"{p}layout"]:
        r.delete(key)


def test_a_layout_1_domain_is_migrated_to_chunks_on_open(redis_url):
    from c2c.testing.synthetic import as_version_1

    url = redis_url(chunk_mb=0.0625)
    store = open_store(url)
    old = {s: as_version_1(make_artifact(s, seq=64, kv_heads=4, head_dim=64)) for s in (1, 2)}  # 5 pieces each
    a = store.put(old[1], stream="a")
    b = store.put(old[2], stream="a", parents=[a.id])
    _as_layout_1(store)
    assert not list(store._r.scan_iter(match=f"{store.prefix}chunk:*"))
    fresh = open_store(url)  # the first handle on the domain migrates it
    assert _s(fresh._r.get(f"{fresh.prefix}layout")) == "2"
    for c, data in ((a, old[1]), (b, old[2])):
        rec = fresh.get(c.id, allow_stale=True)
        assert rec.commit.format == 1 and rec.commit.chunks == -(-len(data) // 65536) > 1
        assert len(rec.data) == len(data) and rec.data == data
    assert fresh.show(a.id).stale and fresh.children(a.id) == (b.id,) and fresh.verify() == []
    assert not list(fresh._r.scan_iter(match=f"{fresh.prefix}blob:*"))
    u = fresh.usage()
    assert (u.commits, u.logical_bytes, u.stored_bytes) == (2, len(old[1]) + len(old[2]), len(old[1]) + len(old[2]))
    assert fresh.delete_leaf(b.id) and fresh.usage().stored_bytes == len(old[1])
    assert open_store(url).get(a.id, allow_stale=True).data == old[1]  # migrated once; opening again is a no-op
