"""Handoffs through the API: publish a session's cache to the store, attach commits to a request.

Every caller works in its trust domain's part of the store (:meth:`Store.in_domain`):
its streams, commits, events and invalidations are its domain's alone.

**Publish** (``"publish": {"stream": S, "labels": [...], "share": [domains]}``)
commits the session's cache after the reply, whole or as the slice covering the
spans ``labels`` (one span per message, labelled by the message's ``name``, else
its role), on the caller's domain's stream ``S``, signed with the caller's domain
key (created in the server's keyring on first use). The messages' text goes with
it, in the signed header's ``extra["c2c.serve"]`` (at most :data:`MAX_TEXT_BYTES`,
oldest text cut first), so that a receiver that may not take the cache can still
read what it says. ``share`` names other domains that may attach it, as text or
cache: the list is signed (``extra["c2c.share"]``) and a grant pointer is left in
each named domain (:meth:`Store.grant`).

**Attach** (``"attach": [ids], "mode": ...``) finds each commit in the caller's
domain, else among those shared with it; any other id, existing elsewhere or not,
gets the same :class:`~c2c.errors.CommitNotVisibleError` (403). Before anything the
commit names is used, its bytes must be canonical and its signature must verify
against a key the server trusts for the owner's domain (a failure is an error in
every mode: a tampered commit is not read, not even its text). Then
:func:`c2c.handoff.decide` rules, with the sender's party built from the header
(fingerprint, prefix, share list) and the signature (domain), the hop count from
the store (depth + 1) and staleness from the record, and the cross-model maps the
server holds (``c2c serve --map``, :mod:`c2c.serve.mapped`). A cache goes through
:func:`c2c.trust.check` and is placed right after the caller's shared prefix; a
commit of another served model, with a map for that pair that ``decide()`` accepts,
is mapped into the request's model and placed there the same way (path ``mapped``);
text is placed there as a user message. ``auto`` falls back to text whenever a
check fails and says why; ``full`` and ``slice`` raise the failed check's error
instead. For another domain's commit, records and errors give verdicts only: no
prefix lengths or blocks, stale reasons, chain depths or key ids.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from dataclasses import dataclass, replace
from typing import Sequence

from c2c.advise import load_calibration, runtime_calibration_name
from c2c.artifact import Artifact
from c2c.artifact.fingerprint import Fingerprint
from c2c.artifact.header import SHARE_KEY
from c2c.artifact.prefix import PrefixRef
from c2c.canon import canonical_json
from c2c.errors import (C2CError, CommitNotFoundError, CommitNotVisibleError, ConfigError, DomainMismatchError,
                        HandoffError, KeyringError, QuotaExceededError, StaleCommitError, StoreCorruptError, StoreError,
                        StoreWriteError, UnverifiableError)
from c2c.handoff.decide import Decision, Party, decide, fall_back
from c2c.handoff.forecast import forecast
from c2c.handoff.policy import HandoffPolicy
from c2c.runtime.protocol import Runtime
from c2c.runtime.kvcache import KVCache
from c2c.serve.auth import Principal
from c2c.serve.mapped import ServedMap, mapped_parts
from c2c.serve.render import Part, Rendering, text_turn
from c2c.store.fetch import fetch
from c2c.store.interface import Store, check_id, check_stream
from c2c.store.hops import hop_report, text_parents_label
from c2c.trust.isolation import recompute_after
from c2c.trust.keys import Keyring, SigningKey, check_domain
from c2c.trust.verify_policy import VerifyPolicy, check as trust_check
from c2c.trust.verify import slice_context
from c2c.trust.signing import load_signed, sign
from c2c.xmodel import MapOffer

log = logging.getLogger("c2c")
TEXT_KEY = "c2c.serve"
SHARED_PARENTS = "shared_parents"  # label: attached commits of other domains (not store parents)
MAX_SHARE = 16
MAX_TEXT_BYTES = 48 << 10          # of extra["c2c.serve"] as canonical JSON; the header allows 64 KiB
MAX_LABELS = 16
ADVISOR_NOTE = "advisor not asked: the commit's text is already written, so text costs only its prefill"


@dataclass(frozen=True, kw_only=True)
class Attachment:
    """What one attached commit adds to a request, and the record of how.

    Attributes:
        parts: placed after the caller's shared prefix (``kv`` set on the cache path).
        prefix_kv: a full cache's own prefix K/V (equal to the caller's, by the prefix
            check), imported when the caller's session holds nothing yet.
        record: for the response's ``c2c.attach`` list.
        metric_reason: ``ok``, or the first failed check, or the error type.
    """

    commit: str
    path: str                      # the Decision's: cache | mapped | text
    parts: tuple[Part, ...]
    prefix_kv: KVCache | None
    nbytes: int
    record: dict
    metric_reason: str


class Exchange:
    """Publishes and attaches against one store and keyring, each caller in its own trust domain.

    ``maps``: the cross-model maps the server holds (:func:`c2c.serve.mapped.load_maps`), offered to
    every attach's decision.
    """

    def __init__(self, store: Store, keyring: Keyring, *, verify_kv: str = "none", maps: Sequence[ServedMap] = ()):
        self.store = store
        self.keyring = keyring
        self.verify = VerifyPolicy(kv=verify_kv)
        self.maps = tuple(maps)
        self.offers = tuple({m.offer.map_id: m.offer for m in self.maps}.values())
        self._key_lock = threading.Lock()

    def map_offer(self, source: Runtime, target: Runtime) -> MapOffer | None:
        """The map this server holds from ``source``'s caches to ``target``'s (None: it holds none)."""
        return next((m.offer for m in self.maps if m.source is source and m.target is target), None)

    def signing_key(self, domain: str) -> SigningKey:
        """``domain``'s newest private key in the keyring, created (and trusted) on first use."""
        with self._key_lock:
            try:
                return self.keyring.signing_key(domain)
            except KeyringError:
                if any(e.domain == domain and e.has_private and not e.revoked for e in self.keyring.entries()):
                    raise
                return self.keyring.create_key(domain, label="c2c serve")

    def scope(self, principal: Principal) -> Store:
        """The store as the caller's trust domain sees it: its streams, commits and events only."""
        return self.store.in_domain(principal.domain)

    # ------------------------------------------------------------------ publish
    @staticmethod
    def check_publish(principal: Principal, stream: str | None, labels: Sequence[str],
                      known: Sequence[str], share: Sequence[str] = ()) -> None:
        """Refuse a bad stream name, share list or a label that no span will have, before any work is done.

        ``known``: the labels the conversation's spans will carry (its messages', and ``assistant``
        for the reply).
        """
        check_stream(stream or principal.agent)
        _check_share(share)
        missing = sorted(set(_check_labels(labels)) - set(known))
        if missing:
            raise ConfigError(f"publish labels {missing} name no span of this conversation; its spans are "
                              f"labelled {sorted(set(known))} (a message's name, else its role)")

    def publish(self, *, runtime: Runtime, principal: Principal, session: str | None, cache: KVCache,
                rendering: Rendering, stream: str | None, labels: Sequence[str] = (),
                parents: Sequence[str] = (), text_parents: Sequence[str] = (), share: Sequence[str] = ()) -> dict:
        """Commit ``cache`` (which covers exactly ``rendering``), whole or the slice of ``labels``, on
        the caller's domain's ``stream``; ``share`` names other domains that may attach it.

        ``parents`` are the commits the session attached; ``text_parents``, those of them it
        read as text, which are no cache hop (:mod:`c2c.store.hops`). Parents another domain
        shared are named in the header's :data:`SHARED_PARENTS` label, not as store parents:
        the dependency graph, and so invalidation, stays inside a domain.

        Raises:
            ConfigError: a bad stream name, share list or labels, or no span with those labels.
        """
        t0 = time.perf_counter()
        stream = check_stream(stream or principal.agent)
        labels, share = _check_labels(labels), _check_share(share)
        if cache.token_ids != rendering.token_ids:
            raise HandoffError("internal: the cache to publish does not cover the conversation")  # never expected
        P = len(rendering.prefix_ids)
        span_labels: dict[str, str] = {}
        if labels:
            try:
                start, end = rendering.context().export_range(labels)
            except HandoffError as e:
                raise ConfigError(f"publish labels: {e}") from None
            tokens = rendering.token_ids[start:end]
            if start > P:  # re-prefilled after the shared prefix alone: no trace of what came between
                kv = recompute_after(runtime, cache.slice(0, P), tokens) if P else runtime.prefill(tokens)[1]
                isolation = "recompute"
            else:
                kv, isolation = cache.slice(start, end), "positions"
            span_labels = {"span": ",".join(labels), "isolation": isolation}
        else:
            start, end, kv = P, len(rendering), cache
        text, truncated = _bounded_text(_text_between(rendering, start, end))
        key = self.signing_key(principal.domain)
        producer = {"agent": principal.agent, "domain": principal.domain}
        if session:
            producer["session"] = session
        store = self.scope(principal)
        with _quiet_store():
            own = tuple(p for p in parents if store.has(p))
        foreign = tuple(p for p in parents if p not in own)
        extra = {TEXT_KEY: {"v": 1, "agent": principal.agent, "text": text, "truncated": truncated}}
        if share:
            extra[SHARE_KEY] = list(share)
        artifact = Artifact.build(kv, fingerprint=Fingerprint.of(runtime), prefix=PrefixRef.of(rendering.prefix_ids),
                                  producer=producer, parents=own,
                                  labels={**span_labels, **text_parents_label(own, text_parents),
                                          **({SHARED_PARENTS: ",".join(foreign)} if foreign else {})},
                                  extra=extra)
        data = sign(artifact, key).encode()
        t1 = time.perf_counter()
        with _quiet_store():
            commit = store.put(data, stream=stream)
            if share:
                store.grant(commit.id, share)
        t2 = time.perf_counter()
        return {"commit": commit.id, "stream": commit.stream, "version": commit.version,
                "kind": artifact.header.kind, "labels": list(labels), "tokens": kv.seq_len, "bytes": len(data),
                "parents": list(commit.parents), "shared_parents": list(foreign), "share": list(share),
                "text_chars": len(text), "text_truncated": truncated,
                "signed_by": {"domain": key.domain, "key_id": key.key_id[:16]},
                "timings": {"export_s": t1 - t0, "put_s": t2 - t1}}

    # ------------------------------------------------------------------- attach
    def locate(self, principal: Principal, commit_id: str) -> tuple[Store, str]:
        """The store handle that holds ``commit_id`` for the caller, and the domain that owns it:
        the caller's own domain, else one that granted it the commit.

        Raises:
            ConfigError: a malformed id.
            CommitNotVisibleError: neither (the same answer whether or not the id exists elsewhere).
        """
        cid = check_id(commit_id)
        own = self.scope(principal)
        with _quiet_store():
            if own.has(cid):
                return own, principal.domain
            owner = own.granted(cid)
        if owner is None:
            raise not_visible(principal, cid)
        return self.store.in_domain(owner), owner

    def attach(self, commit_id: str, *, runtime: Runtime, principal: Principal, prefix_ids: Sequence[int],
               mode: str, held: KVCache | None = None) -> Attachment:
        """Fetch, check and decide one commit for a request whose shared prefix is ``prefix_ids``.

        A commit of another domain is read only where that domain's signed share list names the
        caller's; its record then carries no lengths, blocks, reasons, key ids or locations.

        ``held`` is the session's cache: the commit's chunks of tokens it already holds (its
        shared prefix, at least) are not fetched; the session's own K/V stand in for them, as
        they would anyway (the request continues from the session's prefix), and every chunk
        fetched is checked against the commit's signed digests (:mod:`c2c.store.fetch`). The
        record gives ``bytes_fetched`` against ``bytes_referenced``. Another domain's commit is
        fetched whole (what a reader holds of it would measure its context).

        Raises:
            ConfigError: a malformed id. CommitNotVisibleError: no such commit visible to the caller.
            ArtifactError, TrustError: the commit's bytes or signature do not verify (any mode).
            DomainMismatchError, StaleCommitError, FingerprintMismatchError, PrefixMismatchError,
            HandoffError: ``full``/``slice`` and the cache may not be used (``auto`` takes text, or the
            mapped path for another served model's commit with a map ``decide()`` accepts).
        """
        t0 = time.perf_counter()
        cid = check_id(commit_id)
        store, owner = self.locate(principal, cid)
        foreign = owner != principal.domain
        with _quiet_store():
            try:
                rec, fetched = fetch(store, cid, held=None if foreign else held, fingerprint=Fingerprint.of(runtime),
                                     allow_stale=True, exact=False)
            except CommitNotFoundError:  # collected since
                raise not_visible(principal, cid) from None
        t1 = time.perf_counter()
        # The signer's own domain is the provenance of cache and text; it is checked on the header
        # before any tensor byte is hashed or built.
        artifact, signer = load_signed(rec.data, self.keyring, own=fetched.own)
        h = artifact.header
        shared_with = h.shared_with
        if signer.domain != owner or (foreign and principal.domain not in shared_with):
            raise not_visible(principal, cid)  # bytes its domain did not sign, or a share it does not name
        agent = h.producer.get("agent", "?")
        with _quiet_store():
            hops = hop_report(store, cid)
        sender = Party(name=agent, domain=signer.domain, fingerprint=h.fingerprint, prefix=h.prefix,
                       shared_with=shared_with)
        receiver = Party(name=principal.agent, domain=principal.domain, fingerprint=Fingerprint.of(runtime),
                         prefix=PrefixRef.of(prefix_ids))
        decision = decide(sender, receiver, HandoffPolicy(mode=mode), hops=hops.depth + 1,
                          stale=rec.stale_reason if rec.stale else None, advice_note=ADVISOR_NOTE,
                          maps=self.offers)
        if foreign:
            decision = _redacted(decision)
        t2 = time.perf_counter()
        if mode in ("full", "slice"):
            _refuse(decision)
        used, reason, metric = decision.path, decision.reason, _metric_reason(decision, mode)
        trust = served = None
        parts: tuple[Part, ...] = ()
        prefix_kv = None
        if used in ("cache", "mapped"):
            try:
                label, kept = f"from:{agent}", _kept_text(artifact, cid, required=False)
                if used == "cache":
                    trust = trust_check(artifact, self.keyring, owner, self.verify, runtime=runtime,
                                        prefix_ids=list(prefix_ids), context=slice_context(h.start, prefix_ids))
                    parts, prefix_kv = _cache_parts(artifact, label, kept)
                else:
                    served = next(m for m in self.maps if m.offer.map_id == decision.map_id)
                    trust = self._check_mapped(artifact, owner, served, prefix_ids)
                    parts = mapped_parts(served, artifact, runtime=runtime, prefix_ids=prefix_ids, label=label,
                                         text=kept)
            except C2CError as e:
                if foreign:  # the class says what failed; the message may measure the owner's context
                    e = type(e)(f"commit {cid[:12]}: {type(e).__name__} (details withheld: another domain's commit)")
                decision = fall_back(decision, HandoffPolicy(mode=mode), e)  # raises in full / slice
                used, reason, metric = decision.path, decision.reason, f"error:{type(e).__name__}"
        nbytes = len(rec.data)
        if used == "text":
            text = _kept_text(artifact, cid)
            if decision.check("hops").ok is False and not foreign:  # cite the chain the cache would have extended
                text += "\n" + hops.fallback_text()
            parts = (text_turn(runtime, f"from:{agent}", f"Context from {agent} (c2c commit {cid[:12]}):\n{text}"),)
            nbytes = len(text.encode())
        t3 = time.perf_counter()
        signer_info = {"domain": signer.domain} if foreign else {"domain": signer.domain, "key_id": signer.key_id[:16]}
        record = {"commit": cid, "requested": mode, "used": "text" if used == "text" else h.kind, "path": used,
                  "kind": h.kind, "reason": reason, "checks": [c.to_dict() for c in decision.checks],
                  "signer": signer_info, "shared": foreign, "stale": rec.stale,
                  "hops": hops.depth + 1, "tokens": sum(len(p.token_ids) for p in parts) + (
                      prefix_kv.seq_len if prefix_kv is not None else 0),
                  "bytes": nbytes, "bytes_fetched": fetched.bytes_fetched, "bytes_referenced": fetched.bytes_referenced,
                  "trust": trust.to_dict() if trust is not None else None,
                  "timings": {"fetch_s": t1 - t0, "decide_s": t2 - t1, "check_s": t3 - t2}}
        if used == "mapped":
            record["map"] = served.to_dict()
        if foreign:
            record.pop("hops")
        return Attachment(commit=cid, path=used, parts=parts, prefix_kv=prefix_kv, nbytes=nbytes, record=record,
                          metric_reason=metric)

    def _check_mapped(self, artifact: Artifact, owner: str, served: ServedMap, prefix_ids: Sequence[int]):
        """A commit's checks before it is mapped: signature, prefix and the source model's fingerprint.

        Raises:
            UnverifiableError: the server re-computes K/V (``--verify-kv sample|strict``): that would run
                the source model on the receiver's turn (see :mod:`c2c.serve.mapped`).
            TrustError, PrefixMismatchError, FingerprintMismatchError: as for a cache.
        """
        if self.verify.kv != "none":
            raise UnverifiableError(f"--verify-kv {self.verify.kv}: a mapped cache's K/V would be re-computed on "
                                    f"{served.source.name}, outside its turn; this server reads such commits as text")
        return trust_check(artifact, self.keyring, owner, self.verify, runtime=served.source,
                           prefix_ids=list(prefix_ids))

    # ------------------------------------------------------------------ commits
    def show(self, principal: Principal, commit_id: str) -> dict:
        """A commit of the caller's domain: its facts, staleness and hop depth.

        Raises:
            ConfigError: a malformed id. CommitNotVisibleError: the caller's domain has no such commit.
        """
        store = self._own(principal, commit_id)
        with _quiet_store():
            rec = store.show(commit_id)
            return {**rec.to_dict(), "hops": hop_report(store, rec.id).to_dict()}

    def invalidate(self, principal: Principal, commit_id: str, reason: str) -> list[dict]:
        """Mark a commit of the caller's domain (and everything built on it there) stale; the new events."""
        store = self._own(principal, commit_id)
        with _quiet_store():
            return [e.to_dict() for e in store.invalidate(commit_id, reason=reason)]

    def events(self, principal: Principal, after: str = "0", *, limit: int = 100,
               wait_s: float = 0.0) -> tuple[list[dict], str]:
        """Stale events of the caller's domain after cursor ``after``, and the next cursor."""
        with _quiet_store():
            evs = self.scope(principal).events(after, limit=limit, wait_s=wait_s)
        return [e.to_dict() for e in evs], (evs[-1].seq if evs else after)

    def is_stale(self, principal: Principal, commit_id: str) -> bool:
        """Whether ``commit_id`` (the caller's, or one shared with it) has been invalidated.

        Raises:
            CommitNotVisibleError: it was collected, or is no longer visible.
        """
        store, _ = self.locate(principal, commit_id)
        with _quiet_store():
            try:
                return store.show(commit_id).stale
            except CommitNotFoundError:
                raise not_visible(principal, commit_id) from None

    def _own(self, principal: Principal, commit_id: str) -> Store:
        cid = check_id(commit_id)
        store = self.scope(principal)
        with _quiet_store():
            if not store.has(cid):
                raise not_visible(principal, cid)
        return store


