"""`RedisStore`: a store shared across processes and machines, ``redis://HOST:PORT/DB``.

The URL and its options (trust domain, cluster, timeouts, chunk size) are
:class:`~c2c.store.redis_config.RedisConfig`'s.

Metadata is in hashes, blobs are ``chunk_mb``-sized string chunks, and stale
events go to a Redis Stream that a consumer reads from its last cursor, so one
that was down catches up (see :mod:`c2c.store.redis_lua` for the key layout).

A put uploads the chunks under a temporary token (each chunk expires on its
own after ``upload_ttl_s``), then one Lua script checks the parents and adopts
the chunks as the blob, all at once. A writer killed mid-upload leaves only
expiring chunks; nothing is visible until the script ran.

An invalidation (and the supersession a put causes) marks the dependents in
steps of at most :data:`WALK_BATCH` commits, one short script each, so a big
DAG never blocks the server for long (see :mod:`c2c.store.redis_lua`). The call
returns once every dependent is stale; until then a dependent not yet reached
still reads as fresh, and a commit put under one meanwhile ends stale too.

NOTE: an acknowledged put is as durable as the server's persistence: run
redis-server with ``appendonly yes`` and ``appendfsync always`` for "acknowledged
means on disk"; ``everysec`` can lose the last second if the server host dies.
Keep ``maxmemory-policy noeviction`` (the default): an evicting policy would drop
blob chunks, which reads then report as :class:`StoreCorruptError`. When memory
runs out, puts fail with :class:`StoreWriteError` and leave nothing behind.
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

from c2c.errors import CommitNotFoundError, ConfigError, StoreCorruptError, StoreError, StoreWriteError
from c2c.store import redis_lua, resp
from c2c.store.interface import (BlobDigest, BlobProblem, Commit, CommitId, CommitRecord, StaleEvent, Store,
                                 check_id, check_reason, check_stream, invalidated_reason, stale_error)
from c2c.store.ingest import HashingBuffer, hash_while_reading, prepare_put
from c2c.store.redis_config import RedisConfig, key_prefix
from c2c.trust.keys import check_domain

_CURSOR = re.compile(r"[0-9]{1,20}(-[0-9]{1,20})?")  # a stream id, MS-SEQ (or MS alone), each part a uint64
_MAX_ROWS = 1 << 62  # a larger count means "all" (Redis parses counts as 64-bit integers)
READ_GROUP = 2      # chunks per pipelined round trip when reading a blob
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
        self._direct_reads = True  # blobs via c2c.store.resp; the pipelined path stays for redirects (and tests)
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
    def _record(cid: str, h: dict[bytes, bytes]) -> CommitRecord:
        s = {k.decode(): v.decode() for k, v in h.items()}
        commit = Commit(id=CommitId(cid), stream=s["stream"], version=int(s["version"]),
                        parents=tuple(CommitId(p) for p in json.loads(s["parents"])), blob=BlobDigest(s["blob"]),
                        size=int(s["size"]), created=float(s["created"]), summary=json.loads(s["summary"]))
        return CommitRecord(commit=commit, stale="stale_reason" in s, stale_reason=s.get("stale_reason"),
                            stale_chain=tuple(json.loads(s["stale_chain"])) if "stale_chain" in s else (),
                            superseded_by=CommitId(s["superseded_by"]) if "superseded_by" in s else None)

    @staticmethod
    def _events(raw) -> list[StaleEvent]:
        return [StaleEvent(seq=_s(eid), commit=CommitId(_s(c)), root=CommitId(_s(r)), reason=_s(why),
                           chain=tuple(json.loads(_s(ch))), at=float(_s(at))) for eid, c, r, why, ch, at in raw]

    # ------------------------------------------------------------------- blobs
    def _upload(self, token: str, view: memoryview) -> int:
        """Send ``view`` as expiring chunks under ``token`` (runs on an ingest thread). Returns the count."""
        step, ttl = self.config.chunk_bytes, self.config.upload_ttl_s
        n = max(1, -(-len(view) // step))
        try:
            with self._errors(writing=True):
                pipe = self._r.pipeline(transaction=False)
                for i in range(n):
                    pipe.set(f"{self.prefix}up:{token}:{i}", view[i * step: (i + 1) * step], ex=ttl)
                pipe.execute()
        except StoreWriteError:
            self._drop_upload(token, n)
            raise
        return n

    def _drop_upload(self, token: str, n: int) -> None:
        try:
            self._r.delete(*[f"{self.prefix}up:{token}:{i}" for i in range(n)])
        except redis.exceptions.RedisError:
            pass  # NOTE: the chunks expire on their own after upload_ttl_s

    def _read_blob(self, commit: Commit, chunks: int) -> bytes:
        keys = [f"{self.prefix}blob:{commit.blob}:{i}" for i in range(chunks)]
        with self._errors(writing=False):
            got = None
            if self._direct_reads:
                try:
                    got = self._read_blob_direct(commit, keys)
                except resp.Redirected:
                    pass  # the slot is moving (cluster resharding): redis-py follows MOVED/ASK
            data, digest = got or hash_while_reading(self._read_blob_pipelined(commit, keys))
        if digest != commit.blob or len(data) != commit.size:
            raise StoreCorruptError(f"blob of commit {commit.id[:12]} does not hash to {commit.blob[:12]} "
                                    f"({len(data)} bytes, sha256 {digest[:12]}); run `c2c store verify`")
        return data

    def _read_blob_direct(self, commit: Commit, keys: list[str]) -> tuple[bytearray, str]:
        """Chunks straight into one buffer (see :mod:`c2c.store.resp`), hashed as each lands."""
        with HashingBuffer(commit.size) as buf:
            try:
                n = resp.get_into(self._plain_client(keys[0]), keys, buf.view, buf.filled)
            except resp.MissingValue as e:
                raise StoreCorruptError(f"blob of commit {commit.id[:12]} lost chunk {e.key}") from None
            except ValueError:
                raise StoreCorruptError(f"blob of commit {commit.id[:12]} is longer than its "
                                        f"{commit.size} bytes") from None
            data, digest = buf.finish()
        return (data if n == commit.size else data[:n]), digest

    def _read_blob_pipelined(self, commit: Commit, keys: list[str]) -> Iterator[bytes]:
        for g in range(0, len(keys), READ_GROUP):
            pipe = self._r.pipeline(transaction=False)
            for k in keys[g: g + READ_GROUP]:
                pipe.get(k)
            for k, part in zip(keys[g: g + READ_GROUP], pipe.execute()):
                if part is None:
                    raise StoreCorruptError(f"blob of commit {commit.id[:12]} lost chunk {k}")
                yield part

    # ------------------------------------------------------------------- writing
    def put(self, data, *, stream: str | None = None, parents: Sequence[str] = ()) -> Commit:
        token = uuid.uuid4().hex
        ing, n, stream, all_parents = prepare_put(data, stream=stream, parents=parents,
                                                  write=lambda view: self._upload(token, view),
                                                  discard=lambda n: self._drop_upload(token, n))
        res = self._commit(ing.id, stream, ing.blob, ing.size, n, all_parents, ing.summary, token)
        code = int(res[0])
        if code == 0:  # already committed (by an earlier put whose reply was lost, say)
            try:
                return self.show(ing.id).commit
            except StoreError as e:
                raise StoreWriteError(f"{ing.id[:12]} is already committed but could not be read back ({e}); "
                                      "put it again") from e
        if code == -1:
            raise CommitNotFoundError(f"parent {_s(res[1])[:12]} is not in store {self.url}; put it first")
        if code == -2:
            raise StoreWriteError(f"the upload of {ing.id[:12]} expired or was lost before it was committed; "
                                  "nothing was committed, put it again")
        commit = Commit(id=ing.id, stream=stream, version=int(res[1]), parents=all_parents, blob=ing.blob,
                        size=ing.size, created=float(_s(res[2])), summary=ing.summary)
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
        return commit

    def _commit(self, cid: str, stream: str, blob: str, size: int, n: int, parents: tuple[str, ...],
                summary: dict, token: str) -> list:
        """Run the PUT script, naming the stream head it read; read again while other puts move the head."""
        p = self.prefix
        with self._errors(writing=True):
            top = self._head(stream)
            for _ in range(_RETRIES):
                keys = [self._ckey(cid), f"{p}s:{stream}", f"{p}seq", f"{p}all", f"{p}ids", f"{p}streams",
                        f"{p}events", f"{p}walks"]
                if top:
                    keys += [self._ckey(top), f"{p}walk:{top}"]
                for parent in parents:
                    keys += [self._ckey(parent), self._kids_key(parent)]
                keys += [f"{p}up:{token}:{i}" for i in range(n)] + [f"{p}blob:{blob}:{i}" for i in range(n)]
                res = self._put(keys=keys, args=self._args(cid, stream, blob, size, n, json.dumps(list(parents)),
                                                            json.dumps(summary, sort_keys=True), top))
                if int(res[0]) != -3:
                    return res
                top = _s(res[1])
        self._drop_upload(token, n)
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
        """Run the walk below ``root`` (see :mod:`c2c.store.redis_lua`) until its list is empty.

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
    def _hash(self, cid: str) -> dict[bytes, bytes]:
        with self._errors(writing=False):
            h = self._r.hgetall(self._ckey(cid))
        if not h:
            raise CommitNotFoundError(f"no commit {cid[:12]} in store {self.url}")
        return h

    def show(self, commit_id: str) -> CommitRecord:
        cid = check_id(commit_id)
        return self._record(cid, self._hash(cid))

    def get(self, commit_id: str, *, allow_stale: bool = False) -> CommitRecord:
        cid = check_id(commit_id)
        h = self._hash(cid)
        rec = self._record(cid, h)
        if rec.stale and not allow_stale:
            raise stale_error(rec)
        try:
            data = self._read_blob(rec.commit, int(h[b"chunks"]))
        except StoreCorruptError:
            self._hash(cid)  # deleted meanwhile (gc)? then that is the answer
            raise
        return CommitRecord(commit=rec.commit, stale=rec.stale, stale_reason=rec.stale_reason,
                            stale_chain=rec.stale_chain, superseded_by=rec.superseded_by, data=data)

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
                pipe.hgetall(self._ckey(cid))
            hashes = pipe.execute()
        return [self._record(cid, h) for cid, h in zip(ids, hashes) if h]  # skip ones deleted meanwhile

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

    # ----------------------------------------------------------------- lifecycle
    def verify(self) -> list[BlobProblem]:
        problems = []
        for rec in self.log():
            try:
                self.get(rec.id, allow_stale=True)
            except StoreCorruptError as e:
                problems.append(BlobProblem(commit=rec.id, problem=str(e)))
            except CommitNotFoundError:
                pass  # removed by a concurrent gc
        return problems

    def delete_leaf(self, commit_id: str) -> bool:
        cid = check_id(commit_id)
        p = self.prefix
        with self._errors(writing=True):
            for _ in range(_RETRIES):
                h = self._r.hmget(self._ckey(cid), "stream", "blob", "chunks", "parents")
                if h[0] is None:
                    return False
                stream, blob, chunks, parents = (_s(v) for v in h)
                keys = [self._ckey(cid), self._kids_key(cid), f"{p}s:{stream}", f"{p}streams", f"{p}all",
                        f"{p}ids", *(self._kids_key(q) for q in json.loads(parents)),
                        *(f"{p}blob:{blob}:{i}" for i in range(int(chunks)))]
                res = int(self._delete_leaf(keys=keys, args=self._args(cid, stream, blob, chunks, parents)))
                if res != -3:
                    return res == 1
        raise StoreWriteError(f"commit {cid[:12]} kept being deleted and put again under this gc; run it again")

    def sweep_orphans(self, grace_s: float) -> int:
        # Upload chunks carry their own TTL, and the put and delete scripts adopt or drop a
        # blob together with its commit, so Redis never holds an orphan to sweep.
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
