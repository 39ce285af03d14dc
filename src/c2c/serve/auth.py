"""Bearer tokens: who is calling, and in which trust domain.

A tokens file maps each token to the agent it belongs to and that agent's trust
domain::

    {"tok-analyst-3f9a...": {"agent": "analyst", "domain": "research"},
     "tok-writer-77c1...":  {"agent": "writer",  "domain": "research"}}

It must be readable by its owner only (``chmod 600``), like a key file. Without
one, the server is open: every caller is agent ``"default"`` in domain
``"default"`` (the loopback default).

Tokens are kept as sha256 digests and compared with :func:`hmac.compare_digest`
against every entry, so the time taken does not depend on where, or whether, a
token matched. Tokens are never logged nor put in an error message.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import re
from dataclasses import dataclass
from pathlib import Path

from c2c.errors import AuthError, ConfigError
from c2c._io import read_private
from c2c.trust.keys import check_domain

_AGENT = re.compile(r"[A-Za-z0-9][A-Za-z0-9._@+=-]{0,63}")
_MAX_FILE = 1 << 20
OPEN_DOMAIN = "default"


@dataclass(frozen=True, kw_only=True)
class Principal:
    """The caller of one request."""

    agent: str
    domain: str


OPEN = Principal(agent="default", domain=OPEN_DOMAIN)


class TokenTable:
    """Known tokens (as digests) and the principal each stands for; ``TokenTable.open()`` admits anyone."""

    def __init__(self, entries: dict[bytes, Principal] | None):
        self._entries = entries  # None: open access

    @classmethod
    def open(cls) -> "TokenTable":
        return cls(None)

    @classmethod
    def load(cls, path: str | Path) -> "TokenTable":
        """Read a tokens file (see the module docstring).

        Raises:
            ConfigError: the file is missing, readable by others, or malformed.
        """
        path = Path(path).expanduser()
        data = read_private(path, _MAX_FILE, error=ConfigError, what="tokens file")
        try:
            raw = json.loads(data)
        except ValueError as e:
            raise ConfigError(f"{path} is not JSON: {e}") from None
        if not isinstance(raw, dict) or not raw:
            raise ConfigError(f"{path}: expected a non-empty object {{token: {{\"agent\": A, \"domain\": D}}}}")
        entries: dict[bytes, Principal] = {}
        for i, (token, who) in enumerate(raw.items()):
            where = f"{path}: entry {i + 1}"  # never the token itself
            if not isinstance(token, str) or len(token) < 16:
                raise ConfigError(f"{where}: a token must be a string of at least 16 characters")
            if not isinstance(who, dict) or set(who) != {"agent", "domain"}:
                raise ConfigError(f"{where}: give exactly {{\"agent\": ..., \"domain\": ...}}")
            if not isinstance(who["agent"], str) or not _AGENT.fullmatch(who["agent"]):
                raise ConfigError(f"{where}: agent {who['agent']!r} must be 1-64 of A-Z a-z 0-9 . _ @ + = -")
            entries[_digest(token)] = Principal(agent=who["agent"], domain=check_domain(who["domain"]))
        return cls(entries)

    @property
    def is_open(self) -> bool:
        return self._entries is None

    @property
    def domains(self) -> tuple[str, ...]:
        return (OPEN_DOMAIN,) if self._entries is None else tuple(sorted({p.domain for p in self._entries.values()}))

    def authenticate(self, authorization: str | None) -> Principal:
        """The principal of an ``Authorization`` header value.

        Raises:
            AuthError: no ``Bearer`` token, or an unknown one (only when tokens are configured).
        """
        if self._entries is None:
            return OPEN
        scheme, _, token = (authorization or "").partition(" ")
        token = token.strip()
        if scheme.lower() != "bearer" or not token:
            raise AuthError("missing bearer token: send `Authorization: Bearer TOKEN` "
                            "(the openai client's api_key)")
        presented = _digest(token)
        found = None
        for digest, principal in self._entries.items():  # all of them, whatever matches
            if hmac.compare_digest(digest, presented):
                found = principal
        if found is None:
            raise AuthError("unknown bearer token; ask the server's operator for one")
        return found


def _digest(token: str) -> bytes:
    return hashlib.sha256(token.encode("utf-8", "surrogatepass")).digest()
