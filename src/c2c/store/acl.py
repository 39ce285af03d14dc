"""Redis ACL users per trust domain: a domain's user can touch only its own keys.

C2C is used inside one trust domain (MISSION §2.3). On a shared Redis each
domain's agents connect as that domain's user, whose ACL allows only keys under
``c2c:{<domain>}:`` (see :func:`c2c.store.redis.config.key_prefix`), so one domain's
agents cannot read another's caches even on the same server.
"""

from __future__ import annotations

from urllib.parse import quote, urlparse, urlunparse

import redis

from c2c.errors import ConfigError, StoreError
from c2c.store.redis.config import key_prefix


def domain_username(domain: str) -> str:
    key_prefix(domain)
    return f"c2c-{domain}"


def create_domain_user(admin_url: str, domain: str, password: str) -> str:
    """Create (or reset) the ACL user of ``domain``; returns the store URL to hand its agents.

    The user may run any non-dangerous command (no FLUSHALL, KEYS, CONFIG, ...),
    on keys and channels under the domain's prefix only.

    Args:
        admin_url: a ``redis://`` URL of a user allowed to run ``ACL SETUSER``.
        domain: the trust domain (``A-Z a-z 0-9 _ -``).
        password: the new user's password (at least 16 characters).
    """
    if len(password) < 16:
        raise ConfigError("use a password of at least 16 characters for a domain's redis user")
    prefix = key_prefix(domain)
    user = domain_username(domain)
    try:
        with redis.Redis.from_url(admin_url.split("?", 1)[0]) as r:
            r.execute_command("ACL", "SETUSER", user, "reset", "on", f">{password}", f"~{prefix}*",
                              f"&{prefix}*", "+@all", "-@dangerous", "-@admin")
    except redis.exceptions.RedisError as e:
        raise StoreError(f"could not create redis user {user}: {e}") from e
    u = urlparse(admin_url)
    netloc = f"{quote(user, safe='')}:{quote(password, safe='')}@{u.hostname}:{u.port or 6379}"
    return urlunparse(u._replace(netloc=netloc, query=f"domain={domain}"))


def drop_domain_user(admin_url: str, domain: str) -> None:
    """Delete the ACL user of ``domain`` (its keys stay)."""
    try:
        with redis.Redis.from_url(admin_url.split("?", 1)[0]) as r:
            r.execute_command("ACL", "DELUSER", domain_username(domain))
    except redis.exceptions.RedisError as e:
        raise StoreError(f"could not delete the redis user of domain {domain}: {e}") from e
