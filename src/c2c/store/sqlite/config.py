"""The SQLite store's location: ``sqlite:////ABSOLUTE/PATH`` or ``sqlite:///RELATIVE/PATH``, and its options.

The URL follows SQLAlchemy's convention: ``sqlite://`` then ``/`` then the path,
so an absolute path has four slashes (``sqlite:////var/c2c/store``) and three
slashes mean relative to the working directory (``sqlite:///store``). Because
``sqlite:///tmp/x`` reads like ``/tmp/x`` but would mean ``./tmp/x``, a relative
path whose first component is also a top-level directory (``/tmp``, ``/var``,
``/home``, ...) is refused as ambiguous unless written ``sqlite:///./tmp/x``.
``sqlite://HOST/...`` and ``sqlite:PATH`` are refused too.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from urllib.parse import parse_qs

from c2c.errors import ConfigError
from c2c.trust.keys import check_domain


@dataclass(frozen=True, kw_only=True)
class SQLiteConfig:
    """Where, in which trust domain and how durably:
    ``sqlite:////ABS/PATH?domain=research&synchronous=FULL&busy_timeout_s=30``.

    ``sqlite:////abs/dir`` (four slashes) is the absolute ``/abs/dir``; ``sqlite:///rel/dir``
    (three) is ``rel/dir`` under the working directory, refused as ambiguous when ``/rel``
    is an existing top-level directory (write ``sqlite:///./rel/dir`` to mean the relative one).
    """

    root: Path
    synchronous: str = "FULL"       # NOTE: NORMAL survives process crashes but may lose the last commits on power loss
    busy_timeout_s: float = 30.0
    domain: str = "default"

    @classmethod
    def from_url(cls, url: str) -> "SQLiteConfig":
        scheme, _, rest = url.partition(":")
        if scheme.lower() == "sqlite" and rest.startswith("//") and not rest.startswith("///"):
            raise ConfigError(f"{url!r} names a host; a sqlite store is a local directory: write "
                              "sqlite:////ABS/PATH (four slashes) or sqlite:///RELATIVE/PATH (three)")
        if scheme.lower() != "sqlite" or not rest.startswith("///"):
            raise ConfigError(f"{url!r} is not a sqlite:// URL of a local directory: write "
                              "sqlite:////ABS/PATH (four slashes) or sqlite:///RELATIVE/PATH (three)")
        path, _, query = rest[3:].partition("?")
        if not path:
            raise ConfigError(f"{url!r} names no directory; use sqlite:////ABS/PATH or sqlite:///RELATIVE/PATH")
        first = path.split("/", 1)[0]
        if not path.startswith("/") and first not in (".", "..") and not first.startswith("~") \
                and Path("/" + first).is_dir():
            raise ConfigError(f"{url!r} is ambiguous: three slashes mean the relative path {path!r}, but "
                              f"/{first} is also a top-level directory; write sqlite:////{path} for the "
                              f"absolute path or sqlite:///./{path} for a relative one")
        q = {k: v[-1] for k, v in parse_qs(query).items()}
        unknown = set(q) - {"synchronous", "busy_timeout_s", "domain"}
        if unknown:
            raise ConfigError(f"unknown sqlite store options {sorted(unknown)}; known: domain, synchronous, "
                              "busy_timeout_s")
        sync = q.get("synchronous", "FULL").upper()
        if sync not in ("FULL", "NORMAL", "EXTRA"):
            raise ConfigError(f"synchronous={sync!r}; use FULL, EXTRA or NORMAL")
        try:
            timeout = float(q.get("busy_timeout_s", 30.0))
        except ValueError:
            raise ConfigError("busy_timeout_s must be a number of seconds") from None
        return cls(root=Path(path).expanduser(), synchronous=sync, busy_timeout_s=timeout,
                   domain=check_domain(q.get("domain", "default")))

    @property
    def url(self) -> str:
        """A URL that parses back to ``root`` and the domain: ``sqlite:////abs`` or ``sqlite:///./rel``."""
        base = f"sqlite:///{self.root}" if self.root.is_absolute() else f"sqlite:///./{self.root}"
        return base if self.domain == "default" else f"{base}?domain={self.domain}"
