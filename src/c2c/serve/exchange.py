"""Handoffs through the API: publish a session's cache to the store, attach commits to a request.

Every caller works in its trust domain's part of the store (:meth:`Store.in_domain`):
its streams, commits, events and invalidations are its domain's alone.

**Publish** (``"publish": {"stream": S, "labels": [...], "share": [domains]}``)
commits the session's cache after the reply, whole or as the slice covering the
spans ``labels`` (one span per message, labelled by the message's ``name``, else
its role), on the caller's domain's stream ``S``, signed with the caller's domain
key (created in the server's keyring on first use). The messages' text goes with
it, in the signed header's ``extra["c2c.text"]`` (at most :data:`~c2c.commit.author.MAX_TEXT_BYTES`,
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
:func:`c2c.trust.check_received` and is placed right after the caller's shared prefix; a
commit of another served model, with a map for that pair that ``decide()`` accepts,
is mapped into the request's model and placed there the same way (path ``mapped``);
text is placed there as a user message. ``auto`` falls back to text whenever a
check fails and says why; ``full`` and ``slice`` raise the failed check's error
instead. For another domain's commit, records and errors give verdicts only: no
prefix lengths or blocks, stale reasons, chain depths or key ids.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Sequence

from c2c.advise import load_calibration, runtime_calibration_name
from c2c.artifact import Artifact
from c2c.artifact.fingerprint import Fingerprint
from c2c.artifact.prefix import PrefixRef
from c2c.errors import C2CError, ConfigError, HandoffError
from c2c.handoff.forecast import forecast
from c2c.commit.author import TEXT_KEY, as_message, commit_of, text_of
from c2c.handoff.gate import Admission, Gate, Receiver, not_visible as _not_visible, store_errors
from c2c.handoff.decide import Party
from c2c.handoff.policy import HandoffPolicy
from c2c.runtime import placement
from c2c.runtime.pace import ONE_PASS, Pace
from c2c.runtime.protocol import Runtime
from c2c.runtime.kvcache import KVCache
from c2c.serve.auth import Principal
from c2c.serve.mapped import ServedMap, mapped_parts
from c2c.conversation import Part, Conversation
from c2c.conversation.render import text_turn
from c2c.store.interface import Store, check_stream
from c2c.store.hops import hop_report
from c2c.trust.isolation import check_share, cut_slice
from c2c.trust.keys import Keyring
from c2c.trust.verify_policy import VerifyPolicy
from c2c.trust.verify import slice_context
from c2c.xmodel import MapOffer

MAX_LABELS = 16


@dataclass(frozen=True, kw_only=True)
class Attachment:
    """What one attached commit adds to a request, and the record of how.

    Attributes:
        parts: placed after the caller's shared prefix (``kv`` set on the cache path).
        prefix_kv: a full cache's own prefix K/V (equal to the caller's, by the prefix
            check), imported when the caller's session holds nothing yet.
        record: for the response's ``c2c.attach`` list.
        metric_reason: ``ok``, or the first failed check, or the error type.
        tokens: a full commit's token ids, its shared prefix included (None for a slice, or where the commit
            withholds them): what a request that continues the commit's conversation begins with
            (:func:`c2c.conversation.render.continuation`).
    """

    commit: str
    path: str                      # the Decision's: cache | mapped | text
    parts: tuple[Part, ...]
    prefix_kv: KVCache | None
    nbytes: int
    record: dict
    metric_reason: str
    tokens: tuple[int, ...] | None = None


class Exchange:
    """Publishes and attaches against one store and keyring, each caller in its own trust domain.

    ``maps``: the cross-model maps the server holds (:func:`c2c.serve.mapped.load_maps`), offered to
    every attach's decision.
    """

    def __init__(self, store: Store, keyring: Keyring, *, verify_kv: str = "none", maps: Sequence[ServedMap] = ()):
        self.store = store
        self.keyring = keyring
        self.maps = tuple(maps)
        # the server's --verify-kv is the floor; a domain's stored policy may ask for more (c2c.handoff.gate.kv_policy)
        self.gate = Gate(store, keyring, verify=VerifyPolicy(kv=verify_kv),
                         maps=tuple({m.offer.map_id: m.offer for m in self.maps}.values()), key_label="c2c serve")

    def map_offer(self, source: Runtime, target: Runtime) -> MapOffer | None:
        """The map this server holds from ``source``'s caches to ``target``'s (None: it holds none)."""
        return next((m.offer for m in self.maps if m.source is source and m.target is target), None)

    def scope(self, principal: Principal) -> Store:
        """The store as the caller's trust domain sees it: its streams, commits and events only."""
        return self.gate.scope(principal.domain)

    # ------------------------------------------------------------------ publish
    @staticmethod
    def check_publish(principal: Principal, stream: str | None, labels: Sequence[str],
                      known: Sequence[str], share: Sequence[str] = ()) -> None:
        """Refuse a bad stream name, share list or a label that no span will have, before any work is done.

        ``known``: the labels the conversation's spans will carry (its messages', and ``assistant``
        for the reply).
        """
        check_stream(stream or principal.agent)
        check_share(share)
        missing = sorted(set(_check_labels(labels)) - set(known))
        if missing:
            raise ConfigError(f"publish labels {missing} name no span of this conversation; its spans are "
                              f"labelled {sorted(set(known))} (a message's name, else its role)")

    def publish(self, *, runtime: Runtime, principal: Principal, session: str | None, cache: KVCache,
                conversation: Conversation, stream: str | None, labels: Sequence[str] = (),
                parents: Sequence[str] = (), text_parents: Sequence[str] = (), share: Sequence[str] = (),
                pace: Pace = ONE_PASS) -> dict:
        """Commit ``cache`` (which covers exactly ``conversation``), whole or the slice of ``labels``, on
        the caller's domain's ``stream``; ``share`` names other domains that may attach it. A slice
        re-prefilled after the shared prefix is prefilled at ``pace``.

        ``parents`` are the commits the session attached; ``text_parents``, those of them it
        read as text, which are no cache hop (:mod:`c2c.store.hops`). Parents another domain
        shared are named in the header's :data:`~c2c.commit.author.SHARED_PARENTS` label, not as store parents:
        the dependency graph, and so invalidation, stays inside a domain.

        Raises:
            ConfigError: a bad stream name, share list or labels, or no span with those labels.
        """
        t0 = time.perf_counter()
        stream = check_stream(stream or principal.agent)
        labels, share = _check_labels(labels), check_share(share)
        if cache.token_ids != conversation.token_ids:
            raise HandoffError("internal: the cache to publish does not cover the conversation")  # never expected
        P = len(conversation.prefix_ids)
        kv, isolation = cache, None
        if labels:
            # re-prefilled after the shared prefix alone whenever anything came between: no trace of it
            ctx = conversation.context()
            try:
                kv, isolation, _ = cut_slice(runtime, cache, ctx, labels, isolation="recompute",
                                             prefix_cache=lambda: cache.slice(0, P), pace=pace)
            except HandoffError as e:
                raise ConfigError(f"publish labels: {e}") from None
        producer = {"agent": principal.agent, "domain": principal.domain, **({"session": session} if session else {})}
        artifact = commit_of(conversation, cache=kv, fingerprint=Fingerprint.of(runtime), producer=producer,
                             labels=labels, isolation=isolation, share=share,
                             parents=self.gate.parents(principal.domain, parents, as_text=text_parents))
        t1 = time.perf_counter()
        done = self.gate.publish(principal.domain, artifact, stream=stream)
        kept = artifact.header.extra[TEXT_KEY]
        return {**done.record(), "kind": artifact.header.kind, "labels": list(labels), "tokens": kv.seq_len,
                "text_chars": len(kept["text"]), "text_truncated": kept["truncated"],
                "timings": {"export_s": t1 - t0 + done.timings["sign_s"], "put_s": done.timings["put_s"]}}

    # ------------------------------------------------------------------- attach
    def locate(self, principal: Principal, commit_id: str) -> tuple[Store, str]:
        """The store handle that holds ``commit_id`` for the caller, and the domain that owns it
        (:meth:`c2c.handoff.gate.Gate.locate`)."""
        return self.gate.locate(principal.domain, commit_id)

    def attach(self, commit_id: str, *, runtime: Runtime, principal: Principal, prefix_ids: Sequence[int],
               mode: str, held: KVCache | None = None, pace: Pace = ONE_PASS) -> Attachment:
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
        party = Party(name=principal.agent, domain=principal.domain, fingerprint=Fingerprint.of(runtime),
                      prefix=PrefixRef.of(prefix_ids))
        adm = self.gate.admit(commit_id, Receiver(party=party, policy=HandoffPolicy(mode=mode), held=held,
                                                  exact=False))
        cid, artifact, h = adm.commit, adm.artifact, adm.artifact.header
        agent = h.producer.get("agent", "?")
        t2 = time.perf_counter()
        metric = _metric_reason(adm.decision, mode)
        trust = served = None
        parts: tuple[Part, ...] = ()
        prefix_kv = None
        if adm.path in ("cache", "mapped"):
            try:
                label, kept = f"from:{agent}", _text_or_none(artifact)
                if adm.path == "cache":
                    trust = self.gate.check_kv(adm, runtime=runtime, prefix_ids=prefix_ids,
                                               context=slice_context(h.start, prefix_ids), pace=pace)
                    parts, prefix_kv = _cache_parts(artifact, label, kept)
                else:
                    served = next(m for m in self.maps if m.offer.map_id == adm.decision.map_id)
                    trust = self._check_mapped(adm, served, prefix_ids)
                    parts = mapped_parts(served, artifact, runtime=runtime, prefix_ids=prefix_ids, label=label,
                                         text=kept)
            except C2CError as e:
                adm = adm.fall_back(e)  # raises in full / slice
                metric = f"error:{type(e).__name__}"
        used, rec = adm.path, adm.stored
        nbytes = len(rec.data)
        if used == "text":
            text = adm.text(runtime)
            parts = (text_turn(runtime, f"from:{agent}", as_message(agent, cid, text)),)
            nbytes = len(text.encode())
        t3 = time.perf_counter()
        record = {**adm.record(), "used": "text" if used == "text" else h.kind,
                  "tokens": sum(len(p.token_ids) for p in parts) + (prefix_kv.seq_len if prefix_kv is not None else 0),
                  "bytes": nbytes, "trust": trust.to_dict() if trust is not None else None,
                  "timings": {"fetch_s": adm.timings["fetch_s"], "decide_s": adm.timings["decide_s"],
                              "check_s": t3 - t2}}
        if used == "mapped":
            record["map"] = served.to_dict()
        return Attachment(commit=cid, path=used, parts=parts, prefix_kv=prefix_kv, nbytes=nbytes, record=record,
                          metric_reason=metric, tokens=tuple(h.tokens) if h.kind == "full" and h.tokens else None)

    def _check_mapped(self, adm: Admission, served: ServedMap, prefix_ids: Sequence[int]):
        """A commit's checks before it is mapped: signature, prefix and the source model's fingerprint.

        Raises:
            UnverifiableError: the receiving domain asks for a K/V check (``--verify-kv sample|strict``, or its
                stored policy): that would run the source model on the receiver's turn (see
                :mod:`c2c.serve.mapped`).
            TrustError, PrefixMismatchError, FingerprintMismatchError: as for a cache.
        """
        self.gate.require_kv(adm, why=f"a mapped attach (it would re-compute K/V on {served.source.name}, outside "
                                      "its turn)")
        return self.gate.check_kv(adm, runtime=served.source, prefix_ids=prefix_ids)

    # ------------------------------------------------------------------ commits
    def show(self, principal: Principal, commit_id: str) -> dict:
        """A commit of the caller's domain: its facts, staleness and hop depth.

        Raises:
            ConfigError: a malformed id. CommitNotVisibleError: the caller's domain has no such commit.
        """
        store = self._own(principal, commit_id)
        with store_errors():
            rec = store.show(commit_id)
            return {**rec.to_dict(), "hops": hop_report(store, rec.id).to_dict()}

    def invalidate(self, principal: Principal, commit_id: str, reason: str) -> list[dict]:
        """Mark a commit of the caller's domain (and everything built on it there) stale; the new events."""
        store = self._own(principal, commit_id)
        with store_errors():
            return [e.to_dict() for e in store.invalidate(commit_id, reason=reason)]

    def events(self, principal: Principal, after: str = "0", *, limit: int = 100,
               wait_s: float = 0.0) -> tuple[list[dict], str]:
        """Stale events of the caller's domain after cursor ``after``, and the next cursor."""
        with store_errors():
            evs = self.scope(principal).events(after, limit=limit, wait_s=wait_s)
        return [e.to_dict() for e in evs], (evs[-1].seq if evs else after)

    def freshness(self, principal: Principal, commit_id: str) -> str:
        """``fresh``, ``stale`` or ``gone`` for a commit the caller's session attached earlier
        (:meth:`c2c.handoff.gate.Gate.freshness`)."""
        return self.gate.freshness(principal.domain, commit_id)

    def _own(self, principal: Principal, commit_id: str) -> Store:
        store, owner = self.locate(principal, commit_id)
        if owner != principal.domain:  # shown, invalidated: only by its own domain
            raise not_visible(principal, commit_id)
        return store


