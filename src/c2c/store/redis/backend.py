"""`RedisStore`: a store shared across processes and machines, ``redis://HOST:PORT/DB``.

The URL and its options (domain, cluster, timeouts, ...): :class:`~c2c.store.redis.config.RedisConfig`.

Metadata is in hashes, each chunk of a commit (:mod:`c2c.store.manifest`) is a string
``chunk:<digest>`` with a reference count in the domain's ``refs`` hash (under the
domain's hash tag, so on its one cluster slot), and stale events go to a Redis Stream
that a consumer reads from its last cursor (key layout: :mod:`c2c.store.redis.lua`).

A put asks which of its chunks the domain lacks, uploads those under a temporary
token (each expires on its own after ``upload_ttl_s``), then one Lua script checks
the parents and the quota, adopts the uploaded chunks and counts a reference to each
chunk, all at once. A writer killed mid-upload leaves only expiring chunks; nothing
is visible, and nothing is counted, until the script ran. Older layouts migrate on
open (:mod:`c2c.store.redis.layout`).

An invalidation (and the supersession a put causes) marks the dependents in
steps of at most :data:`WALK_BATCH` commits, one short script each, so a big
DAG never blocks the server for long (see :mod:`c2c.store.redis.lua`). The call
returns once every dependent is stale; until then a dependent not yet reached
still reads as fresh, and a commit put under one meanwhile ends stale too.

NOTE: an acknowledged put is as durable as the server's persistence: run
redis-server with ``appendonly yes`` and ``appendfsync always`` for "acknowledged
means on disk"; ``everysec`` can lose the last second if the server host dies.
Keep ``maxmemory-policy noeviction`` (the default): an evicting policy would drop
chunks, which reads then report as :class:`ChunkMissingError`. When memory runs
out, puts fail with :class:`StoreWriteError` and leave nothing behind.
"""

from __future__ import annotations

import copy
import json
import re
import time
import uuid
from contextlib import contextmanager
from dataclasses import replace
from typing import Iterator, Sequence

import redis
import redis.cluster
from redis.backoff import ExponentialBackoff
from redis.retry import Retry

from c2c.errors import CommitNotFoundError, ConfigError, StoreError, StoreWriteError
from c2c.store.redis import lua as redis_lua, resp
from c2c.store.gc import Retention, retain_after_put
from c2c.store.ingest import prepare_put
from c2c.store.interface import (BlobDigest, Commit, CommitId, CommitRecord, StaleEvent, Store, check_id,
                                 check_reason, check_stream, invalidated_reason)
from c2c.store.redis.chunks import drop_upload, read_chunks, upload
from c2c.store.redis.config import RedisConfig, key_prefix
from c2c.store.redis.layout import check_issued, ensure_layout
from c2c.store.usage import DomainUsage, StoreStats, check_quota, check_quota_value
from c2c.trust.keys import check_domain

_CURSOR = re.compile(r"[0-9]{1,20}(-[0-9]{1,20})?")  # a stream id, MS-SEQ (or MS alone), each part a uint64
_MAX_ROWS = 1 << 62  # a larger count means "all" (Redis parses counts as 64-bit integers)
_FIELDS = ("stream", "version", "parents", "blob", "size", "created", "summary", "format", "nchunks",
           "stale_reason", "stale_chain", "superseded_by")
WALK_BATCH = 500    # commits one invalidation step (one script run) marks at most
WALK_LEASE_S = 30   # a walk whose walker made no step for this long is finished by the next write
_RETRIES = 1000     # script runs that may be told "read again" in a row (each means another writer got on)