def not_visible(principal: Principal, commit_id: str) -> CommitNotVisibleError:
    """The one answer for an id the caller may not see, whether or not it exists elsewhere."""
    return CommitNotVisibleError(
        f"no commit {commit_id[:12]} is visible to trust domain {principal.domain!r}: none exists there, or the "
        "domain that owns it did not share it (publish with \"share\": [domains] to share)")


@contextlib.contextmanager
def _quiet_store():
    """Store failures without the store's location (a path, a Redis host and user) in the message:
    what a caller is told names the problem, the server's log names the place."""
    try:
        yield
    except (CommitNotVisibleError, StaleCommitError, ConfigError, QuotaExceededError):  # the caller's own business
        raise
    except CommitNotFoundError:  # one of the caller's own, collected meanwhile
        raise CommitNotFoundError("that commit is no longer in the store (collected meanwhile)") from None
    except StoreError as e:
        log.warning("store: %s", e)
        what = {StoreCorruptError: "the commit's stored bytes are damaged; its publisher should publish it again",
                StoreWriteError: "the store could not commit this; nothing was written, retry"}
        raise type(e)(next((m for cls, m in what.items() if isinstance(e, cls)),
                           "the store is unavailable; retry later (the server log has the details)")) from None


def _check_share(share: Sequence[str]) -> tuple[str, ...]:
    share = tuple(share or ())
    if len(share) > MAX_SHARE:
        raise ConfigError(f"publish share: name at most {MAX_SHARE} trust domains")
    return tuple(sorted({check_domain(d) for d in share}))


