"""`c2c store ...`: the commit store from the shell.

Every command takes ``--store URL`` (default ``$C2C_STORE``, else the embedded
``sqlite:////$C2C_HOME/store``, four slashes: absolute) and ``--domain D`` (the trust domain
to act in), opens that one store and calls one method.
Commit ids may be abbreviated to any unambiguous prefix of 4+ hex characters.
"""

from __future__ import annotations

import argparse
import contextlib
import re
from datetime import datetime, timezone
from pathlib import Path

from c2c.cli.main import add_json_flag, command, emit
from c2c.errors import ConfigError


def register(sub) -> None:
    p = sub.add_parser("store", help="versioned commits of artifacts, their dependencies and invalidation",
                       description="Append-only, content-addressed commits of artifacts on per-agent streams, "
                                   "with a dependency DAG and invalidation. Embedded SQLite by default; "
                                   "redis://HOST:PORT/DB across machines.")
    s = p.add_subparsers(dest="store_command", metavar="ACTION", required=True)

    c = command(s, "put", help="commit an artifact file as the next version of a stream; prints the commit id",
                example="c2c store put notes.c2c --stream analyst --parent 3f2a9c1b", func=_put)
    c.add_argument("file", type=Path, help="artifact file (as written by `c2c export`)")
    c.add_argument("--stream", help="stream (one per agent); default: the artifact's producer agent, else 'default'")
    c.add_argument("--parent", action="append", default=[], metavar="ID",
                   help="a commit this one was derived from, besides those in its header (repeatable)")
    _common(c)

    c = command(s, "show", help="one commit: stream, version, parents, size, and whether it is stale and why",
                example="c2c store show 3f2a9c1b --json", func=_show)
    c.add_argument("id", help="commit id or unambiguous prefix")
    _common(c)

    c = command(s, "get", help="write a commit's artifact to a file (refuses stale commits unless --allow-stale)",
                example="c2c store get 3f2a9c1b --out notes.c2c\nc2c store get 3f2a9c1b --out old.c2c --allow-stale",
                func=_get)
    c.add_argument("id", help="commit id or unambiguous prefix")
    c.add_argument("--out", required=True, type=Path, help="artifact file to write (atomically)")
    c.add_argument("--allow-stale", action="store_true",
                   help="continue on stale context: write it anyway, flagged stale in the output")
    _common(c)

    c = command(s, "log", help="commits newest first, of one stream or all",
                example="c2c store log --stream analyst --limit 20", func=_log)
    c.add_argument("--stream", help="only this stream")
    c.add_argument("--limit", type=int, default=50, help="at most this many commits (default 50)")
    _common(c)

    c = command(s, "deps", help="what a commit is built on, what is built on it, and its hop depth",
                example="c2c store deps 3f2a9c1b --max-hops 3", func=_deps)
    c.add_argument("id", help="commit id or unambiguous prefix")
    c.add_argument("--max-hops", type=int, help="hop limit to judge against (default $C2C_MAX_HOPS or 3)")
    _common(c)

    c = command(s, "invalidate", help="mark a commit and everything built on it stale, and notify subscribers",
                example="c2c store invalidate 3f2a9c1b --reason 'source document was retracted'",
                func=_invalidate)
    c.add_argument("id", help="commit id or unambiguous prefix")
    c.add_argument("--reason", required=True, help="why; shown to every consumer of a dependent")
    _common(c)

    c = command(s, "gc", help="remove expired commits (TTL, keep-last-N) that nothing live depends on",
                example="c2c store gc --ttl 7d --keep-last 10 --dry-run", func=_gc)
    c.add_argument("--ttl", help="expire commits older than this: seconds, or with a unit (90s, 30m, 12h, 7d)")
    c.add_argument("--keep-last", type=int, help="keep only the newest N versions of each stream")
    c.add_argument("--orphan-grace", default="1h",
                   help="remove unreferenced chunks and partial uploads older than this (default 1h)")
    c.add_argument("--dry-run", action="store_true", help="report what would go, change nothing")
    _common(c)

    c = command(s, "verify", help="re-hash every chunk of every commit; exit 1 if any is missing or corrupt",
                example="c2c store verify --json", func=_verify)
    _common(c)

    c = command(s, "graph", help="the dependency DAG as a text tree, and as a PNG with --png",
                example="c2c store graph --png dag.png", func=_graph)
    c.add_argument("--stream", help="only commits connected to this stream")
    c.add_argument("--png", type=Path, help="also draw the DAG into this PNG file")
    _common(c)

    c = command(s, "stats", help="logical bytes, stored bytes and dedup ratio of each trust domain, against its quota",
                example="c2c store stats --json", func=_stats)
    _common(c)

    c = command(s, "quota", help="bound the domain's stored bytes; a put past it fails and writes nothing",
                example="c2c store quota 20GB --domain research\nc2c store quota none --domain research",
                func=_quota)
    c.add_argument("size", help="bytes, with an optional unit (500MB, 20GB, 1TiB), or 'none' to lift the quota")
    _common(c)

    c = command(s, "retention", help="keep only a stream's last N versions, or those younger than a TTL, "
                                     "applied on every put (without --keep-last / --ttl: show it)",
                example="c2c store retention --stream analyst --keep-last 3\n"
                        "c2c store retention --ttl 7d          # the domain's default for every stream\n"
                        "c2c store retention --stream analyst --clear", func=_retention)
    c.add_argument("--stream", help="the stream; default: the domain's default for streams without their own")
    c.add_argument("--keep-last", type=int, help="keep the newest N versions (N >= 1; the head always stays)")
    c.add_argument("--ttl", help="drop versions older than this: seconds, or 90s, 30m, 12h, 7d")
    c.add_argument("--clear", action="store_true", help="remove the stream's (or the default) retention")
    _common(c)

    c = command(s, "events", help="stale events after a cursor, oldest first (what subscribers receive)",
                example="c2c store events --after 0 --wait 5", func=_events)
    c.add_argument("--after", default="0", help="cursor: the seq of the last event already seen (default 0)")
    c.add_argument("--wait", type=float, default=0.0, help="seconds to wait for a first new event")
    c.add_argument("--limit", type=int, default=1000, help="at most this many events")
    _common(c)


