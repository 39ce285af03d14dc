"""The connector's two exchanges with the store, off vLLM's engine loop: check an attach, make a publish.

:class:`Attacher` (scheduler side) rules on ``{"attach": ID, "mode": ...}`` for one
request's prompt, with c2c's one decision, as ``c2c serve`` does
(:class:`c2c.serve.handoff.Exchange`):

1. the id is well formed and visible to the instance's trust domain (its own commit, or
   one another domain shared with it): else :class:`CommitNotVisibleError`, whether or
   not it exists elsewhere;
2. the bytes are canonical and signed by a key the keyring trusts for the owner's domain
   (a failure is an error in every mode: a tampered commit is not read);
3. :func:`c2c.handoff.decide` with the commit as sender (fingerprint, the prefix it covers,
   domain and share list from the signed header) and the instance as receiver (its
   fingerprint, the request's own prompt tokens), the hop count from the store and
   staleness from the record.

``full`` gets the cache or the first failed check's error; ``auto`` gets the cache or an
ordinary prefill, with the reason. What may be loaded is a prefix of the prompt: the
commit's tokens must begin the prompt. With the ``longest`` prefix policy an ``auto``
attach loads the longest run of whole 16-token blocks the two share (at least one);
``full`` and the ``exact`` policy need all of them. A verified commit is staged, as its
bytes, in the run directory for the worker to load.

:class:`Publisher` (worker side) turns a finished request's K/V into a signed artifact,
commits it on the instance's domain's stream and settles the request's ticket.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Sequence

from c2c._io import write_atomic
from c2c.artifact.codec import Artifact
from c2c.artifact.fingerprint import Fingerprint
from c2c.artifact.prefix import PrefixRef
from c2c.errors import (C2CError, CommitNotFoundError, CommitNotVisibleError, ConfigError, HandoffError, KeyringError,
                        StoreError, TrustError, ArtifactError)
from c2c.handoff.decide import Decision, Party, decide, fall_back
from c2c.handoff.policy import HandoffPolicy
from c2c.runtime.kvcache import KVCache
from c2c.runtime.vllm import tickets
from c2c.store.interface import Store, check_id, check_stream
from c2c.store.hops import hop_report
from c2c.store.url import open_store
from c2c.trust.keys import Keyring, SigningKey
from c2c.trust.signing import load_signed, sign

log = logging.getLogger("c2c.vllm")
MODES = ("auto", "full")
FATAL = (ConfigError, CommitNotVisibleError, TrustError, ArtifactError)   # errors in every mode
NOTE = "advisor not asked: the prompt already holds the text, so the alternative is its prefill"


@dataclass(frozen=True, kw_only=True)
class Request:
    """The c2c part of one request's ``kv_transfer_params``: ``{"c2c": {...}}``."""

    attach: str | None = None
    mode: str = "auto"
    publish: bool = False
    stream: str | None = None
    parents: tuple[str, ...] = ()

    @classmethod
    def parse(cls, params: Any) -> "Request | None":
        """None when the request carries no ``c2c`` field.

        Raises:
            ConfigError: a ``c2c`` field of the wrong shape (named in the message).
        """
        if not isinstance(params, dict) or "c2c" not in params:
            return None
        c = params["c2c"]
        if not isinstance(c, dict) or set(c) - {"attach", "mode", "publish"}:
            raise ConfigError('kv_transfer_params.c2c takes {"attach": ID, "mode": "auto"|"full", '
                              '"publish": {"stream": S, "parents": [IDS]}}')
        attach, mode = c.get("attach"), c.get("mode", "auto")
        if attach is not None:
            check_id(attach, "kv_transfer_params.c2c.attach")
        if mode not in MODES:
            raise ConfigError(f"kv_transfer_params.c2c.mode must be one of {MODES}, not {str(mode)[:20]!r}")
        pub = c.get("publish")
        if pub is None or pub is False:
            return cls(attach=attach, mode=mode)
        if pub is True:
            pub = {}
        if not isinstance(pub, dict) or set(pub) - {"stream", "parents"}:
            raise ConfigError('kv_transfer_params.c2c.publish takes {"stream": S, "parents": [IDS]}')
        stream = pub.get("stream")
        if stream is not None:
            check_stream(stream)
        parents = pub.get("parents") or []
        if not isinstance(parents, list) or len(parents) > 64:
            raise ConfigError("kv_transfer_params.c2c.publish.parents must be a list of at most 64 commit ids")
        return cls(attach=attach, mode=mode, publish=True, stream=stream,
                   parents=tuple(check_id(p, "a publish parent") for p in parents))


@dataclass(frozen=True, kw_only=True)
class Verdict:
    """The ruling on one attach.

    Attributes:
        load_tokens: how many leading tokens of the prompt the commit's K/V may fill (0: none).
        staged: the verified artifact's bytes, staged for the worker (None unless loading).
        record: what the reply's ``kv_transfer_params.c2c.attach`` says.
        error: ``{"type", "message"}`` when the request must fail (any mode: a bad or invisible id,
            a tampered commit; ``full``: any refusal).
    """

    commit: str
    load_tokens: int = 0
    staged: str | None = None
    record: dict = field(default_factory=dict)
    error: dict | None = None


