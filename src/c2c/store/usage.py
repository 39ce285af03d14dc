"""What each trust domain keeps in a store, against its byte quota.

- **logical bytes**: the artifact bytes of every commit, as ``get`` returns them;
- **stored bytes**: what the store keeps for them: every chunk once (commits that
  share a token prefix share its chunks) and every commit's head;
- **dedup ratio**: logical over stored.

A domain's quota bounds its stored bytes. A put that would take them past it
fails with :class:`~c2c.errors.QuotaExceededError` and writes nothing; the quota
counts what is stored when the put arrives (a stream's retention runs after the
put, so leave room for one version more than it keeps).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from c2c.errors import ConfigError, QuotaExceededError

MAX_QUOTA_BYTES = 1 << 60


@dataclass(frozen=True, kw_only=True)
class DomainUsage:
    """One trust domain's part of a store."""

    domain: str
    commits: int
    logical_bytes: int
    stored_bytes: int
    chunks: int
    quota_bytes: int | None = None

    @property
    def dedup_ratio(self) -> float:
        """Logical bytes per stored byte (1.0 for an empty domain)."""
        return self.logical_bytes / self.stored_bytes if self.stored_bytes else 1.0

    def to_dict(self) -> dict[str, Any]:
        return {"domain": self.domain, "commits": self.commits, "logical_bytes": self.logical_bytes,
                "stored_bytes": self.stored_bytes, "chunks": self.chunks, "dedup_ratio": round(self.dedup_ratio, 4),
                "quota_bytes": self.quota_bytes,
                "quota_used": None if not self.quota_bytes else round(self.stored_bytes / self.quota_bytes, 4)}


@dataclass(frozen=True, kw_only=True)
class StoreStats:
    """Every trust domain of a store this handle can see.

    Attributes:
        url: the store.
        domains: per domain, sorted by name.
        partial: True when some domains could not be listed (a Redis user limited to its own domain).
    """

    url: str
    domains: tuple[DomainUsage, ...]
    partial: bool = False

    @property
    def total(self) -> DomainUsage:
        return DomainUsage(domain="*", commits=sum(d.commits for d in self.domains),
                           logical_bytes=sum(d.logical_bytes for d in self.domains),
                           stored_bytes=sum(d.stored_bytes for d in self.domains),
                           chunks=sum(d.chunks for d in self.domains))

    def to_dict(self) -> dict[str, Any]:
        return {"url": self.url, "partial": self.partial, "total": self.total.to_dict(),
                "domains": [d.to_dict() for d in self.domains]}


def check_quota_value(max_bytes: int | None) -> int | None:
    """A quota as stored: None (no quota) or 0 to :data:`MAX_QUOTA_BYTES` bytes."""
    if max_bytes is None:
        return None
    if isinstance(max_bytes, bool) or not isinstance(max_bytes, int) or not 0 <= max_bytes <= MAX_QUOTA_BYTES:
        raise ConfigError(f"quota {str(max_bytes)[:40]!r}: give a number of bytes from 0 to {MAX_QUOTA_BYTES}, "
                          "or None for no quota")
    return max_bytes


def check_quota(domain: str, quota: int | None, stored: int, adding: int) -> None:
    """Raise :class:`QuotaExceededError` when ``adding`` bytes would take ``stored`` past ``quota``."""
    if quota is not None and stored + adding > quota:
        raise QuotaExceededError(
            f"trust domain {domain!r} stores {stored:,} bytes of its {quota:,}-byte quota; this put needs "
            f"{adding:,} more (what it shares with stored commits not counted). Nothing was written: collect old "
            "versions (`c2c store gc`, or a stream retention), or raise the quota",
            domain=domain, quota_bytes=quota, stored_bytes=stored, adding_bytes=adding)
