"""`open_store(url)`: pick a backend by URL scheme.

=====================  ==============================================
``sqlite:///PATH``     :class:`~c2c.store.sqlite.SQLiteStore`, the embedded default
``redis://HOST:PORT/DB``  :class:`~c2c.store.redis.RedisStore`
``rediss://...``       the same over TLS
=====================  ==============================================

With no URL, ``C2C_STORE`` is used, else ``sqlite:///$C2C_HOME/store``.
"""

from __future__ import annotations

import os

from c2c.errors import ConfigError
from c2c.home import c2c_home
from c2c.store.base import Store

ENV = "C2C_STORE"


def default_url() -> str:
    """The embedded store under ``C2C_HOME``."""
    return f"sqlite:///{c2c_home() / 'store'}"


def store_url(url: str | None = None) -> str:
    """``url``, else ``$C2C_STORE``, else :func:`default_url`."""
    return url or os.environ.get(ENV) or default_url()


def open_store(url: str | None = None) -> Store:
    """Open (creating if needed) the store at ``url``; see the module docstring for schemes."""
    url = store_url(url)
    scheme = url.split(":", 1)[0].lower() if ":" in url else ""
    if scheme == "sqlite":
        from c2c.store.sqlite import SQLiteStore

        return SQLiteStore.from_url(url)
    if scheme in ("redis", "rediss"):
        from c2c.store.redis import RedisStore

        return RedisStore.from_url(url)
    raise ConfigError(f"unknown store URL {url!r}; use sqlite:///PATH, redis://HOST:PORT/DB or rediss://...")
