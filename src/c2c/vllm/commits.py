"""The connector's two exchanges with the store, off vLLM's engine loop: check an attach, make a publish.

:class:`Attacher` (scheduler side) rules on ``{"attach": ID, "mode": ...}`` for one
request's prompt through the one gate every front-end uses (:class:`c2c.handoff.gate.Gate`,
as ``c2c serve``'s :class:`c2c.serve.exchange.Exchange` and the library's
:func:`c2c.flows.chain.pull` do): locate (own or granted, one "not visible" answer), read,
signature, domain and share list from the signed header, :func:`c2c.handoff.decide`, redaction
of another domain's record, and the one fall-back rule. The commit is the sender (its
fingerprint, the prefix it covers, domain and share list from the signed header) and the
instance the receiver (its fingerprint, the request's own prompt tokens).

The connector runs no K/V re-computation: where the receiving domain's stored policy asks for
a sampled or strict K/V check (``c2c keys policy``), the cache is refused, naming the policy
(:meth:`Gate.require_kv`), never silently accepted.

``full`` gets the cache or the first failed check's error; ``auto`` gets the cache or an
ordinary prefill, with the reason, where a check failed or the store is down
(the gate's one rule, :meth:`c2c.handoff.gate.Receiver.falls_back`: the prompt holds the text itself);
``text`` is that prefill, asked for (the commit still checked, its record kept). No mode falls back from
:data:`c2c.handoff.gate.FATAL`: a malformed or invisible id,
bytes or a signature that do not verify, and stored chunks that no longer hash to their
digests (:class:`~c2c.errors.StoreCorruptError`): tampering is reported (422
``store_corrupt``, as ``c2c serve`` answers it in every mode), never prefilled over in
silence. What may be loaded is a prefix of the prompt: the commit's tokens must begin the
prompt. With the ``longest`` prefix policy an ``auto`` attach loads the longest run of whole
16-token blocks the two share (at least one); ``full`` and the ``exact`` policy need all of
them. A verified commit's K/V are staged (:mod:`c2c.vllm.staging`) in the run directory for
the worker to load.

:class:`Publisher` (worker side) turns a finished request's K/V into a signed artifact,
commits it on the instance's domain's stream and settles the request's ticket.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

from c2c.artifact.fingerprint import Fingerprint
from c2c.artifact.prefix import PrefixRef, declared_prefix_len
from c2c.commit.author import commit_of
from c2c.conversation import Conversation
from c2c.errors import C2CError, ConfigError, EditedCacheError, HandoffError
from c2c.handoff.decide import Party
from c2c.handoff.gate import Gate, Receiver
from c2c.handoff.policy import HandoffPolicy
from c2c.runtime.kvcache import KVCache
from c2c.store.interface import check_id, check_stream
from c2c.store.url import open_store
from c2c.trust.isolation import check_share
from c2c.trust.keys import Keyring, SigningKey
from c2c.trust.verify_policy import VerifyPolicy
from c2c.vllm import staging, tickets

log = logging.getLogger("vllm.c2c")  # a child of vLLM's logger: its lines reach vLLM's log, with its format
MODES = ("auto", "full", "text")
@dataclass(frozen=True, kw_only=True)
class Request:
    """The c2c part of one request's ``kv_transfer_params``: ``{"c2c": {...}}``."""

    attach: str | None = None
    mode: str = "auto"
    publish: bool = False
    stream: str | None = None
    parents: tuple[str, ...] = ()
    share: tuple[str, ...] = ()
    ticket: str | None = None  # set by the middleware for a streamed reply (see c2c.vllm.tickets)

    @classmethod
    def parse(cls, params: Any) -> "Request | None":
        """None when the request carries no ``c2c`` field.

        Raises:
            ConfigError: a ``c2c`` field of the wrong shape (named in the message).
        """
        if not isinstance(params, dict) or "c2c" not in params:
            return None
        c = params["c2c"]
        if not isinstance(c, dict) or set(c) - {"attach", "mode", "publish", "ticket"}:
            raise ConfigError('kv_transfer_params.c2c takes {"attach": ID, "mode": "auto"|"full"|"text", '
                              '"publish": {"stream": S, "parents": [IDS], "share": [DOMAINS]}}')
        attach, mode, ticket = c.get("attach"), c.get("mode", "auto"), c.get("ticket")
        if ticket is not None:
            tickets.check_ticket(ticket)
        if attach is not None:
            check_id(attach, "kv_transfer_params.c2c.attach")
        if mode not in MODES:
            raise ConfigError(f"kv_transfer_params.c2c.mode must be one of {MODES}, not {str(mode)[:20]!r}")
        pub = c.get("publish")
        if pub is None or pub is False:
            return cls(attach=attach, mode=mode, ticket=ticket)
        if pub is True:
            pub = {}
        if not isinstance(pub, dict) or set(pub) - {"stream", "parents", "share"}:
            raise ConfigError('kv_transfer_params.c2c.publish takes {"stream": S, "parents": [IDS], '
                              '"share": [DOMAINS]}')
        stream = pub.get("stream")
        if stream is not None:
            check_stream(stream)
        parents = pub.get("parents") or []
        if not isinstance(parents, list) or len(parents) > 64:
            raise ConfigError("kv_transfer_params.c2c.publish.parents must be a list of at most 64 commit ids")
        share = check_share(pub.get("share") or [], field="kv_transfer_params.c2c.publish.share")
        return cls(attach=attach, mode=mode, publish=True, stream=stream, ticket=ticket,
                   parents=tuple(check_id(p, "a publish parent") for p in parents), share=share)


