"""Redis ACL users per trust domain: a domain's user cannot touch another domain's keys."""

from __future__ import annotations

import pytest
import redis
from store_helpers import artifact_bytes

from c2c.errors import ConfigError, StoreError, StoreWriteError
from c2c.store import open_store
from c2c.store.acl import create_domain_user, drop_domain_user

pytestmark = pytest.mark.redis


@pytest.fixture
def domains(redis_server):
    admin = redis_server.url(domain="admin")
    urls = {d: create_domain_user(admin, d, f"{d}-password-0123456789") for d in ("team-a", "team-b")}
    yield urls
    for d in urls:
        drop_domain_user(admin, d)


def test_a_domain_user_cannot_read_another_domains_keys(domains):
    store_a, store_b = open_store(domains["team-a"]), open_store(domains["team-b"])
    ca = store_a.put(artifact_bytes(1), stream="x")
    cb = store_b.put(artifact_bytes(2), stream="x")
    assert store_a.get(ca.id).data and store_b.get(cb.id).data  # each works in its own domain

    raw_b = redis.Redis.from_url(domains["team-b"].split("?")[0])
    chunk = store_a._load(ca.id)[2][0][0]  # a chunk of team-a's commit (#33: no whole blobs any more)
    for key in (f"c2c:{{team-a}}:c:{ca.id}", f"c2c:{{team-a}}:chunk:{chunk}"):
        with pytest.raises(redis.exceptions.NoPermissionError):
            raw_b.get(key) if ":chunk:" in key else raw_b.hgetall(key)
    with pytest.raises(redis.exceptions.NoPermissionError):
        raw_b.xread({"c2c:{team-a}:events": "0"})
    for dangerous in (raw_b.flushall, lambda: raw_b.keys("*"), lambda: raw_b.config_get("*")):
        with pytest.raises(redis.exceptions.NoPermissionError):
            dangerous()

    # team-b's credentials pointed at team-a's domain: refused, nothing written
    b_as_a = open_store(domains["team-b"].replace("domain=team-b", "domain=team-a"))
    with pytest.raises(StoreError, match="may not"):
        b_as_a.get(ca.id)
    with pytest.raises(StoreWriteError, match="may not"):
        b_as_a.put(artifact_bytes(3), stream="x")
    assert [r.id for r in store_a.log()] == [ca.id]


def test_domain_user_needs_a_real_password(redis_server):
    with pytest.raises(ConfigError):
        create_domain_user(redis_server.url(), "team-c", "short")
    with pytest.raises(ConfigError):
        create_domain_user(redis_server.url(), "bad domain", "x" * 20)