def _common(c: argparse.ArgumentParser) -> None:
    c.add_argument("--store", metavar="URL",
                   help="store URL: sqlite:////ABS/PATH (four slashes: absolute), sqlite:///REL/PATH (three: "
                        "relative to the working directory; write sqlite:///./tmp/x when the first part is "
                        "also a top-level dir such as /tmp), or redis://HOST:PORT/DB "
                        "(default $C2C_STORE, else sqlite under $C2C_HOME/store)")
    c.add_argument("--domain", metavar="D",
                   help="the trust domain to act in: each domain's streams, commits and events are its own "
                        "(default: the URL's ?domain=, else 'default'; `c2c serve` keeps each caller's there)")
    add_json_flag(c)


@contextlib.contextmanager
def _open(args: argparse.Namespace):
    from c2c.store import open_store

    with open_store(args.store) as store:
        yield store.in_domain(args.domain) if args.domain else store


def _when(ts: float) -> str:
    return datetime.fromtimestamp(ts, timezone.utc).strftime("%Y-%m-%d %H:%M:%S")


def _duration(text: str, flag: str) -> float:
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([smhd]?)\s*", text or "")
    if not m:
        raise ConfigError(f"{flag} {text!r} is not a duration; use seconds or 90s, 30m, 12h, 7d")
    return float(m.group(1)) * {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400}[m.group(2)]


# ---------------------------------------------------------------------- commands
def _put(args: argparse.Namespace) -> int:
    from c2c.artifact.codec import read_file

    data = read_file(args.file)  # header checked before the tensor region is read
    with _open(args) as store:
        parents = [store.resolve(p) for p in args.parent]
        commit = store.put(data, stream=args.stream, parents=parents)
    emit(args, commit.to_dict(), commit.id)
    return 0