@dataclass(frozen=True, kw_only=True)
class Verdict:
    """The ruling on one attach.

    Attributes:
        load_tokens: how many leading tokens of the prompt the commit's K/V may fill (0: none).
        staged: the verified K/V the request may load, staged for the worker (None unless loading).
        record: what the reply's ``kv_transfer_params.c2c.attach`` says.
        error: ``{"type", "message"}`` when the request must fail (any mode: a bad or invisible id,
            a tampered commit or stored chunk; ``full``: any refusal).
    """

    commit: str
    load_tokens: int = 0
    staged: str | None = None
    record: dict = field(default_factory=dict)
    error: dict | None = None


def error_dict(e: C2CError) -> dict[str, str]:
    return {"type": type(e).__name__, "message": str(e)}


class _Scope:
    """One store connection and the gate over it per process, used from the connector's own thread."""

    def __init__(self, *, store_url: str | None, domain: str, keyring: Keyring):
        self.store_url, self.domain, self.keyring = store_url, domain, keyring
        self._gate: Gate | None = None
        self._lock = threading.Lock()

    @property
    def gate(self) -> Gate:
        with self._lock:
            if self._gate is None:
                # no K/V floor of its own: the domain's stored policy rules, and the connector refuses what it
                # cannot run (Gate.require_kv)
                self._gate = Gate(open_store(self.store_url), self.keyring, verify=VerifyPolicy(kv="none"),
                                  key_label="c2c vllm")
            return self._gate

    @property
    def store(self):
        """The instance's domain's part of the store."""
        return self.gate.scope(self.domain)

    def close(self) -> None:
        with self._lock:
            if self._gate is not None:
                self._gate.store.close()
                self._gate = None


