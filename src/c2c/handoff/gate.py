"""The one gate every front-end admits and publishes a stored commit through.

The library (:func:`c2c.flows.chain.pull`), ``c2c serve`` (:class:`c2c.serve.exchange.Exchange`)
and vLLM's connector (:mod:`c2c.vllm.commits`) are thin adapters over :class:`Gate`, so one
commit gets the same answer, record and error from each of them.

**Admit** (:meth:`Gate.admit`), in order; nothing the commit names is used before the step
that vouches for it:

1. *locate*: the id is well formed and is the receiving domain's own commit or one another
   domain granted it (:meth:`Store.granted`); anything else, existing elsewhere or not, gets
   the one :func:`not_visible` answer;
2. *read exactly what is missing*: the chunks of tokens the receiver already holds are not
   fetched (:func:`c2c.store.fetch.fetch`; another domain's commit is read whole, since what a
   reader holds of it would measure its context);
3. *signature, domain, share list*, from the signed header alone: the signer's domain must be
   the owner's, and another domain's commit must name the receiver's in its signed share
   list (else, again, :func:`not_visible`); the unsigned ``producer`` field is never trusted;
4. *decide*: :func:`c2c.handoff.decide` with the commit as sender, the hop count from the
   store and staleness from the record; an explicit ``full``/``slice`` raises the first failed
   check's error;
5. *redact*: another domain's commit shows verdicts only (:func:`redact`): no prefix lengths
   or blocks, stale reasons, chain depths or key ids, in the record or an error message; its
   reason names the share it rests on (the two are not one trust domain).

Then the front-end places the cache; before that, :meth:`Gate.check_kv` runs the K/V check
the receiving domain asks for (:func:`kv_policy`: the stricter of the domain's stored policy
and the front-end's floor); its report of another domain's commit names the signer's domain
alone (:class:`SharedTrustReport`: no key id, key label or signing time). A front-end that
cannot run it refuses the cache (:meth:`Gate.require_kv`), naming the policy. A failure after
the decision goes through :meth:`Admission.fall_back`, the one fall-back rule (text in ``auto``,
the error otherwise).
Store failures reach the caller as the library's errors without the store's location
(:func:`store_errors`).

**Publish** (:meth:`Gate.publish`): sign for the domain (its key created on first use),
put (the store chunks it and applies the stream's retention), then grant it to the
domains of the signed share list.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from dataclasses import dataclass, field, fields, replace
from typing import Any, Callable, Iterator, Sequence

from c2c.artifact.codec import Artifact
from c2c.artifact.header import ArtifactHeader
from c2c.artifact.prefix import PrefixRef
from c2c.errors import (ArtifactError, C2CError, CommitNotFoundError, CommitNotVisibleError, ConfigError, DomainMismatchError,
                        HandoffError, KeyringError, QuotaExceededError, StaleCommitError, StoreCorruptError, StoreError,
                        StoreWriteError, TrustError, UnsignedArtifactError, UnverifiableError)
from c2c.commit.author import SHARED_PARENTS, Parents, text_of
from c2c.handoff.decide import Decision, Party, decide, fall_back
from c2c.handoff.policy import HandoffPolicy
from c2c.runtime.kvcache import Edits, KVCache
from c2c.runtime.pace import ONE_PASS, Pace
from c2c.store.fetch import FetchReport, fetch
from c2c.store.hops import HopReport, hop_report
from c2c.store.interface import Commit, CommitRecord, Store, check_id, check_stream
from c2c.trust.keys import Keyring, SigningKey
from c2c.trust.signing import SignerInfo, decode_exact, load_signed, sign
from c2c.trust.verify_policy import DEFAULT, ROUTINE, TrustReport, VerifyPolicy, check_received as trust_check

log = logging.getLogger("c2c")
_KV_RANK = {"none": 0, "sample": 1, "strict": 2}


#: errors that refuse an attach in every mode: the id, the bytes, the signature or the stored chunks are bad
FATAL = (ConfigError, CommitNotVisibleError, TrustError, ArtifactError, StoreCorruptError)
#: what a record says of the advisor where a commit's text is the alternative (the library and c2c serve)
ADVISOR_NOTE = "advisor not asked: the commit's text is already written, so text costs only its prefill"
PROMPT_NOTE = "advisor not asked: the prompt already holds the text, so the alternative is its prefill"


# --------------------------------------------------------------------------- the gate's pieces
def not_visible(domain: str, commit_id: str) -> CommitNotVisibleError:
    """The one answer for an id the caller may not see, whether or not it exists elsewhere."""
    return CommitNotVisibleError(
        f"no commit {commit_id[:12]} is visible to trust domain {domain!r}: none exists there, or the domain "
        "that owns it did not share it (publish with \"share\": [domains] to share)")


@contextlib.contextmanager
def store_errors() -> Iterator[None]:
    """Store failures as the library's errors, without the store's location (a path, a Redis host
    and user) in the message: what a caller is told names the problem, the log names the place."""
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


_VERDICTS = {"prefix": ("same shared prefix", "shared prefixes differ"),
             "staleness": ("fresh context", "built on stale context (invalidated or superseded)"),
             "hops": ("within the hop limit", "would exceed the hop limit (C2C_MAX_HOPS)"),
             "exact": ("what a prefill of its tokens gives", "edited without a prefill, so approximate")}


_SAME_DOMAIN = "same trust domain"  # what decide()'s cache reason says of the domain check


def redact(decision: Decision, *, owner: str, receiver: str) -> Decision:
    """``decision`` on ``owner``'s commit shared with ``receiver``: the check details that could measure
    the owner's context (prefix lengths and blocks, stale reasons, chain depth) replaced by their verdicts
    alone, and a cache reason that names the share (the two are not one trust domain)."""
    checks = tuple(replace(c, detail=_VERDICTS[c.name][0 if c.ok else 1]) if c.name in _VERDICTS else c
                   for c in decision.checks)
    failed = [c for c in checks if c.ok is False]
    reason = decision.reason
    if decision.path == "text" and failed and reason != "text requested":
        reason = f"fell back to text: {failed[0].detail}"
    elif decision.path != "text":
        reason = _share_reason(reason, owner=owner, receiver=receiver)
    return replace(decision, checks=checks, reason=reason)


def _share_reason(reason: str, *, owner: str, receiver: str) -> str:
    """``reason`` (a cache or mapped path's) with its domain clause naming the share it rests on:
    ``decide()`` words the passed domain check as the same-domain case, which a shared commit is not."""
    share = f"shared with {receiver!r} by {owner!r}"
    return reason.replace(_SAME_DOMAIN, share) if _SAME_DOMAIN in reason else f"{reason}; {share}"


@dataclass(frozen=True, kw_only=True)
class SharedTrustReport(TrustReport):
    """The trust report of another domain's commit, as its receiver may see it: ``signer`` is withheld
    (None) and only ``signer_domain`` is kept, since the owner's key id, key label and signing time
    identify its keys and time its work, and a shared commit shows verdicts only."""

    signer_domain: str

    @classmethod
    def of(cls, report: TrustReport, owner: str) -> "SharedTrustReport":
        """``report`` (which ran against the full signature) without the signer's key."""
        kept = {f.name: getattr(report, f.name) for f in fields(TrustReport)}
        return cls(**{**kept, "signer": None}, signer_domain=owner)

    def to_dict(self) -> dict[str, Any]:
        return {**super().to_dict(), "signer": {"domain": self.signer_domain}}


def kv_policy(keyring: Keyring, domain: str, floor: VerifyPolicy | None = None) -> VerifyPolicy:
    """The K/V check a receiver in ``domain`` runs: the stricter of the domain's stored policy
    (``c2c keys policy``) and the front-end's ``floor`` (``c2c serve --verify-kv``). Without a stored
    policy the floor stands, and without either the library's default (a sampled check)."""
    stored = keyring.policy_dict(domain)
    if not stored:
        return floor or DEFAULT
    own = VerifyPolicy.from_dict(stored)
    return floor if floor is not None and _KV_RANK[floor.kv] > _KV_RANK[own.kv] else own


def refuse(decision: Decision) -> None:
    """An explicit cache mode: raise the first failed check's error (a foreign domain: with the way out)."""
    refusal = decision.refusal()
    if isinstance(refusal, DomainMismatchError):
        raise DomainMismatchError(f"{refusal}; attach with mode auto to read its text")
    if refusal is not None:
        raise refusal


# --------------------------------------------------------------------------- admission
@dataclass(frozen=True, kw_only=True)
class Admission:
    """A commit admitted into one receiver: everything the gate established, for the front-end to render.

    Attributes:
        commit: its id. owner: the domain that owns it. foreign: owned by another domain (shared with
            the receiver's); the record and errors then carry verdicts only.
        stored: the store's record (staleness, the artifact's bytes).
        fetched: what crossed the wire (bytes fetched against referenced).
        artifact: the decoded, signature-checked artifact. signer: who signed it (its domain is ``owner``).
        hops: the chain behind it. decision: :func:`decide`'s, redacted for a foreign commit.
        policy: the hop's policy (its mode is what the caller asked for).
        verify: the K/V check the receiving domain asks for (:func:`kv_policy`).
        timings: seconds to locate and fetch, and to verify and decide.
    """

    commit: str
    owner: str
    foreign: bool
    stored: CommitRecord
    fetched: FetchReport
    artifact: Artifact
    signer: SignerInfo | None
    hops: HopReport
    decision: Decision
    policy: HandoffPolicy
    verify: VerifyPolicy
    timings: dict[str, float] = field(default_factory=dict)

    @property
    def path(self) -> str:
        return self.decision.path

    def fall_back(self, error: C2CError) -> "Admission":
        """The one fall-back rule after the decision (the K/V check, mapping, staging failed): text in
        ``auto``, with the reason; the error itself otherwise. Another domain's commit: the error's class
        says what failed, its message (which may measure the owner's context) is withheld."""
        if self.foreign:
            error = type(error).__new__(type(error))
            Exception.__init__(error, f"commit {self.commit[:12]}: {type(error).__name__} "
                                      "(details withheld: another domain's commit)")
        return replace(self, decision=fall_back(self.decision, self.policy, error))

    def text(self, runtime=None) -> str:
        """What a receiver reads instead of the K/V: the commit's text (:func:`c2c.commit.author.text_of`), and
        where the hop check failed, the chain the cache would have extended (its own domain's commit only).

        Raises:
            HandoffError: the commit keeps no text and ``runtime`` cannot read its tokens.
        """
        try:
            text = text_of(self.artifact, runtime=runtime)
        except HandoffError as e:
            raise HandoffError(f"commit {self.commit[:12]}: {e}") from None
        if self.decision.check("hops").ok is False and not self.foreign:
            text += "\n" + self.hops.fallback_text()
        return text

    def record(self) -> dict[str, Any]:
        """What every front-end's reply says of this attach (a foreign commit: verdicts, the signer's domain)."""
        signer = {"domain": self.owner} if self.signer is None else {"domain": self.signer.domain}
        if not self.foreign and self.signer is not None:
            signer["key_id"] = self.signer.key_id[:16]
        h = self.artifact.header
        out = {"commit": self.commit, "requested": self.policy.mode, "path": self.decision.path, "kind": h.kind,
               "reason": self.decision.reason, "checks": [c.to_dict() for c in self.decision.checks],
               "signer": signer, "shared": self.foreign, "stale": self.stored.stale,
               "bytes": len(self.stored.data), "bytes_fetched": self.fetched.bytes_fetched,
               "bytes_referenced": self.fetched.bytes_referenced}
        if not self.foreign:
            out["hops"] = self.hops.depth + 1
        return out


@dataclass(frozen=True, kw_only=True)
class Published:
    """A commit :meth:`Gate.publish` made: the store's commit, the key that signed it, its size."""

    commit: Commit
    key: SigningKey | None
    nbytes: int
    share: tuple[str, ...] = ()
    shared_parents: tuple[str, ...] = ()
    timings: dict[str, float] = field(default_factory=dict)

    def record(self) -> dict[str, Any]:
        return {"commit": self.commit.id, "stream": self.commit.stream, "version": self.commit.version,
                "bytes": self.nbytes, "parents": list(self.commit.parents),
                "shared_parents": list(self.shared_parents), "share": list(self.share),
                "signed_by": None if self.key is None else {"domain": self.key.domain,
                                                             "key_id": self.key.key_id[:16]}}


@dataclass(frozen=True, kw_only=True)
class Receiver:
    """The side that admits a commit, as :meth:`Gate.admit` reads it: one per front-end call.

    Attributes:
        party: who it is: its domain, model fingerprint and the shared prefix it holds.
        policy: how the hop is asked for (mode, hop limit, ...), or a function of the signed header that
            gives it (the library attaches a commit as what it is: its mode is the commit's kind).
        held: its cache from position 0: chunks of tokens it holds are not fetched.
        exact: check the held chunks against the commit's digests (False where its own K/V stand in for
            them anyway: a server that re-prefills what it does not import).
        match: for a receiver whose context is a prompt that a commit's tokens may begin (vLLM), the
            (commit's, its own) prefixes to compare, from the signed header; None: the commit's signed
            prefix against ``party.prefix``.
        allow_stale: it goes on from a stale commit explicitly (flagged in its record); its staleness is
            then no check of the decision.
        prompt_holds_text: what text means for it. False (the library, ``c2c serve``): the commit's kept text,
            placed as a message, so text needs the commit. True (vLLM): its own prompt already holds the
            conversation, so text is that prompt prefilled as sent, and needs nothing from the store.
    """

    party: Party
    policy: HandoffPolicy | Callable[[ArtifactHeader], HandoffPolicy]
    held: KVCache | None = None
    exact: bool = True
    match: Callable[[ArtifactHeader], tuple[PrefixRef, PrefixRef]] | None = None
    allow_stale: bool = False
    prompt_holds_text: bool = False

    @property
    def domain(self) -> str:
        return self.party.domain

    @property
    def advice_note(self) -> str:
        """What its record says of the advisor, which a gate never asks: the text a receiver would take instead
        is already written (the commit's), or already in its prompt."""
        return PROMPT_NOTE if self.prompt_holds_text else ADVISOR_NOTE

    def falls_back(self, error: C2CError, mode: str) -> bool:
        """The one fall-back rule for an attach that failed before its decision (:meth:`Gate.admit` raised),
        beside :meth:`Admission.fall_back` for a check that failed after it: in ``auto`` a store that is down,
        or a commit whose tokens cannot be matched, is text, where text needs nothing of the commit
        (``prompt_holds_text``); otherwise the error stands (a receiver that would read the commit's text
        cannot answer without it). Never from :data:`FATAL`: a bad or invisible id, bytes or a signature that
        do not verify, or stored chunks that no longer hash to their digests are reported in every mode."""
        return (mode == "auto" and self.prompt_holds_text and isinstance(error, (StoreError, HandoffError))
                and not isinstance(error, FATAL))


class Gate:
    """Admits and publishes commits against one store and keyring, each caller in its own trust domain.

    Args:
        store: the whole store; every call works in one domain's part of it (:meth:`Store.in_domain`).
        keyring: the keys this front-end trusts, and the domains' signing keys and K/V policies; None for a
            library team that signs nothing (its own domain's commits only, the store's partition as provenance).
        verify: the front-end's floor for the K/V check (``c2c serve --verify-kv``); None: the domain's
            stored policy, else the library's default.
        maps: cross-model maps on offer to every decision (:class:`c2c.xmodel.MapOffer`).
        key_label: the label of a signing key created on first use.
    """

    def __init__(self, store: Store, keyring: Keyring | None, *, verify: VerifyPolicy | None = None,
                 maps: Sequence[Any] = (), key_label: str = "c2c"):
        self.store, self.keyring, self.verify = store, keyring, verify
        self.maps, self.key_label = tuple(maps), key_label
        self._key_lock = threading.Lock()

    def scope(self, domain: str) -> Store:
        """The store as ``domain`` sees it: its streams, commits and events only."""
        return self.store.in_domain(domain)

    def locate(self, domain: str, commit_id: str) -> tuple[Store, str]:
        """The store handle that holds ``commit_id`` for ``domain``, and the domain that owns it.

        Raises:
            ConfigError: a malformed id. CommitNotVisibleError: neither its own nor granted to it.
        """
        cid = check_id(commit_id)
        own = self.scope(domain)
        with store_errors():
            if own.has(cid):
                return own, domain
            owner = own.granted(cid)
        if owner is None:
            raise not_visible(domain, cid)
        return self.scope(owner), owner

    def freshness(self, domain: str, commit_id: str) -> str:
        """``fresh``, ``stale`` or ``gone`` (collected, retired by retention, or no longer shared) for a
        commit ``domain`` attached earlier: a session holding its K/V goes on from them when it is gone."""
        try:
            store, _ = self.locate(domain, commit_id)
            with store_errors():
                return "stale" if store.show(commit_id).stale else "fresh"
        except CommitNotFoundError:  # CommitNotVisibleError included
            return "gone"

    def admit(self, commit_id: str, receiver: Receiver) -> Admission:
        """Locate, fetch, verify and decide one commit for ``receiver`` (see the module docstring).

        Raises:
            ConfigError: a malformed id. CommitNotVisibleError: not visible to ``receiver``'s domain.
            ArtifactError, TrustError: its bytes or signature do not verify (any mode).
            DomainMismatchError, StaleCommitError, IncompatibleCacheError, HandoffError: an explicit mode and
                a check failed.
        """
        domain, policy, held, party = receiver.domain, receiver.policy, receiver.held, receiver.party
        t0 = time.perf_counter()
        cid = check_id(commit_id)
        store, owner = self.locate(domain, cid)
        foreign = owner != domain
        with store_errors():
            try:
                rec, fetched = fetch(store, cid, held=None if foreign else held, fingerprint=party.fingerprint,
                                     allow_stale=True, exact=receiver.exact)
            except CommitNotFoundError:  # collected since
                raise not_visible(domain, cid) from None
        t1 = time.perf_counter()
        if self.keyring is not None:
            # the signer's own domain is the provenance; checked on the header before any tensor byte is hashed
            artifact, signer = load_signed(rec.data, self.keyring, own=fetched.own)
            if signer.domain != owner or (foreign and domain not in artifact.header.shared_with):
                raise not_visible(domain, cid)  # bytes its domain did not sign, or a share it does not name
            sender_domain = signer.domain
        elif foreign:  # a share list nobody can verify is no grant
            raise UnsignedArtifactError(f"commit {cid[:12]} belongs to another domain: reading it needs a keyring "
                                        "that verifies its owner's signature and share list (Team(keyring=...))")
        else:  # no keyring, no provenance beyond the store: the domain whose part of the store holds it
            artifact, signer, sender_domain = decode_exact(rec.data, own=fetched.own), None, owner
        h = artifact.header
        if callable(policy):
            policy = policy(h)
        with store_errors():
            hops = hop_report(store, cid, max_hops=policy.max_hops)
        sender_prefix = h.prefix
        if receiver.match is not None:
            sender_prefix, mine = receiver.match(h)
            party = replace(party, prefix=mine)
        sender = Party(name=str(h.producer.get("agent", "?")), domain=sender_domain, fingerprint=h.fingerprint,
                       prefix=sender_prefix, shared_with=h.shared_with,
                       edited=None if h.edit is None else Edits.read(h.edit).summary())
        decision = decide(sender, party, policy, hops=hops.depth + 1,
                          stale=rec.stale_reason if rec.stale and not receiver.allow_stale else None,
                          advice_note=receiver.advice_note, maps=self.maps)
        if foreign:
            decision = redact(decision, owner=owner, receiver=domain)
        adm = Admission(commit=cid, owner=owner, foreign=foreign, stored=rec, fetched=fetched, artifact=artifact,
                        signer=signer, hops=hops, decision=decision, policy=policy,
                        verify=kv_policy(self.keyring, domain, self.verify) if self.keyring else ROUTINE,
                        timings={"fetch_s": t1 - t0, "decide_s": time.perf_counter() - t1})
        if policy.mode in ("full", "slice"):
            refuse(decision)
        return adm

    def check_kv(self, adm: Admission, *, runtime, prefix_ids: Sequence[int], context=None,
                 engine: bool = True, pace: Pace = ONE_PASS) -> TrustReport | None:
        """The receiving domain's checks on an admitted cache before it is placed: signature for the
        owner's domain, prefix, fingerprint and the K/V check of :attr:`Admission.verify`.

        Without a keyring (a library team that signs nothing) there is nothing to check against: None.
        Another domain's commit: a :class:`SharedTrustReport` (the signer's domain, not its key).

        Raises:
            TrustError, IncompatibleCacheError: as :func:`c2c.trust.verify_policy.check_received`.
        """
        if self.keyring is None:
            return None
        report = trust_check(adm.artifact, self.keyring, adm.owner, adm.verify, runtime=runtime,
                             prefix_ids=list(prefix_ids), context=context, engine=engine, pace=pace)
        return SharedTrustReport.of(report, adm.owner) if adm.foreign else report

    @staticmethod
    def require_kv(adm: Admission, *, can: Sequence[str] = ("none",), why: str = "") -> None:
        """Refuse a cache whose K/V check this front-end cannot run, naming the policy.

        Raises:
            UnverifiableError: ``adm.verify.kv`` is not in ``can``.
        """
        if adm.verify.kv not in can:
            raise UnverifiableError(
                f"trust domain policy asks for a {adm.verify.kv!r} K/V check of every attached cache, which "
                f"{why or 'this front-end'} cannot run; attach through c2c serve or the library, or set the "
                f"domain's policy to kv=none (c2c keys policy)")

    # ------------------------------------------------------------------ publish
    def parents(self, domain: str, attached: Sequence[str], *, as_text: Sequence[str] = ()) -> Parents:
        """The commits a conversation of ``domain`` attached (``as_text``: those it read as text), split by
        owner: only its own are store parents, so the dependency graph, and invalidation, stay inside a domain;
        the others are named in the :data:`~c2c.commit.author.SHARED_PARENTS` label."""
        store = self.scope(domain)
        with store_errors():
            own = tuple(p for p in dict.fromkeys(attached) if store.has(p))
        return Parents(own=own, shared=tuple(p for p in dict.fromkeys(attached) if p not in own),
                       as_text=tuple(p for p in as_text if p in own))

    def signing_key(self, domain: str) -> SigningKey:
        """``domain``'s newest private key in the keyring, created (and trusted) on first use."""
        with self._key_lock:
            try:
                return self.keyring.signing_key(domain)
            except KeyringError:
                if any(e.domain == domain and e.has_private and not e.revoked for e in self.keyring.entries()):
                    raise
                return self.keyring.create_key(domain, label=self.key_label)

    def publish(self, domain: str, artifact: Artifact, *, stream: str) -> Published:
        """Sign ``artifact`` (made by :func:`~c2c.commit.author.commit_of`) for ``domain``, commit it on
        ``stream`` (the store chunks it and applies the stream's retention) and grant it to the domains its
        signed header shares it with.

        Raises:
            ConfigError: a bad stream name. QuotaExceededError, StoreWriteError: nothing was written.
        """
        t0 = time.perf_counter()
        stream = check_stream(stream)
        h = artifact.header
        share = tuple(h.shared_with)
        shared_parents = tuple(p for p in str(h.labels.get(SHARED_PARENTS, "")).split(",") if p)
        key = self.signing_key(domain) if self.keyring is not None else None  # no keyring: a team that signs nothing
        data = (sign(artifact, key) if key is not None else artifact).encode()
        t1 = time.perf_counter()
        store = self.scope(domain)
        with store_errors():
            commit = store.put(data, stream=stream)
            if share:
                store.grant(commit.id, share)
        return Published(commit=commit, key=key, nbytes=len(data), share=share, shared_parents=shared_parents,
                         timings={"sign_s": t1 - t0, "put_s": time.perf_counter() - t1})
