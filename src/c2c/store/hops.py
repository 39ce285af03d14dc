"""Hop limits: a cache built on a cache built on a cache... degrades to text.

Every hop of cache handoff adds drift and widens what a stale source can
spoil (MISSION §2.4), so a team caps the number of hops. A commit's *depth* is
the number of edges on the longest chain of parents above it (a commit with no
parents is at depth 0; A -> B -> C -> D puts D at depth 3). Beyond ``max_hops``
the consumer should hand over text instead, citing the commits it came from by
id so the provenance survives the fallback.

Only cache edges are hops. A parent that was read as *text* (its message
re-prefilled, not its K/V imported) carries no drift into the child, so it does
not add to the child's depth; it stays a parent, for provenance and for
invalidation. A producer names such parents in its header's label
:data:`TEXT_PARENTS` (their indexes in ``parents``, comma-separated).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

from c2c.config import settings
from c2c.errors import StoreCorruptError
from c2c.store.interface import CommitId, Store, check_id

ENV = "C2C_MAX_HOPS"
DEFAULT_MAX_HOPS = 3
TEXT_PARENTS = "text_parents"   # header label: indexes of the parents that were read as text


def text_parents_label(parents: Sequence[str], via_text: Sequence[str]) -> dict[str, str]:
    """The header label naming which of ``parents`` were read as text (``{}`` when none were)."""
    skip = set(via_text)
    idx = [str(i) for i, p in enumerate(parents) if p in skip]
    return {TEXT_PARENTS: ",".join(idx)} if idx else {}


def cache_parents(commit) -> tuple[CommitId, ...]:
    """The parents whose K/V ``commit``'s cache extends: all but those its :data:`TEXT_PARENTS` label names."""
    raw = ((commit.summary or {}).get("labels") or {}).get(TEXT_PARENTS, "")
    skip = {int(i) for i in raw.split(",") if i.isdigit()} if isinstance(raw, str) else set()
    return tuple(p for i, p in enumerate(commit.parents) if i not in skip)


def default_max_hops() -> int:
    """``$C2C_MAX_HOPS``, else 3: the one hop limit, shared with handoffs (``HandoffPolicy.hop_limit``)."""
    return settings().max_hops


@dataclass(frozen=True, kw_only=True)
class HopReport:
    """How deep a commit sits in its dependency chain, and what to cite when falling back to text.

    Attributes:
        commit: the commit asked about.
        depth: edges on the longest chain of parents above it.
        max_hops: the limit it was judged against.
        chain: that longest chain, root first, ending with ``commit``.
        refs: the ids a text fallback cites: ``commit`` and every ancestor, nearest first.
    """

    commit: CommitId
    depth: int
    max_hops: int
    chain: tuple[CommitId, ...]
    refs: tuple[CommitId, ...]

    @property
    def exceeded(self) -> bool:
        """True when the chain is deeper than the limit: hand over text instead of the cache."""
        return self.depth > self.max_hops

    def fallback_text(self) -> str:
        """One line to put in a text handoff in place of the cache."""
        refs = ", ".join(f"c2c:{r[:12]}" for r in self.refs)
        return (f"[c2c: this context passed through {self.depth} cache hops (limit {self.max_hops}); "
                f"handed over as text. Sources: {refs}]")

    def to_dict(self) -> dict:
        return {"commit": self.commit, "depth": self.depth, "max_hops": self.max_hops, "exceeded": self.exceeded,
                "chain": list(self.chain), "refs": list(self.refs)}


def hop_report_from(commit_id: str, parents_of: Callable[[str], Sequence[str]], max_hops: int, *,
                    hop_parents_of: Callable[[str], Sequence[str]] | None = None) -> HopReport:
    """:class:`HopReport` over any parent lookup (a store, a loaded graph).

    ``hop_parents_of`` (default: ``parents_of``) gives the parents reached by a cache edge,
    a subset of ``parents_of``: depth and chain follow those; ``refs`` cite every ancestor.
    """
    hop_parents_of = hop_parents_of or parents_of
    cid = check_id(commit_id)
    # Breadth-first over ancestors: each one's distance (for "nearest first") and its parents.
    parents: dict[str, tuple[str, ...]] = {}
    hop_parents: dict[str, tuple[str, ...]] = {}
    distance = {cid: 0}
    frontier = [cid]
    while frontier:
        nxt = []
        for node in frontier:
            parents[node] = tuple(parents_of(node))
            hop_parents[node] = tuple(p for p in hop_parents_of(node) if p in parents[node])
            for p in parents[node]:
                if p not in distance:
                    distance[p] = distance[node] + 1
                    nxt.append(p)
        frontier = nxt
    # Longest chain: depth(n) = 1 + max depth(parent), settled farthest ancestors first.
    depth: dict[str, tuple[int, str | None]] = {}
    pending = sorted(distance, key=lambda n: -distance[n])
    while pending:
        waiting = []
        for node in pending:
            if all(p in depth for p in parents[node]):
                depth[node] = max(((depth[p][0] + 1, p) for p in hop_parents[node]), default=(0, None))
            else:
                waiting.append(node)
        if len(waiting) == len(pending):
            raise StoreCorruptError(f"the parents of {cid[:12]} form a cycle; the store is damaged")
        pending = waiting
    chain = [cid]
    while depth[chain[-1]][1] is not None:
        chain.append(depth[chain[-1]][1])
    nearest = sorted((a for a in distance if a != cid), key=lambda a: (distance[a], a))
    return HopReport(commit=cid, depth=depth[cid][0], max_hops=max_hops,
                     chain=tuple(CommitId(c) for c in reversed(chain)),
                     refs=(cid, *(CommitId(a) for a in nearest)))


def hop_report(store: Store, commit_id: str, *, max_hops: int | None = None) -> HopReport:
    """Depth of ``commit_id``, whether it exceeds ``max_hops`` (default ``$C2C_MAX_HOPS`` or 3), and refs."""
    limit = default_max_hops() if max_hops is None else max_hops
    commits: dict = {}

    def commit(c: str):
        if c not in commits:
            commits[c] = store.show(c).commit
        return commits[c]

    return hop_report_from(commit_id, lambda c: commit(c).parents, limit,
                           hop_parents_of=lambda c: cache_parents(commit(c)))