class RedisStore(Store):
    """A store in one Redis database and trust domain. Thread-safe (redis-py pools connections)."""

    def __init__(self, config: RedisConfig):
        self.config = config
        self.url = config.url
        self.domain = config.domain
        self.prefix = key_prefix(config.domain)
        self._owner = True
        self._direct_reads = True  # blobs via c2c.store.redis.resp; the pipelined path stays for redirects (and tests)
        # a refused or reset connection (a restarting server) is retried twice; a timeout is not,
        # so a silent server fails after one socket_timeout_s
        retry = Retry(ExponentialBackoff(cap=0.5, base=0.05), 2,
                      supported_errors=(redis.exceptions.ConnectionError,))
        options = dict(socket_read_size=1 << 20, socket_connect_timeout=config.connect_timeout_s,
                       socket_timeout=config.socket_timeout_s, retry=retry)
        with self._errors(writing=False):
            try:
                if config.cluster:  # NOTE: connects at once, to learn the slot map
                    self._r = redis.cluster.RedisCluster.from_url(config.connection_url, **options)
                else:
                    self._r = redis.Redis.from_url(config.connection_url, **options)
            except ValueError as e:
                raise ConfigError(f"bad redis URL {self.url}: {e}") from None
            self._r.ping()
            resp.require(self._plain_client(self._ckey("0")))
        self._put = self._r.register_script(redis_lua.PUT)
        self._invalidate = self._r.register_script(redis_lua.INVALIDATE)
        self._step = self._r.register_script(redis_lua.STEP)
        self._delete_leaf = self._r.register_script(redis_lua.DELETE_LEAF)
        self._migrate = self._r.register_script(redis_lua.MIGRATE)
        self._laid_out: set[str] = set()  # domains known to be in LAYOUT, shared with every in_domain view
        ensure_layout(self)

    @classmethod
    def from_url(cls, url: str) -> "RedisStore":
        return cls(RedisConfig.from_url(url))

    def close(self) -> None:
        if self._owner:
            self._r.close()

    def in_domain(self, domain: str) -> "RedisStore":
        if domain == self.domain:
            return self
        view = copy.copy(self)  # the same connection pool and scripts; another key prefix
        view.config = replace(self.config, domain=domain)
        view.url, view.domain, view.prefix, view._owner = view.config.url, domain, key_prefix(domain), False
        ensure_layout(view)
        return view

    def grant(self, commit_id: str, domains: Sequence[str]) -> None:
        cid = check_id(commit_id)
        targets = sorted({check_domain(d) for d in domains} - {self.domain})
        self._hash(cid)  # this domain's own commit
        with self._errors(writing=True):
            for d in targets:  # one key per domain: each write stays in its domain's hash slot
                self._r.hset(f"{key_prefix(d)}granted", cid, self.domain)

    def granted(self, commit_id: str) -> str | None:
        cid = check_id(commit_id)
        with self._errors(writing=False):
            owner = self._r.hget(f"{self.prefix}granted", cid)
        return None if owner is None else _s(owner)

    # ------------------------------------------------------------ redis plumbing
    @contextmanager
    def _errors(self, *, writing: bool) -> Iterator[None]:
        """Turn redis-py exceptions into StoreWriteError (writes) or StoreError (reads)."""
        err = StoreWriteError if writing else StoreError
        tail = "; nothing was committed" if writing else ""
        try:
            yield
        except redis.exceptions.NoPermissionError as e:
            raise err(f"the redis user may not do this in domain {self.config.domain!r} ({e}); "
                      f"use that domain's user{tail}") from e
        except redis.exceptions.AuthenticationError as e:
            raise StoreError(f"redis at {self.url} refused the credentials: {e}") from e
        except (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError,
                redis.exceptions.RedisClusterException) as e:
            # NOTE: a reply lost mid-commit leaves the outcome unknown; a put is idempotent, so say to retry
            lost = "; put it again (an artifact never commits twice)" if writing else ""
            cfg = self.config
            if isinstance(e, redis.exceptions.TimeoutError):
                what = (f"did not answer within socket_timeout_s={cfg.socket_timeout_s:g} s (or connect within "
                        f"connect_timeout_s={cfg.connect_timeout_s:g} s)")
            else:
                what = "is unreachable"
            raise err(f"redis at {self.url} {what} ({e}){lost}. Check that redis-server runs at "
                      f"{cfg.address}{' as a cluster' if cfg.cluster else ''} and that this host can reach it "
                      "(firewall, rediss:// for TLS); raise connect_timeout_s / socket_timeout_s in the store "
                      "URL for a slow link") from e
        except redis.exceptions.ResponseError as e:
            if "OOM" in str(e) or "maxmemory" in str(e):
                raise err(f"redis at {self.url} is out of memory (maxmemory){tail}") from e
            raise err(f"redis at {self.url} refused: {e}{tail}") from e
        except redis.exceptions.RedisError as e:
            raise err(f"redis at {self.url} failed: {type(e).__name__}: {e}{tail}") from e

    def _ckey(self, cid: str) -> str:
        return f"{self.prefix}c:{cid}"

    def _kids_key(self, cid: str) -> str:
        return f"{self.prefix}kids:{cid}"

    def _args(self, *rest) -> list:
        return [self.config.max_events, WALK_LEASE_S, *rest]

    def _plain_client(self, key: str) -> redis.Redis:
        """The single-server client that holds ``key``: ours, or on a cluster the node of its slot."""
        if isinstance(self._r, redis.cluster.RedisCluster):
            return self._r.get_redis_connection(self._r.get_node_from_key(key))
        return self._r

    @staticmethod
    def _record(cid: str, values: list) -> CommitRecord:
        """A record from the :data:`_FIELDS` of its hash, in order (HMGET)."""
        s = {k: v.decode() for k, v in zip(_FIELDS, values) if v is not None}
        commit = Commit(id=CommitId(cid), stream=s["stream"], version=int(s["version"]),
                        parents=tuple(CommitId(p) for p in json.loads(s["parents"])), blob=BlobDigest(s["blob"]),
                        size=int(s["size"]), created=float(s["created"]), summary=json.loads(s["summary"]),
                        format=int(s["format"]), chunks=int(s["nchunks"]))
        return CommitRecord(commit=commit, stale="stale_reason" in s, stale_reason=s.get("stale_reason"),
                            stale_chain=tuple(json.loads(s["stale_chain"])) if "stale_chain" in s else (),
                            superseded_by=CommitId(s["superseded_by"]) if "superseded_by" in s else None)

    @staticmethod
    def _events(raw) -> list[StaleEvent]:
        return [StaleEvent(seq=_s(eid), commit=CommitId(_s(c)), root=CommitId(_s(r)), reason=_s(why),
                           chain=tuple(json.loads(_s(ch))), at=float(_s(at))) for eid, c, r, why, ch, at in raw]

    # ------------------------------------------------------------------- chunks
    def _upload(self, token: str, view: memoryview, manifest, which) -> list[int]:
        return upload(self, token, view, manifest, which)

    def _read_chunks(self, manifest, indices: list[int], out: memoryview, commit_id: str) -> int:
        return read_chunks(self, manifest, indices, out, commit_id)

    def _plan(self, cid: str, manifest) -> list[int]:
        """The chunks of ``manifest`` this domain lacks (first index of each); QuotaExceededError
        (nothing written yet) when storing them would pass the domain's quota."""
        p = self.prefix
        with self._errors(writing=True):
            if self._r.exists(self._ckey(cid)):
                return []  # putting it again changes nothing
            have: set[str] = set()
            digests = list(manifest.distinct()) if manifest.format == 2 else []
            if digests:
                found = self._r.hmget(f"{p}refs", digests)
                have = {d for d, r in zip(digests, found) if r is not None}
            quota, stored = self._r.get(f"{p}quota"), self._r.hget(f"{p}usage", "stored")
        which, adding = manifest.to_write(have)
        check_quota(self.domain, None if quota is None else int(quota), int(stored or 0), adding)
        return which

    def _load(self, commit_id: CommitId) -> tuple[CommitRecord, bytes, list]:
        with self._errors(writing=False):
            pipe = self._r.pipeline(transaction=False)
            pipe.hmget(self._ckey(commit_id), [*_FIELDS, "chunks"])
            pipe.get(f"{self.prefix}head:{commit_id}")
            values, head = pipe.execute()
        if values[0] is None:
            raise CommitNotFoundError(f"no commit {commit_id[:12]} in store {self.url}")
        return self._record(commit_id, values[:-1]), head or b"", json.loads(values[-1])

    # ------------------------------------------------------------------- writing
    def put(self, data, *, stream: str | None = None, parents: Sequence[str] = ()) -> Commit:
        token = uuid.uuid4().hex
        ing, uploaded, stream, all_parents = prepare_put(
            data, stream=stream, parents=parents, plan=self._plan,
            stage=lambda view, manifest, which: self._upload(token, view, manifest, which),
            discard=lambda which: drop_upload(self, token, which), piece_bytes=self.config.chunk_bytes)
        view = memoryview(data).cast("B")
        m = ing.manifest
        distinct = []  # (digest, size, uses, first index) in chunk order
        first: dict[str, int] = {}
        for i, c in enumerate(m.chunks):
            if c.digest not in first:
                first[c.digest] = len(distinct)
                distinct.append([c.digest, c.size, 0, i])
            distinct[first[c.digest]][2] += 1
        uploaded = set(uploaded)
        for _ in range(_RETRIES):
            res = self._commit(ing, stream, all_parents, token, distinct)
            code = int(res[0])
            if code != -2:
                break
            j = int(res[1])  # collected since the plan: upload it too, and commit again
            i = distinct[j][3]
            self._upload(token, view, m, [i])
            uploaded.add(i)
        else:
            drop_upload(self, token, uploaded)
            raise StoreWriteError(f"the chunks of {ing.id[:12]} kept being collected while it was put; nothing "
                                  "was committed, put it again")
        if code == 0:  # already committed (by an earlier put whose reply was lost, say)
            try:
                return self.show(ing.id).commit
            except StoreError as e:
                raise StoreWriteError(f"{ing.id[:12]} is already committed but could not be read back ({e}); "
                                      "put it again") from e
        if code == -1:
            raise CommitNotFoundError(f"parent {_s(res[1])[:12]} is not in store {self.url}; put it first")
        if code == -4:
            check_quota(self.domain, int(res[2]), int(res[1]), int(res[3]))  # raises QuotaExceededError
        commit = Commit(id=ing.id, stream=stream, version=int(res[1]), parents=all_parents, blob=ing.blob,
                        size=ing.size, created=float(_s(res[2])), summary=ing.summary, format=m.format,
                        chunks=len(m.chunks))
        superseded = _s(res[4])
        try:
            if superseded:
                self._walk(superseded)
            self._finish_abandoned(res[5])
        except StoreError as e:
            raise StoreWriteError(
                f"commit {ing.id[:12]} is stored as {stream} v{commit.version}, but marking the dependents of "
                f"the version it superseded ({superseded[:12] or '-'}) stale was interrupted ({e}); the next "
                f"write after {WALK_LEASE_S} s finishes that, or store.invalidate(old id, ...) does now") from e
        retain_after_put(self, commit)
        return commit

    def _commit(self, ing, stream: str, parents: tuple[str, ...], token: str, distinct: list) -> list:
        """Run the PUT script, naming the stream head it read; read again while other puts move the head."""
        p, m = self.prefix, ing.manifest
        with self._errors(writing=True):
            top = self._head(stream)
            for _ in range(_RETRIES):
                keys = [self._ckey(ing.id), f"{p}s:{stream}", f"{p}seq", f"{p}all", f"{p}ids", f"{p}streams",
                        f"{p}events", f"{p}walks"]
                if top:
                    keys += [self._ckey(top), f"{p}walk:{top}"]
                for parent in parents:
                    keys += [self._ckey(parent), self._kids_key(parent)]
                keys += [f"{p}refs", f"{p}usage", f"{p}quota", f"{p}head:{ing.id}"]
                keys += [f"{p}chunk:{d}" for d, _, _, _ in distinct]
                keys += [f"{p}up:{token}:{i}" for _, _, _, i in distinct]
                res = self._put(keys=keys, args=self._args(
                    ing.id, stream, ing.blob, ing.size, m.format, json.dumps(list(parents)),
                    json.dumps(ing.summary, sort_keys=True), top, json.dumps(m.stored()), m.head,
                    json.dumps([[size, uses] for _, size, uses, _ in distinct])))
                if int(res[0]) != -3:
                    return res
                top = _s(res[1])
        drop_upload(self, token, [i for _, _, _, i in distinct])
        raise StoreWriteError(f"stream {stream} took {_RETRIES} new versions from other writers while this put "
                              "waited; nothing was committed, put it again")

    def _head(self, stream: str) -> str:
        top = self._r.zrevrange(f"{self.prefix}s:{stream}", 0, 0)
        return _s(top[0]) if top else ""

    def invalidate(self, commit_id: str, *, reason: str) -> list[StaleEvent]:
        cid = check_id(commit_id)
        cause = invalidated_reason(check_reason(reason))
        p = self.prefix
        with self._errors(writing=True):
            res = self._invalidate(keys=[self._ckey(cid), f"{p}events", f"{p}walks", f"{p}walk:{cid}"],
                                   args=self._args(cid, cause))
        if int(res[0]) == -1:
            raise CommitNotFoundError(f"no commit {cid[:12]} in store {self.url}")
        events = self._events(res[1])
        try:
            if int(res[2]):  # a walk below cid is to do: ours, or one left unfinished (then it was stale already)
                events += self._walk(cid)
            self._finish_abandoned(res[3])
        except StoreError as e:
            raise StoreWriteError(f"{cid[:12]} is marked stale, but marking its dependents was interrupted ({e}); "
                                  f"invalidate {cid[:12]} again to finish (its first cause is kept), or the next "
                                  f"write after {WALK_LEASE_S} s does") from e
        return events

    # -------------------------------------------------------------- the walk
    def _walk(self, root: str) -> list[StaleEvent]:
        """Run the walk below ``root`` (see :mod:`c2c.store.redis.lua`) until its list is empty.

        Each round reads the first :data:`WALK_BATCH` entries and one SSCAN page of each entry's
        children, then marks them in script runs of at most :data:`WALK_BATCH` children each.
        Returns the events of the commits this call marked.
        """
        p = self.prefix
        walk_key = f"{p}walk:{root}"
        events: list[StaleEvent] = []
        retries, rounds = 0, 0
        with self._errors(writing=True):
            while True:
                raw = [_s(e) for e in self._r.lrange(walk_key, 0, WALK_BATCH - 1)]
                if not raw:
                    if rounds == 0:  # finished by a helper, or a lease left without a list: drop it
                        self._step(keys=[walk_key, f"{p}walks", f"{p}events", self._ckey(root)],
                                   args=self._args(root, 0, 0, ""))
                    return events
                rounds += 1
                entries = [json.loads(e) for e in raw]
                if entries[0][2] != "0":  # the first is mid-SSCAN, so this round ends with it: read it alone
                    raw, entries = raw[:1], entries[:1]
                pipe = self._r.pipeline(transaction=False)
                for e in entries:
                    pipe.sscan(self._kids_key(e[0]), cursor=int(e[2]), count=WALK_BATCH)
                pages = pipe.execute()
                for first, end, npop, newhead, kids in _plan(entries, pages):
                    keys = [walk_key, f"{p}walks", f"{p}events", self._ckey(root)]
                    keys += [self._ckey(k) for k, _ in kids]
                    args = self._args(root, end - first, npop, newhead, *raw[first:end])
                    for k, i in kids:
                        args += [k, i - first + 1]
                    res = self._step(keys=keys, args=args)
                    if int(res[0]) == -3:  # another walker moved the list: read it again
                        retries += 1
                        if retries > _RETRIES:
                            raise StoreWriteError(f"the invalidation walk below {root[:12]} kept changing under "
                                                  "this client; invalidate it again")
                        break
                    retries = 0
                    events += self._events(res[1])
                    if int(res[2]) == 0:  # the list is empty: every dependent is stale
                        return events

    def _finish_abandoned(self, roots) -> None:
        """Finish walks whose walker stopped making steps (killed, or lost its connection)."""
        for root in roots:
            self._walk(_s(root))

    # ------------------------------------------------------------------- reading
    def _hash(self, cid: str) -> list:
        """The commit's :data:`_FIELDS`; CommitNotFoundError when there is none."""
        with self._errors(writing=False):
            h = self._r.hmget(self._ckey(cid), _FIELDS)
        if h[0] is None:
            raise CommitNotFoundError(f"no commit {cid[:12]} in store {self.url}")
        return h

    def show(self, commit_id: str) -> CommitRecord:
        cid = check_id(commit_id)
        return self._record(cid, self._hash(cid))

    def latest(self, stream: str) -> CommitRecord:
        check_stream(stream)
        with self._errors(writing=False):
            top = self._r.zrevrange(f"{self.prefix}s:{stream}", 0, 0)
        if not top:
            raise CommitNotFoundError(f"stream {stream!r} has no commits in store {self.url}")
        return self.show(_s(top[0]))

    def log(self, stream: str | None = None, *, limit: int | None = None) -> list[CommitRecord]:
        key = f"{self.prefix}all" if stream is None else f"{self.prefix}s:{check_stream(stream)}"
        if limit is not None and limit <= 0:
            return []
        end = -1 if limit is None else min(int(limit), _MAX_ROWS) - 1
        with self._errors(writing=False):
            ids = [_s(i) for i in self._r.zrevrange(key, 0, end)]
            pipe = self._r.pipeline(transaction=False)
            for cid in ids:
                pipe.hmget(self._ckey(cid), _FIELDS)
            hashes = pipe.execute()
        return [self._record(cid, h) for cid, h in zip(ids, hashes) if h[0] is not None]  # skip ones deleted meanwhile

    def children(self, commit_id: str) -> tuple[CommitId, ...]:
        cid = check_id(commit_id)
        self._hash(cid)
        with self._errors(writing=False):
            return tuple(sorted(CommitId(_s(k)) for k in self._r.smembers(f"{self.prefix}kids:{cid}")))

    def streams(self) -> list[str]:
        with self._errors(writing=False):
            return sorted(_s(s) for s in self._r.smembers(f"{self.prefix}streams"))

    def resolve(self, prefix: str) -> CommitId:
        p = prefix.strip().lower()
        if len(p) < 4 or any(c not in "0123456789abcdef" for c in p):
            raise ConfigError(f"{prefix!r} is not a commit id or an id prefix of at least 4 hex chars")
        with self._errors(writing=False):
            hits = self._r.zrangebylex(f"{self.prefix}ids", f"[{p}", f"({p}g", start=0, num=2)
        if not hits:
            raise CommitNotFoundError(f"no commit id starts with {p} in store {self.url}")
        if len(hits) > 1:
            raise ConfigError(f"id prefix {p} is ambiguous; give more characters")
        return CommitId(_s(hits[0]))

    def events(self, after: str = "0", *, limit: int = 1000, wait_s: float = 0.0) -> list[StaleEvent]:
        if not (isinstance(after, str) and _CURSOR.fullmatch(after)):  # Redis refuses parts past 2**64 itself
            raise ConfigError(f"event cursor {str(after)[:64]!r} is not a Redis stream id (MS-SEQ); give the "
                              "seq of the last event received, or 0 for the start")
        if limit < 1:
            raise ConfigError(f"events limit {limit}: give at least 1")
        deadline = time.monotonic() + wait_s
        slice_ms = max(1, int(self.config.socket_timeout_s * 500))  # NOTE: a blocked read must beat the timeout
        with self._errors(writing=False):
            check_issued(self._r, f"{self.prefix}events", after)
            while True:
                left_ms = int((deadline - time.monotonic()) * 1000)
                block = max(1, min(slice_ms, left_ms)) if wait_s > 0 else None
                try:
                    res = self._r.xread({f"{self.prefix}events": after}, count=min(int(limit), _MAX_ROWS),
                                        block=block)
                except redis.exceptions.ResponseError as e:
                    if "Invalid stream ID" in str(e):
                        raise ConfigError(f"event cursor {after!r} is not a Redis stream id") from None
                    raise
                if res or block is None or left_ms <= slice_ms:
                    break
        if not res:
            return []
        entries = res[0][1]
        return [StaleEvent(seq=_s(eid), commit=CommitId(_s(f[b"commit"])), root=CommitId(_s(f[b"root"])),
                           reason=_s(f[b"reason"]), chain=tuple(json.loads(f[b"chain"])), at=float(f[b"at"]))
                for eid, f in entries]

    # ------------------------------------------------------------ bounds, usage
    def set_quota(self, max_bytes: int | None) -> None:
        quota = check_quota_value(max_bytes)
        with self._errors(writing=True):
            if quota is None:
                self._r.delete(f"{self.prefix}quota")
            else:
                self._r.set(f"{self.prefix}quota", quota)

    def set_retention(self, stream: str | None, *, keep_last: int | None = None, ttl_s: float | None = None) -> None:
        name = "" if stream is None else check_stream(stream)
        policy = Retention(keep_last=keep_last, ttl_s=ttl_s)
        with self._errors(writing=True):
            if policy.active:
                self._r.hset(f"{self.prefix}retention", name, json.dumps(policy.to_dict()))
            else:
                self._r.hdel(f"{self.prefix}retention", name)

    def retention(self, stream: str | None) -> Retention:
        name = "" if stream is None else check_stream(stream)
        with self._errors(writing=False):
            own, default = self._r.hmget(f"{self.prefix}retention", [name, ""])
        raw = own if own is not None else default
        return Retention.from_dict(json.loads(raw)) if raw is not None else Retention()

    def usage(self) -> DomainUsage:
        return self._usage(self.domain)

    def _usage(self, domain: str) -> DomainUsage:
        p = key_prefix(domain)
        with self._errors(writing=False):
            pipe = self._r.pipeline(transaction=False)
            pipe.hmget(f"{p}usage", ["commits", "logical", "stored", "chunks"])
            pipe.get(f"{p}quota")
            (n, logical, stored, chunks), quota = pipe.execute()
        return DomainUsage(domain=domain, commits=int(n or 0), logical_bytes=int(logical or 0),
                           stored_bytes=int(stored or 0), chunks=int(chunks or 0),
                           quota_bytes=None if quota is None else int(quota))

    def stats(self) -> StoreStats:
        domains, partial = {self.domain}, False
        try:
            with self._errors(writing=False):
                for key in self._r.scan_iter(match="c2c:{*}:usage", count=1000):
                    domains.add(_s(key)[len("c2c:{"):-len("}:usage")])
                for key in self._r.scan_iter(match="c2c:{*}:quota", count=1000):
                    domains.add(_s(key)[len("c2c:{"):-len("}:quota")])
        except StoreError:
            partial = True  # a user that may not list keys sees its own domain
        out = []
        for d in sorted(domains):
            try:
                u = self._usage(d) if d != self.domain else self.usage()
            except (StoreError, ConfigError):
                partial = True  # another domain's keys, out of this user's reach
                continue
            if u.commits or u.chunks or u.quota_bytes is not None or d == self.domain:
                out.append(u)
        return StoreStats(url=self.url, domains=tuple(out), partial=partial)

    # ----------------------------------------------------------------- lifecycle
    def delete_leaf(self, commit_id: str) -> bool:
        cid = check_id(commit_id)
        p = self.prefix
        with self._errors(writing=True):
            for _ in range(_RETRIES):
                h = self._r.hmget(self._ckey(cid), "stream", "blob", "parents", "chunks")
                if h[0] is None:
                    return False
                stream, blob, parents, stored = (_s(v) for v in h)
                uses: dict[str, int] = {}
                for digest, _, _ in json.loads(stored):
                    uses[digest] = uses.get(digest, 0) + 1
                keys = [self._ckey(cid), self._kids_key(cid), f"{p}s:{stream}", f"{p}streams", f"{p}all",
                        f"{p}ids", *(self._kids_key(q) for q in json.loads(parents)),
                        f"{p}refs", f"{p}usage", f"{p}head:{cid}", *(f"{p}chunk:{d}" for d in uses)]
                res = int(self._delete_leaf(keys=keys, args=self._args(cid, stream, blob, parents,
                                                                        json.dumps(list(uses.values())))))
                if res != -3:
                    return res == 1
        raise StoreWriteError(f"commit {cid[:12]} kept being deleted and put again under this gc; run it again")

    def sweep_orphans(self, grace_s: float) -> int:
        # Upload chunks carry their own TTL, and the put and delete scripts adopt or release chunks
        # together with their commit (counting references), so Redis never holds an orphan to sweep.
        return 0


