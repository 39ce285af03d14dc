"""The dependency DAG of a store: as a text tree, as a PNG, and for dependency queries.

:meth:`Graph.load` takes one snapshot of every commit (``Store.log()``); the
rest is pure and works offline on that snapshot.
"""

from __future__ import annotations

import io
from dataclasses import dataclass
from pathlib import Path

from c2c import _io
from c2c.errors import CommitNotFoundError, StoreWriteError
from c2c.store.interface import CommitId, CommitRecord, Store, check_id
from c2c.store.hops import HopReport, cache_parents, default_max_hops, hop_report_from


@dataclass(frozen=True, kw_only=True)
class Deps:
    """What a commit is built on and what is built on it."""

    commit: CommitId
    parents: tuple[CommitId, ...]
    children: tuple[CommitId, ...]
    ancestors: tuple[CommitId, ...]     # transitive, nearest first
    dependents: tuple[CommitId, ...]    # transitive, nearest first
    hops: HopReport

    def to_dict(self) -> dict:
        return {"commit": self.commit, "parents": list(self.parents), "children": list(self.children),
                "ancestors": list(self.ancestors), "dependents": list(self.dependents), "hops": self.hops.to_dict()}


@dataclass(frozen=True, kw_only=True)
class Graph:
    """Every commit of a store and its edges, oldest first."""

    records: dict[CommitId, CommitRecord]
    children: dict[CommitId, tuple[CommitId, ...]]

    @classmethod
    def load(cls, store: Store, *, stream: str | None = None) -> "Graph":
        """Snapshot ``store``; with ``stream``, only that stream's commits and everything connected to them."""
        records = {r.id: r for r in reversed(store.log())}
        kids: dict[CommitId, list[CommitId]] = {cid: [] for cid in records}
        for r in records.values():
            for p in r.commit.parents:
                kids.setdefault(p, []).append(r.id)
        graph = cls(records=records, children={k: tuple(v) for k, v in kids.items()})
        if stream is None:
            return graph
        keep: set[CommitId] = set()
        for r in records.values():
            if r.commit.stream == stream:
                keep |= {r.id, *graph._walk(r.id, up=True), *graph._walk(r.id, up=False)}
        return cls(records={k: v for k, v in records.items() if k in keep},
                   children={k: tuple(c for c in v if c in keep) for k, v in graph.children.items() if k in keep})

    # ---------------------------------------------------------------- queries
    def _parents(self, cid: str) -> tuple[CommitId, ...]:
        return tuple(p for p in self.records[cid].commit.parents if p in self.records)

    def _hop_parents(self, cid: str) -> tuple[CommitId, ...]:
        return tuple(p for p in cache_parents(self.records[cid].commit) if p in self.records)

    def _walk(self, cid: str, *, up: bool) -> list[CommitId]:
        """Transitive parents (``up``) or children, breadth first, nearest first."""
        out: list[CommitId] = []
        seen = {cid}
        frontier = [cid]
        while frontier:
            nxt = []
            for node in frontier:
                for n in (self._parents(node) if up else self.children.get(node, ())):
                    if n not in seen:
                        seen.add(n)
                        out.append(n)
                        nxt.append(n)
            frontier = nxt
        return out

    def deps(self, commit_id: str, *, max_hops: int | None = None) -> Deps:
        cid = check_id(commit_id)
        if cid not in self.records:

            raise CommitNotFoundError(f"no commit {cid[:12]} in this graph")
        limit = default_max_hops() if max_hops is None else max_hops
        return Deps(commit=cid, parents=self._parents(cid), children=self.children.get(cid, ()),
                    ancestors=tuple(self._walk(cid, up=True)), dependents=tuple(self._walk(cid, up=False)),
                    hops=hop_report_from(cid, self._parents, limit, hop_parents_of=self._hop_parents))

    def roots(self) -> list[CommitId]:
        return [cid for cid in self.records if not self._parents(cid)]

    def depths(self) -> dict[CommitId, int]:
        """Cache-hop depth of every commit (records are oldest first, so parents come first)."""
        depth: dict[CommitId, int] = {}
        for cid in self.records:
            depth[cid] = max((depth.get(p, 0) + 1 for p in self._hop_parents(cid)), default=0)
        return depth

    # -------------------------------------------------------------- rendering
    def label(self, cid: str) -> str:
        r = self.records[cid]
        state = f"  STALE: {r.stale_reason}" if r.stale else ""
        return f"{cid[:12]}  {r.commit.stream} v{r.commit.version}{state}"

    def text(self) -> str:
        """The DAG as a tree from each root; a commit with several parents is drawn once, then referenced."""
        if not self.records:
            return "(empty store)"
        lines: list[str] = []
        drawn: set[str] = set()

        def draw(cid: str, lead: str, last: bool | None) -> None:
            branch = "" if last is None else ("└── " if last else "├── ")
            if cid in drawn:
                lines.append(f"{lead}{branch}{cid[:12]}  (shown above)")
                return
            drawn.add(cid)
            lines.append(f"{lead}{branch}{self.label(cid)}")
            below = lead if last is None else lead + ("    " if last else "│   ")
            kids = self.children.get(cid, ())
            for i, k in enumerate(kids):
                draw(k, below, i == len(kids) - 1)

        for root in self.roots():
            draw(root, "", None)
        return "\n".join(lines)

    def png(self, path: str | Path, *, title: str = "c2c store: dependency DAG") -> Path:
        """Draw the DAG left to right by depth (fresh green, stale red) into a PNG. Uses Agg only.

        The file is written atomically, mode 0600 (a missing folder is made 0700): the
        stream names and stale reasons it shows are no more public than the store.

        Raises:
            StoreWriteError: the PNG could not be written; no partial file is left.
        """
        from matplotlib.backends.backend_agg import FigureCanvasAgg  # lazy: matplotlib is the optional `plot` extra
        from matplotlib.figure import Figure  # lazy: matplotlib is the optional `plot` extra

        path = Path(path)
        depth = self.depths()
        layers: dict[int, list[CommitId]] = {}
        for cid in self.records:
            layers.setdefault(depth[cid], []).append(cid)
        pos = {cid: (d, -i) for d, ids in layers.items() for i, cid in enumerate(ids)}
        width = max(4.0, 2.6 * (len(layers) or 1))
        height = max(2.5, 0.7 * max((len(v) for v in layers.values()), default=1) + 1)
        fig = Figure(figsize=(width, height))
        FigureCanvasAgg(fig)
        ax = fig.add_subplot()
        for cid, (x, y) in pos.items():
            for k in self.children.get(cid, ()):
                if k in pos:
                    kx, ky = pos[k]
                    ax.annotate("", xy=(kx - 0.12, ky), xytext=(x + 0.12, y),
                                arrowprops={"arrowstyle": "->", "color": "0.5", "lw": 0.8})
        for cid, (x, y) in pos.items():
            r = self.records[cid]
            ax.text(x, y, f"{r.commit.stream} v{r.commit.version}\n{cid[:8]}", ha="center", va="center",
                    fontsize=7, bbox={"boxstyle": "round", "fc": "#f4c7c3" if r.stale else "#c8e6c9", "ec": "0.4"})
        ax.set_xlim(-0.6, max(layers, default=0) + 0.6)
        ax.set_ylim(min((y for _, y in pos.values()), default=0) - 0.6, 0.6)
        ax.set_xlabel("hops from a root (longest chain)")
        ax.set_yticks([])
        ax.set_xticks(sorted(layers))
        ax.set_title(title + "  (red = stale)")
        fig.tight_layout()
        png = io.BytesIO()
        fig.savefig(png, format="png", dpi=110)
        try:
            _io.private_dir(path.parent, error=StoreWriteError)
        except OSError as e:
            raise StoreWriteError(f"cannot create {path.parent}: {e.strerror or e}; nothing was written") from e
        _io.write_atomic(path, png.getbuffer(), error=StoreWriteError)
        return path
