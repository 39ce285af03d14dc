"""`RedisStore`: a store shared across processes and machines, ``redis://HOST:PORT/DB``.

``rediss://`` connects over TLS. c2c's own options ride in the query string and
are stripped before the URL reaches redis-py::

    redis://user:secret@10.0.0.5:6379/0?domain=research&chunk_mb=8

- ``domain`` (default ``default``) is the trust domain: every key lives under
  ``c2c:<domain>:``, so an ACL user made by :func:`c2c.store.acl.create_domain_user`
  sees its own domain only.
- metadata is in hashes, blobs are ``chunk_mb``-sized string chunks, and stale
  events go to a Redis Stream that a consumer reads from its last cursor, so one
  that was down catches up (see :mod:`c2c.store.redis_lua` for the key layout).

A put uploads the chunks under a temporary token (each chunk expires on its
own after ``upload_ttl_s``), then one Lua script checks the parents and adopts
the chunks as the blob, all at once. A writer killed mid-upload leaves only
expiring chunks; nothing is visible until the script ran.

NOTE: an acknowledged put is as durable as the server's persistence: run
redis-server with ``appendonly yes`` and ``appendfsync always`` for "acknowledged
means on disk"; ``everysec`` can lose the last second if the server host dies.
Keep ``maxmemory-policy noeviction`` (the default): an evicting policy would drop
blob chunks, which reads then report as :class:`StoreCorruptError`. When memory
runs out, puts fail with :class:`StoreWriteError` and leave nothing behind.
"""

from __future__ import annotations

import json
import re
import uuid
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Iterator, Sequence
from urllib.parse import parse_qsl, urlencode, urlparse, urlunparse

import redis
from redis.backoff import ExponentialBackoff
from redis.retry import Retry

from c2c.errors import CommitNotFoundError, ConfigError, StoreCorruptError, StoreError, StoreWriteError
from c2c.store import redis_lua, resp
from c2c.store.base import (BlobDigest, BlobProblem, Commit, CommitId, CommitRecord, StaleEvent, Store,
                            check_id, check_reason, check_stream, invalidated_reason, stale_error)
from c2c.store.ingest import HashingBuffer, hash_while_reading, ingest

_DOMAIN = re.compile(r"[A-Za-z0-9_-]{1,64}")
_OPTIONS = {"domain", "chunk_mb", "upload_ttl_s", "max_events"}
READ_GROUP = 2  # chunks per pipelined round trip when reading a blob


def key_prefix(domain: str) -> str:
    """Every key of ``domain`` starts with this."""
    if not isinstance(domain, str) or not _DOMAIN.fullmatch(domain):
        raise ConfigError(f"trust domain {domain!r} must be 1-64 characters of A-Z a-z 0-9 _ -")
    return f"c2c:{domain}:"


@dataclass(frozen=True, kw_only=True)
class RedisConfig:
    """Connection URL (without c2c options) plus c2c's options."""

    connection_url: str
    domain: str = "default"
    chunk_bytes: int = 8 << 20
    upload_ttl_s: int = 3600
    max_events: int = 100_000

    @classmethod
    def from_url(cls, url: str) -> "RedisConfig":
        u = urlparse(url)
        if u.scheme not in ("redis", "rediss") or not u.hostname:
            raise ConfigError(f"{url!r} is not a redis://HOST:PORT/DB or rediss:// URL")
        ours, theirs = {}, []
        for k, v in parse_qsl(u.query, keep_blank_values=True):
            (ours.__setitem__(k, v) if k in _OPTIONS else theirs.append((k, v)))
        try:
            chunk = int(float(ours.get("chunk_mb", 8)) * (1 << 20))
            ttl = int(ours.get("upload_ttl_s", 3600))
            maxev = int(ours.get("max_events", 100_000))
        except ValueError:
            raise ConfigError("chunk_mb, upload_ttl_s and max_events must be numbers") from None
        if not (64 << 10) <= chunk <= (256 << 20):
            raise ConfigError("chunk_mb must be between 0.0625 and 256")
        domain = ours.get("domain", "default")
        key_prefix(domain)
        return cls(connection_url=urlunparse(u._replace(query=urlencode(theirs))), domain=domain,
                   chunk_bytes=chunk, upload_ttl_s=ttl, max_events=maxev)

    @property
    def url(self) -> str:
        """The URL without its password, for messages."""
        u = urlparse(self.connection_url)
        host = f"{u.hostname}:{u.port or 6379}"
        user = f"{u.username}@" if u.username else ""
        return f"{u.scheme}://{user}{host}{u.path or '/0'}?domain={self.domain}"


