"""RedisStore specifics: URL options, chunked blobs, expiring uploads, TLS (rediss://)."""

from __future__ import annotations

import datetime
import ipaddress

import pytest
from store_helpers import RedisServer
from store_helpers import artifact_bytes, sized_artifact_bytes

from c2c.errors import ConfigError
from c2c.store import open_store
from c2c.store.redis_config import RedisConfig, key_prefix


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
def test_blobs_are_chunked_and_uploads_expire(redis_server):
    store = open_store(redis_server.url(chunk_mb=0.25))
    data = sized_artifact_bytes(1, 1 << 20)
    c = store.put(data, stream="s")
    chunks = sorted(store._r.scan_iter(match=f"{store.prefix}blob:{c.blob}:*"))
    assert len(chunks) == -(-len(data) // (256 << 10)) and all(store._r.ttl(k) == -1 for k in chunks)
    assert store.get(c.id).data == data
    # an upload that never got committed (writer died) expires on its own
    n = store._upload("deadbeef", memoryview(artifact_bytes(2)))
    ttls = [store._r.ttl(f"{store.prefix}up:deadbeef:{i}") for i in range(n)]
    assert all(0 < t <= store.config.upload_ttl_s for t in ttls)
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
    assert store._direct_reads  # c2c.store.resp by default; the pipelined path follows cluster redirects
    data = sized_artifact_bytes(3, 600_000)
    c = store.put(data, stream="s")
    for direct in (True, False):
        monkeypatch.setattr(store, "_direct_reads", direct)
        assert store.get(c.id).data == data
    key = f"{store.prefix}blob:{c.blob}:1"
    store._r.append(key, b"x")  # a chunk grew: the blob is longer than recorded
    for direct in (True, False):
        monkeypatch.setattr(store, "_direct_reads", direct)
        with pytest.raises(StoreCorruptError):
            store.get(c.id)
    store._r.delete(key)
    for direct in (True, False):
        monkeypatch.setattr(store, "_direct_reads", direct)
        with pytest.raises(StoreCorruptError, match="lost chunk"):
            store.get(c.id)
    monkeypatch.undo()
    assert store.show(c.id).commit == c  # the connection is still usable after a failed read


@pytest.mark.redis
def test_a_redis_py_without_the_internals_resp_reads_fails_loudly(redis_server, monkeypatch):
    import redis

    from c2c.errors import StoreError
    from c2c.store import resp

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
        raise StoreError("c2c.store.resp reads blobs through redis-py's X")

    monkeypatch.setattr(resp, "require", refuse)  # the store checks at open, before any read
    with pytest.raises(StoreError, match="redis-py's X"):
        open_store(redis_server.url())