def _get(args: argparse.Namespace) -> int:
    from c2c.artifact import write_atomic

    with _open(args) as store:
        rec = store.get(store.resolve(args.id), allow_stale=args.allow_stale)
    n = write_atomic(args.out, bytes(rec.data))
    info = {"id": rec.id, "path": str(args.out), "bytes": n, "stale": rec.stale, "stale_reason": rec.stale_reason}
    flag = f"  STALE: {rec.stale_reason}" if rec.stale else ""
    emit(args, info, f"wrote {args.out} ({n:,} bytes) from commit {rec.id[:12]}{flag}")
    return 0


def _show(args: argparse.Namespace) -> int:
    with _open(args) as store:
        rec = store.show(store.resolve(args.id))
    c = rec.commit
    lines = [f"commit   {c.id}", f"stream   {c.stream} v{c.version}", f"created  {_when(c.created)} UTC",
             f"size     {c.size:,} bytes in {c.chunks} chunk(s), format {c.format} (manifest {c.blob[:12]})",
             f"model    {c.summary.get('model') or '?'} ({c.summary.get('kind')}, "
             f"tokens {c.summary.get('start')}:{c.summary.get('end')}, {c.summary.get('dtype')})"]
    lines += [f"parent   {p}" for p in c.parents]
    if rec.superseded_by:
        lines.append(f"next     {rec.superseded_by}")
    lines.append(f"stale    {'yes: ' + rec.stale_reason if rec.stale else 'no'}")
    emit(args, rec.to_dict(), "\n".join(lines))
    return 0


def _log(args: argparse.Namespace) -> int:
    with _open(args) as store:
        records = store.log(args.stream, limit=args.limit)
    rows = [f"{'id':<14}{'stream':<18}{'ver':>5}  {'created (UTC)':<21}{'bytes':>12}  stale"]
    rows += [f"{r.id[:12]:<14}{r.commit.stream[:17]:<18}{r.commit.version:>5}  {_when(r.commit.created):<21}"
             f"{r.commit.size:>12,}  {'STALE' if r.stale else '-'}" for r in records]
    emit(args, [r.to_dict() for r in records], "\n".join(rows) if records else "(no commits)")
    return 0


def _deps(args: argparse.Namespace) -> int:
    from c2c.store import Graph

    with _open(args) as store:
        deps = Graph.load(store).deps(store.resolve(args.id), max_hops=args.max_hops)
    h = deps.hops
    lines = [f"commit      {deps.commit}",
             f"parents     {', '.join(p[:12] for p in deps.parents) or '-'}",
             f"children    {', '.join(c[:12] for c in deps.children) or '-'}",
             f"ancestors   {len(deps.ancestors)}   dependents {len(deps.dependents)}",
             f"hop depth   {h.depth} (limit {h.max_hops}){'  EXCEEDED: hand over text' if h.exceeded else ''}"]
    if h.exceeded:
        lines.append(h.fallback_text())
    emit(args, deps.to_dict(), "\n".join(lines))
    return 0


def _invalidate(args: argparse.Namespace) -> int:
    with _open(args) as store:
        events = store.invalidate(store.resolve(args.id), reason=args.reason)
    text = (f"{len(events)} commit(s) marked stale:\n" + "\n".join(f"  {e.commit[:12]}  {e.reason}" for e in events)
            if events else "already stale; nothing changed")
    emit(args, [e.to_dict() for e in events], text)
    return 0


def _gc(args: argparse.Namespace) -> int:
    from c2c.store import GCPolicy, collect

    policy = GCPolicy(ttl_s=_duration(args.ttl, "--ttl") if args.ttl else None, keep_last=args.keep_last,
                      orphan_grace_s=_duration(args.orphan_grace, "--orphan-grace"), dry_run=args.dry_run)
    with _open(args) as store:
        report = collect(store, policy)
    verb = "would remove" if report.dry_run else "removed"
    text = (f"{verb} {len(report.removed)} commit(s); kept {len(report.kept_for_dependents)} expired commit(s) "
            f"that live commits depend on; {report.orphans_removed} orphaned chunk(s) removed")
    emit(args, report.to_dict(), text)
    return 0