def not_visible(principal: Principal, commit_id: str):
    """The one answer for an id the caller may not see (:func:`c2c.handoff.gate.not_visible`)."""
    return _not_visible(principal.domain, commit_id)


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


def _metric_reason(decision, mode: str) -> str:
    if decision.path in ("cache", "mapped"):
        return "ok"
    failed = decision.failed if mode != "text" else ()
    return failed[0].name if failed else "requested"


def _cache_parts(artifact: Artifact, label: str, text: str) -> tuple[tuple[Part, ...], KVCache | None]:
    """The commit's K/V and tokens after the shared prefix (and, for a full cache, its prefix K/V)."""
    h = artifact.header
    if h.tokens is None:
        raise HandoffError("the commit withholds its token ids, so the server cannot track what the cache holds")
    got = placement.split(artifact.cache, full=h.kind == "full", prefix_ids=h.tokens[:h.prefix.length])
    if got.body is None:
        return (), got.prefix
    return (Part(label=label, token_ids=tuple(got.body.token_ids), private=False, kv=got.body, text=text),), \
        got.prefix


def _text_or_none(artifact: Artifact) -> str:
    """The text its author kept, or "" (a part carries it for a later text handoff of the session)."""
    try:
        return text_of(artifact)
    except HandoffError:
        return ""


def _check_labels(labels: Sequence[str]) -> tuple[str, ...]:
    labels = tuple(labels or ())
    if len(labels) > MAX_LABELS or not all(isinstance(x, str) and 0 < len(x) <= 64 for x in labels):
        raise ConfigError(f"publish labels: give at most {MAX_LABELS} labels of 1-64 characters")
    return labels