def _plan(entries: list, pages: list) -> list[tuple[int, int, int, str, list[tuple[str, int]]]]:
    """Split one round of a walk into STEP runs that mark at most :data:`WALK_BATCH` children each.

    ``entries`` are the walk list's first entries (``[id, chain, cursor, spared id]``) and ``pages``
    the SSCAN page ``(cursor, members)`` of each one's children. A run is ``(first, end, npop,
    newhead, kids)``: it checks that the list starts with entries ``first:end``, marks ``kids``
    (child id, index into ``entries``), pops ``npop`` entries, then makes ``newhead`` the first if
    given. The round ends at the first entry with children left on later SSCAN pages.
    """
    runs = []
    first, kids = 0, []
    for i, (entry, (cursor, members)) in enumerate(zip(entries, pages)):
        for m in members:
            kid = _s(m)
            if kid == entry[3]:
                continue
            if len(kids) == WALK_BATCH:  # entries before i are done; i stays first, partly marked
                runs.append((first, i + 1, i - first, "", kids))
                first, kids = i, []
            kids.append((kid, i))
        if int(cursor) != 0:  # i has children on later pages: it stays, its cursor moved on
            runs.append((first, i + 1, i - first, json.dumps([entry[0], entry[1], str(cursor), entry[3]]), kids))
            return runs
    runs.append((first, len(entries), len(entries) - first, "", kids))
    return runs


def _s(v) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)
