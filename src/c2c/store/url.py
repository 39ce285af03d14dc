"""`open_store(url)`: pick a backend by URL scheme.

=========================  ==============================================
``sqlite:////ABS/PATH``    :class:`~c2c.store.sqlite.backend.SQLiteStore`, the embedded default
``sqlite:///REL/PATH``     the same, relative to the working directory
``redis://HOST:PORT/DB``   :class:`~c2c.store.redis.backend.RedisStore`
``rediss://...``           the same over TLS
``redis://...?cluster=1``  the same on a Redis Cluster (database 0), from any node
=========================  ==============================================

Redis URLs take c2c's options in the query string (``domain``, ``cluster``,
``connect_timeout_s``, ``socket_timeout_s``, ``chunk_mb``, ...; see
:mod:`c2c.store.redis`), e.g. ``redis://10.0.0.5:7000/0?domain=research&cluster=1``.

SQLite URLs follow SQLAlchemy: ``sqlite://``, a ``/``, then the path, so four
slashes make an absolute path (``sqlite:////var/c2c/store``) and three a relative
one. ``sqlite:///tmp/x`` looks absolute but is not, so a three-slash path whose
first component is also a top-level directory (``/tmp``, ``/var``, ``/home``, ...)
is refused: write ``sqlite:////tmp/x`` for the absolute path or
``sqlite:///./tmp/x`` for a relative one. ``sqlite://HOST/...`` and
``sqlite:PATH`` (no slashes) are refused as well.

With no URL, ``C2C_STORE`` is used, else the absolute ``$C2C_HOME/store`` (a four-slash URL).
"""

from __future__ import annotations

from c2c.errors import ConfigError
from c2c.config import c2c_home, settings
from c2c.store.interface import Store

ENV = "C2C_STORE"


def default_url() -> str:
    """The embedded store under ``C2C_HOME``, as an absolute four-slash URL (``sqlite:////...``)."""
    # An absolute path starts with "/", so "sqlite:///" + it has four slashes and parses back to it.
    return f"sqlite:///{(c2c_home() / 'store').absolute()}"


def store_url(url: str | None = None) -> str:
    """``url``, else ``$C2C_STORE``, else :func:`default_url`."""
    return url or settings().store_url or default_url()


def open_store(url: str | None = None) -> Store:
    """Open (creating if needed) the store at ``url``; see the module docstring for schemes."""
    url = store_url(url)
    scheme = url.split(":", 1)[0].lower() if ":" in url else ""
    if scheme == "sqlite":
        from c2c.store.sqlite.backend import SQLiteStore  # lazy: only the backend the URL names is imported

        return SQLiteStore.from_url(url)
    if scheme in ("redis", "rediss"):
        try:
            from c2c.store.redis.backend import RedisStore  # lazy: redis-py is an extra
        except ImportError as e:
            raise ConfigError(f"the Redis store needs redis-py ({e}); install it with `pip install 'c2c[redis]'`"
                              ) from None

        return RedisStore.from_url(url)
    raise ConfigError(f"unknown store URL {url!r}; use sqlite:///PATH (sqlite:////ABS/PATH when absolute), "
                      "redis://HOST:PORT/DB or rediss://...")