def _verify(args: argparse.Namespace) -> int:
    with _open(args) as store:
        problems = store.verify()
        total = len(store.log())
    text = "\n".join(f"{p.commit[:12]}  {p.problem}" for p in problems) if problems else \
        f"all {total} commit(s) intact, every chunk re-hashed"
    emit(args, {"commits": total, "problems": [{"commit": p.commit, "problem": p.problem} for p in problems]}, text)
    return 1 if problems else 0


def _graph(args: argparse.Namespace) -> int:
    from c2c.store import Graph

    with _open(args) as store:
        graph = Graph.load(store, stream=args.stream)
    text = graph.text()
    if args.png:
        text += f"\n\nwrote {graph.png(args.png)}"
    data = {"commits": [r.to_dict() for r in graph.records.values()],
            "png": str(args.png) if args.png else None}
    emit(args, data, text)
    return 0


_UNITS = {"": 1, "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
          "kib": 1 << 10, "mib": 1 << 20, "gib": 1 << 30, "tib": 1 << 40}


def _size(text: str) -> int | None:
    if text.strip().lower() == "none":
        return None
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*", text or "")
    if not m or m.group(2).lower() not in _UNITS:
        raise ConfigError(f"quota {text!r} is not a size; use bytes or 500MB, 20GB, 1TiB, or 'none'")
    return int(float(m.group(1)) * _UNITS[m.group(2).lower()])


def _bytes(n: int | None) -> str:
    if n is None:
        return "-"
    for unit, size in (("GB", 10**9), ("MB", 10**6), ("kB", 10**3)):
        if n >= size:
            return f"{n / size:,.1f} {unit}"
    return f"{n} B"


def _stats(args: argparse.Namespace) -> int:
    with _open(args) as store:
        stats = store.stats()
    rows = [f"{'domain':<24}{'commits':>8}{'logical':>12}{'stored':>12}{'dedup':>7}{'quota':>12}{'used':>7}"]
    for d in (*stats.domains, stats.total):
        used = f"{d.stored_bytes / d.quota_bytes:.0%}" if d.quota_bytes else "-"
        rows.append(f"{d.domain[:23]:<24}{d.commits:>8}{_bytes(d.logical_bytes):>12}{_bytes(d.stored_bytes):>12}"
                    f"{d.dedup_ratio:>6.2f}x{_bytes(d.quota_bytes):>12}{used:>7}")
    if stats.partial:
        rows.append("(some domains could not be read with these credentials)")
    emit(args, stats.to_dict(), "\n".join(rows))
    return 0


def _quota(args: argparse.Namespace) -> int:
    quota = _size(args.size)
    with _open(args) as store:
        store.set_quota(quota)
        usage = store.usage()
    emit(args, usage.to_dict(), f"domain {usage.domain}: quota {_bytes(usage.quota_bytes)}, "
                                f"{_bytes(usage.stored_bytes)} stored")
    return 0


def _retention(args: argparse.Namespace) -> int:
    ttl = _duration(args.ttl, "--ttl") if args.ttl else None
    with _open(args) as store:
        if args.clear or args.keep_last is not None or ttl is not None:
            store.set_retention(args.stream, keep_last=None if args.clear else args.keep_last,
                                ttl_s=None if args.clear else ttl)
        own = store.retention(args.stream)
    what = f"stream {args.stream}" if args.stream else "the domain's default"
    text = (f"{what}: keep last {own.keep_last or '-'}, ttl {own.ttl_s if own.ttl_s is not None else '-'} s"
            if own.active else f"{what}: no retention (versions stay until `c2c store gc`)")
    emit(args, {"stream": args.stream, **own.to_dict()}, text)
    return 0


def _events(args: argparse.Namespace) -> int:
    with _open(args) as store:
        events = store.events(args.after, limit=args.limit, wait_s=args.wait)
    text = "\n".join(f"{e.seq}  {e.commit[:12]}  {e.reason}" for e in events) if events else "(no new events)"
    emit(args, [e.to_dict() for e in events], text)
    return 0