class RedisStore(Store):
    """A store in one Redis database and trust domain. Thread-safe (redis-py pools connections)."""

    def __init__(self, config: RedisConfig):
        self.config = config
        self.url = config.url
        self.prefix = key_prefix(config.domain)
        try:
            self._r = redis.Redis.from_url(
                config.connection_url, socket_read_size=1 << 20, socket_connect_timeout=5,
                retry=Retry(ExponentialBackoff(cap=0.5, base=0.05), 2))
        except ValueError as e:
            raise ConfigError(f"bad redis URL {self.url}: {e}") from None
        self._put = self._r.register_script(redis_lua.PUT)
        self._invalidate = self._r.register_script(redis_lua.INVALIDATE)
        self._delete_leaf = self._r.register_script(redis_lua.DELETE_LEAF)
        with self._errors(writing=False):
            self._r.ping()

    @classmethod
    def from_url(cls, url: str) -> "RedisStore":
        return cls(RedisConfig.from_url(url))

    def close(self) -> None:
        self._r.close()

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
        except (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError) as e:
            # NOTE: a reply lost mid-commit leaves the outcome unknown; a put is idempotent, so say to retry
            lost = "; put it again (an artifact never commits twice)" if writing else ""
            raise err(f"redis at {self.url} is unreachable ({e}){lost}") from e
        except redis.exceptions.ResponseError as e:
            if "OOM" in str(e) or "maxmemory" in str(e):
                raise err(f"redis at {self.url} is out of memory (maxmemory){tail}") from e
            raise err(f"redis at {self.url} refused: {e}{tail}") from e

    def _ckey(self, cid: str) -> str:
        return f"{self.prefix}c:{cid}"

    def _args(self, *rest) -> list:
        return [self.prefix, self.config.max_events, *rest]

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
            if resp.supported(self._r):
                data, digest = self._read_blob_direct(commit, keys)
            else:
                data, digest = hash_while_reading(self._read_blob_pipelined(commit, keys))
        if digest != commit.blob or len(data) != commit.size:
            raise StoreCorruptError(f"blob of commit {commit.id[:12]} does not hash to {commit.blob[:12]} "
                                    f"({len(data)} bytes, sha256 {digest[:12]}); run `c2c store verify`")
        return data

    def _read_blob_direct(self, commit: Commit, keys: list[str]) -> tuple[bytearray, str]:
        """Chunks straight into one buffer (see :mod:`c2c.store.resp`), hashed as each lands."""
        with HashingBuffer(commit.size) as buf:
            try:
                n = resp.get_into(self._r, keys, buf.view, buf.filled)
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
        if stream is not None:
            check_stream(stream)
        extra = [check_id(p, "parent") for p in parents]
        token = uuid.uuid4().hex
        ing, n = ingest(data, lambda view: self._upload(token, view), lambda n: self._drop_upload(token, n))
        stream = stream or ing.default_stream
        all_parents = tuple(dict.fromkeys((*ing.parents, *extra)))
        if ing.id in all_parents:
            self._drop_upload(token, n)
            raise ConfigError(f"commit {ing.id[:12]} cannot be its own parent")
        with self._errors(writing=True):
            res = self._put(args=self._args(ing.id, stream, ing.blob, ing.size, n, json.dumps(list(all_parents)),
                                            json.dumps(ing.summary, sort_keys=True), token))
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
        return Commit(id=ing.id, stream=stream, version=int(res[1]), parents=all_parents, blob=ing.blob,
                      size=ing.size, created=float(_s(res[2])), summary=ing.summary)

    def invalidate(self, commit_id: str, *, reason: str) -> list[StaleEvent]:
        cid = check_id(commit_id)
        cause = invalidated_reason(check_reason(reason))
        with self._errors(writing=True):
            res = self._invalidate(args=self._args(cid, cause))
        if int(res[0]) == -1:
            raise CommitNotFoundError(f"no commit {cid[:12]} in store {self.url}")
        return self._events(res[1])

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
        end = -1 if limit is None else int(limit) - 1
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
        block = max(1, int(wait_s * 1000)) if wait_s > 0 else None
        with self._errors(writing=False):
            try:
                res = self._r.xread({f"{self.prefix}events": after}, count=int(limit), block=block)
            except redis.exceptions.ResponseError as e:
                if "Invalid stream ID" in str(e):
                    raise ConfigError(f"event cursor {after!r} is not a Redis stream id") from None
                raise
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
        with self._errors(writing=True):
            return bool(self._delete_leaf(args=self._args(cid)))

    def sweep_orphans(self, grace_s: float) -> int:
        # Upload chunks carry their own TTL, and the put and delete scripts adopt or drop a
        # blob together with its commit, so Redis never holds an orphan to sweep.
        return 0


def _s(v) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)