def _redacted(decision: Decision) -> Decision:
    """``decision`` with check details that could measure another domain's context (prefix lengths and
    blocks, stale reasons, chain depth) replaced by their verdicts alone."""
    verdicts = {"prefix": ("same shared prefix", "shared prefixes differ"),
                "staleness": ("fresh context", "built on stale context (invalidated or superseded)"),
                "hops": ("within the hop limit", "would exceed the hop limit (C2C_MAX_HOPS)")}
    checks = tuple(replace(c, detail=verdicts[c.name][0 if c.ok else 1]) if c.name in verdicts else c
                   for c in decision.checks)
    failed = [c for c in checks if c.ok is False]
    reason = decision.reason
    if decision.path == "text" and failed and reason != "text requested":
        reason = f"fell back to text: {failed[0].detail}"
    return replace(decision, checks=checks, reason=reason)


def advise_hop(runtime: Runtime, *, message_tokens: int, context_tokens: int = 0, hops: int = 1,
               bandwidth_gbps: float | None = None, cross_domain: bool = False, same_model: bool = True,
               fuser_available: bool = False, xmap: MapOffer | None = None) -> dict:
    """:func:`c2c.handoff.forecast` for one hop into ``runtime``, from its calibration (model, dtype, backend).

    ``xmap``: a map the server holds from the sender's model to ``runtime`` (the mapped path, if its
    record earns it).

    Raises:
        ConfigError: it was never calibrated here.
    """
    key, model = runtime_calibration_name(runtime), runtime.name
    cal = load_calibration(key)
    if cal is None:
        dtype = str(runtime.dtype).replace("torch.", "")
        raise ConfigError(f"no calibration for {key} on this server; run `c2c advise --model {model} --dtype {dtype} "
                          f"--backend {runtime.engine_id.kind} --message-tokens 64` once on this machine (it measures "
                          "and saves one)")
    d = forecast(cal, Fingerprint.of(runtime), message_tokens=message_tokens, context_tokens=context_tokens,
                 hops=hops, bandwidth_gbps=bandwidth_gbps, cross_domain=cross_domain, other_model=not same_model,
                 fuser_available=fuser_available, xmap=xmap)
    return {"model": model, "calibration_created": cal.created, "decision": d.path, "reason": d.reason,
            "map_id": d.map_id, "checks": [c.to_dict() for c in d.checks], **d.advice}