class Attacher(_Scope):
    """Rules on attaches for one instance (see the module docstring)."""

    def __init__(self, *, store_url: str | None, domain: str, keyring: Keyring, fingerprint: Fingerprint,
                 staging: Path, agent: str = "vllm", prefix_policy: str = "longest", max_hops: int | None = None):
        super().__init__(store_url=store_url, domain=domain, keyring=keyring)
        self.fingerprint, self.staging, self.agent = fingerprint, staging, agent
        self.prefix_policy, self.max_hops = prefix_policy, max_hops

    def admit(self, commit_id: str, mode: str, prompt_ids: Sequence[int], *, request_id: str = "") -> Verdict:
        """Fetch, verify and decide ``commit_id`` for a prompt; never raises a :class:`C2CError`."""
        t0 = time.perf_counter()
        record: dict[str, Any] = {"commit": commit_id, "requested": mode}
        matched = 0

        def match(header) -> tuple[PrefixRef, PrefixRef]:
            nonlocal matched
            theirs, ours, matched = self._prefixes(header, prompt_ids, mode)
            return theirs, ours

        party = Party(name=self.agent, domain=self.domain, fingerprint=self.fingerprint,
                      prefix=PrefixRef.of(list(prompt_ids)))
        receiver = Receiver(party=party, policy=HandoffPolicy(mode=mode, max_hops=self.max_hops),
                            match=match, prompt_holds_text=True)
        try:
            adm = self.gate.admit(check_id(commit_id, "kv_transfer_params.c2c.attach"), receiver)
            h = adm.artifact.header
            if adm.path == "cache":
                try:
                    if h.kind != "full":
                        raise HandoffError(f"commit {adm.commit[:12]} is a slice (positions {h.start}..{h.end}); "
                                           "vLLM attaches whole caches only")
                    if h.edit is not None:
                        raise EditedCacheError(
                            f"commit {adm.commit[:12]} was edited without a prefill (messages dropped), so its K/V are "
                            "approximate, and vLLM's prefix cache would hand them to later requests of the same "
                            "tokens as exact; the connector loads exact commits only: attach it through c2c serve, "
                            "or send its text")
                    self.gate.require_kv(adm, why="vLLM's connector (it holds no second copy of the model to "
                                                  "re-compute K/V with)")
                except C2CError as e:
                    adm = adm.fall_back(e)  # raises in full
            # ``tokens``: the commit's tokens the request holds (as c2c serve counts them): those it loads on the
            # cache path; on the text path the whole commit where the prompt continues it, else none
            held = list(prompt_ids[:h.seq_len]) == list(h.tokens or ())
            record.update(adm.record(), used="full" if adm.path == "cache" else "text",
                          tokens=matched if adm.path == "cache" else h.seq_len if held else 0,
                          commit_tokens=h.seq_len, matched_tokens=matched)
            staged = None
            if adm.path == "cache":  # only what the request may load, verified: no hashing on the forward path
                staged = str(self.staging / f"{request_id or adm.commit}.{time.monotonic_ns()}.kv")
                staging.stage(staged, adm.commit, adm.artifact.cache, matched)
            record["timings"] = {**adm.timings, "check_s": time.perf_counter() - t0 - sum(adm.timings.values())}
            return Verdict(commit=adm.commit, load_tokens=matched if staged else 0, staged=staged, record=record)
        except C2CError as e:
            if receiver.falls_back(e, mode):
                log.warning("c2c attach %s: %s; prefilling instead", commit_id[:12], e)
                record.update(path="text", used="text", reason=f"fell back to prefill: {type(e).__name__}: {e}")
                return Verdict(commit=commit_id, record=record)
            record.update(path="error", used="error", reason=f"{type(e).__name__}: {e}")
            return Verdict(commit=commit_id, record=record, error=error_dict(e))

    # ----------------------------------------------------------------- helpers
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
    """Commits finished requests' K/V for one instance (see the module docstring).

    ``model_dir``: the served model's folder, whose tokenizer and chat template declare each commit's shared
    prefix (BOS and the system turn its tokens open on, :func:`c2c.artifact.prefix.declared_prefix_len`) and
    read the rest as its text; None (no tokenizer at hand): no prefix declared, no text kept.
    """

    def __init__(self, *, store_url: str | None, domain: str, keyring: Keyring, fingerprint: Fingerprint,
                 run_dir: Path, agent: str = "vllm", model_dir: Path | None = None):
        super().__init__(store_url=store_url, domain=domain, keyring=keyring)
        self.fingerprint, self.run_dir, self.agent, self.model_dir = fingerprint, run_dir, agent, model_dir
        self._text = None

    def conversation(self, token_ids: Sequence[int]) -> Conversation:
        """A request's tokens as a conversation: its declared shared prefix, then the rest, read as text."""
        if self.model_dir is None:
            return Conversation.of_tokens(token_ids, prefix_len=0)
        if self._text is None:
            from c2c.runtime.transformers.tokenizer import TemplateText  # lazy: loaded on the first publish

            self._text = TemplateText(self.model_dir)
        P = declared_prefix_len(self._text, token_ids)
        return Conversation.of_tokens(token_ids, prefix_len=P, text=self._text.decode(token_ids[P:]).strip())

    def publish(self, cache: KVCache, *, ticket: str, stream: str | None, parents: Sequence[str] = (),
                request_id: str = "", share: Sequence[str] = ()) -> dict:
        """Sign and commit ``cache`` (granted to the domains in ``share``); settle ``ticket`` with the commit
        (or the error). Never raises."""
        t0 = time.perf_counter()
        try:
            producer = {"agent": self.agent, "domain": self.domain, "engine": "vllm"}
            if request_id:
                producer["request"] = request_id[:200]
            artifact = commit_of(self.conversation(cache.token_ids), cache=cache, fingerprint=self.fingerprint,
                                 producer=producer, parents=self.gate.parents(self.domain, parents), share=share)
            t1 = time.perf_counter()
            done = self.gate.publish(self.domain, artifact, stream=stream or self.agent)
            outcome = {**done.record(), "tokens": cache.seq_len,
                       "timings": {"build_s": t1 - t0 + done.timings["sign_s"], "put_s": done.timings["put_s"]}}
        except C2CError as e:
            log.warning("c2c publish of %s failed: %s", request_id, e)
            outcome = {"error": error_dict(e)}
        tickets.settle(self.run_dir, ticket, outcome)
        return outcome

    def signing_key(self) -> SigningKey:
        """The domain's newest private key, created (and trusted) on first use, as ``c2c serve`` does."""
        return self.gate.signing_key(self.domain)