def error_dict(e: C2CError) -> dict[str, str]:
    return {"type": type(e).__name__, "message": str(e)}


class _Scope:
    """One store connection and keyring per process, used from the connector's own thread."""

    def __init__(self, *, store_url: str | None, domain: str, keyring: Keyring):
        self.store_url, self.domain, self.keyring = store_url, domain, keyring
        self._store: Store | None = None
        self._lock = threading.Lock()

    @property
    def store(self) -> Store:
        with self._lock:
            if self._store is None:
                self._store = open_store(self.store_url).in_domain(self.domain)
            return self._store

    def close(self) -> None:
        with self._lock:
            if self._store is not None:
                self._store.close()
                self._store = None


class Attacher(_Scope):
    """Rules on attaches for one instance (see the module docstring)."""

    def __init__(self, *, store_url: str | None, domain: str, keyring: Keyring, fingerprint: Fingerprint,
                 staging: Path, agent: str = "vllm", prefix_policy: str = "longest", max_hops: int | None = None):
        super().__init__(store_url=store_url, domain=domain, keyring=keyring)
        self.fingerprint, self.staging, self.agent = fingerprint, staging, agent
        self.prefix_policy, self.max_hops = prefix_policy, max_hops

    def check(self, commit_id: str, mode: str, prompt_ids: Sequence[int], *, request_id: str = "") -> Verdict:
        """Fetch, verify and decide ``commit_id`` for a prompt; never raises a :class:`C2CError`."""
        t0 = time.perf_counter()
        record: dict[str, Any] = {"commit": commit_id, "requested": mode}
        try:
            cid = check_id(commit_id, "kv_transfer_params.c2c.attach")
            store, owner = self._locate(cid)
            foreign = owner != self.domain
            try:
                rec = store.get(cid, allow_stale=True)
            except CommitNotFoundError:
                raise self._not_visible(cid) from None
            t1 = time.perf_counter()
            artifact, signer = load_signed(rec.data, self.keyring)
            h = artifact.header
            shared_with = h.shared_with
            if signer.domain != owner or (foreign and self.domain not in shared_with):
                raise self._not_visible(cid)
            hops = hop_report(store, cid, max_hops=self.max_hops)
            sender_prefix, receiver_prefix, matched = self._prefixes(h, prompt_ids, mode)
            sender = Party(name=h.producer.get("agent", "?"), domain=signer.domain, fingerprint=h.fingerprint,
                           prefix=sender_prefix, shared_with=shared_with)
            receiver = Party(name=self.agent, domain=self.domain, fingerprint=self.fingerprint, prefix=receiver_prefix)
            policy = HandoffPolicy(mode=mode, max_hops=self.max_hops)
            decision = decide(sender, receiver, policy, hops=hops.depth + 1,
                              stale=rec.stale_reason if rec.stale else None, advice_note=NOTE)
            if h.kind != "full":
                decision = fall_back(decision, policy, HandoffError(
                    f"commit {cid[:12]} is a slice (positions {h.start}..{h.end}); vLLM attaches whole caches only"))
            if foreign:
                decision = _redacted(decision)
            record.update(path=decision.path, reason=decision.reason,
                          checks=[c.to_dict() for c in decision.checks], signer={"domain": signer.domain},
                          shared=foreign, stale=rec.stale, commit_tokens=h.seq_len, matched_tokens=matched,
                          bytes=len(rec.data))
            if not foreign:
                record.update(hops=hops.depth + 1, signer={"domain": signer.domain, "key_id": signer.key_id[:16]})
            if mode == "full":
                refusal = decision.refusal()
                if refusal is not None:
                    raise refusal
            staged = None
            if decision.path == "cache":
                staged = str(self.staging / f"{request_id or cid}.{time.monotonic_ns()}.c2c")
                write_atomic(staged, rec.data, durable=False, error=StoreError)
            record["timings"] = {"fetch_s": t1 - t0, "check_s": time.perf_counter() - t1}
            return Verdict(commit=cid, load_tokens=matched if staged else 0, staged=staged, record=record)
        except C2CError as e:
            if mode == "auto" and not isinstance(e, FATAL) and isinstance(e, (StoreError, HandoffError)):
                log.warning("c2c attach %s: %s; prefilling instead", commit_id[:12], e)
                record.update(path="text", reason=f"fell back to prefill: {type(e).__name__}: {e}")
                return Verdict(commit=commit_id, record=record)
            record.update(path="error", reason=f"{type(e).__name__}: {e}")
            return Verdict(commit=commit_id, record=record, error=error_dict(e))

    # ----------------------------------------------------------------- helpers
    def _locate(self, cid: str) -> tuple[Store, str]:
        own = self.store
        with _quiet():
            try:
                own.show(cid)
                return own, self.domain
            except CommitNotFoundError:
                owner = own.granted(cid)
        if owner is None:
            raise self._not_visible(cid)
        return own.in_domain(owner), owner

    def _not_visible(self, cid: str) -> CommitNotVisibleError:
        return CommitNotVisibleError(
            f"no commit {cid[:12]} is visible to trust domain {self.domain!r}: none exists there, or the domain "
            "that owns it did not share it")

    def _prefixes(self, header, prompt_ids: Sequence[int], mode: str) -> tuple[PrefixRef, PrefixRef, int]:
        """(the commit's prefix, the prompt's, the tokens that may load) under the prefix policy."""
        if header.tokens is None:
            raise HandoffError("the commit withholds its token ids, so they cannot be matched against the prompt")
        theirs, ours = list(header.tokens), list(prompt_ids)
        bs = header.prefix.block_size
        n = len(theirs)
        if mode == "auto" and self.prefix_policy == "longest":
            common = next((i for i, (a, b) in enumerate(zip(theirs, ours)) if a != b), min(n, len(ours)))
            L = n if common >= n else (common // bs) * bs
            if L:
                return PrefixRef.of(theirs[:L], bs), PrefixRef.of(ours[:L], bs), L
        return PrefixRef.of(theirs, bs), PrefixRef.of(ours[:n], bs), n


class Publisher(_Scope):
    """Commits finished requests' K/V for one instance (see the module docstring)."""

    def __init__(self, *, store_url: str | None, domain: str, keyring: Keyring, fingerprint: Fingerprint,
                 run_dir: Path, agent: str = "vllm"):
        super().__init__(store_url=store_url, domain=domain, keyring=keyring)
        self.fingerprint, self.run_dir, self.agent = fingerprint, run_dir, agent

    def publish(self, cache: KVCache, *, ticket: str, stream: str | None, parents: Sequence[str] = (),
                request_id: str = "") -> dict:
        """Sign and commit ``cache``; settle ``ticket`` with the commit (or the error). Never raises."""
        t0 = time.perf_counter()
        try:
            store = self.store
            with _quiet():
                own = tuple(p for p in dict.fromkeys(parents) if store.has(p))
            foreign = [p for p in parents if p not in own]
            producer = {"agent": self.agent, "domain": self.domain, "engine": "vllm"}
            if request_id:
                producer["request"] = request_id[:200]
            artifact = Artifact.build(cache, fingerprint=self.fingerprint, prefix=PrefixRef.of(cache.token_ids),
                                      producer=producer, parents=own,
                                      labels={"shared_parents": ",".join(foreign)} if foreign else {})
            key = self.signing_key()
            data = sign(artifact, key).encode()
            t1 = time.perf_counter()
            with _quiet():
                commit = store.put(data, stream=check_stream(stream or self.agent))
            t2 = time.perf_counter()
            outcome = {"commit": commit.id, "stream": commit.stream, "version": commit.version,
                       "tokens": cache.seq_len, "bytes": len(data), "parents": list(commit.parents),
                       "shared_parents": foreign, "signed_by": {"domain": key.domain, "key_id": key.key_id[:16]},
                       "timings": {"build_s": t1 - t0, "put_s": t2 - t1}}
        except C2CError as e:
            log.warning("c2c publish of %s failed: %s", request_id, e)
            outcome = {"error": error_dict(e)}
        tickets.settle(self.run_dir, ticket, outcome)
        return outcome

    def signing_key(self) -> SigningKey:
        """The domain's newest private key, created (and trusted) on first use, as ``c2c serve`` does."""
        try:
            return self.keyring.signing_key(self.domain)
        except KeyringError:
            if any(e.domain == self.domain and e.has_private and not e.revoked for e in self.keyring.entries()):
                raise
            return self.keyring.create_key(self.domain, label="c2c vllm")


def _redacted(decision: Decision) -> Decision:
    """Another domain's commit: its check details (prefix lengths, stale reasons, depth) become verdicts."""
    verdicts = {"prefix": ("same prefix", "prefixes differ"), "staleness": ("fresh context", "built on stale context"),
                "hops": ("within the hop limit", "would exceed the hop limit")}
    checks = tuple(replace(c, detail=verdicts[c.name][0 if c.ok else 1]) if c.name in verdicts else c
                   for c in decision.checks)
    failed = [c for c in checks if c.ok is False]
    reason = f"fell back to text: {failed[0].detail}" if decision.path == "text" and failed else decision.reason
    return replace(decision, checks=checks, reason=reason)


@contextlib.contextmanager
def _quiet():
    """Store failures without the store's location (a path, a Redis host) in what the caller is told."""
    try:
        yield
    except (CommitNotFoundError, ConfigError):
        raise
    except StoreError as e:
        log.warning("store: %s", e)
        raise type(e)("the store is unavailable or failed; retry later (the server log has the details)") from None