def _refuse(decision: Decision) -> None:
    """An explicit cache mode: raise the first failed check's error (a foreign domain: 403's error)."""
    refusal = decision.refusal()
    if isinstance(refusal, DomainMismatchError):
        raise DomainMismatchError(f"{refusal}; attach with mode auto to read its text")
    if refusal is not None:
        raise refusal


def _metric_reason(decision: Decision, mode: str) -> str:
    if decision.path in ("cache", "mapped"):
        return "ok"
    failed = decision.failed if mode != "text" else ()
    return failed[0].name if failed else "requested"


def _cache_parts(artifact: Artifact, label: str, text: str) -> tuple[tuple[Part, ...], KVCache | None]:
    """The commit's K/V and tokens after the shared prefix (and, for a full cache, its prefix K/V)."""
    h = artifact.header
    if h.tokens is None:
        raise HandoffError("the commit withholds its token ids, so the server cannot track what the cache holds")
    cache = artifact.cache
    if h.kind == "slice":
        return (Part(label=label, token_ids=tuple(h.tokens), private=False, kv=cache, text=text),), None
    P = h.prefix.length
    prefix_kv = cache.slice(0, P) if P else None
    if cache.end == P:
        return (), prefix_kv
    return (Part(label=label, token_ids=tuple(h.tokens[P:]), private=False, kv=cache.slice(P, cache.end),
                 text=text),), prefix_kv


def _kept_text(artifact: Artifact, cid: str, *, required: bool = True) -> str:
    kept = artifact.header.extra.get(TEXT_KEY)
    if not isinstance(kept, dict) or not isinstance(kept.get("text"), str):
        if not required:
            return ""
        raise HandoffError(f"commit {cid[:12]} keeps no text (it was not published by c2c serve), so it "
                           "cannot be handed over as text; attach it with mode full or slice")
    return kept["text"]


def _text_between(rendering: Rendering, start: int, end: int) -> str:
    """The text of the parts inside tokens ``[start, end)`` (not the shared prefix)."""
    out, offset = [], 0
    for i, p in enumerate(rendering.parts):
        a, b = offset, offset + len(p.token_ids)
        offset = b
        if i and a >= start and b <= end and p.text:
            out.append(p.text)
    return "\n\n".join(out)


def _bounded_text(text: str) -> tuple[str, bool]:
    """``text``, its oldest part cut until it fits :data:`MAX_TEXT_BYTES` as canonical JSON."""
    def size(t: str) -> int:
        return len(canonical_json({TEXT_KEY: {"v": 1, "agent": "x" * 64, "text": t, "truncated": True}}))

    if size(text) <= MAX_TEXT_BYTES:
        return text, False
    keep = len(text)
    while keep and size(text[-keep:]) > MAX_TEXT_BYTES - 64:
        keep = keep * 3 // 4
    return f"[... {len(text) - keep} earlier characters cut]\n" + text[-keep:], True


def _check_labels(labels: Sequence[str]) -> tuple[str, ...]:
    labels = tuple(labels or ())
    if len(labels) > MAX_LABELS or not all(isinstance(x, str) and 0 < len(x) <= 64 for x in labels):
        raise ConfigError(f"publish labels: give at most {MAX_LABELS} labels of 1-64 characters")
    return labels
