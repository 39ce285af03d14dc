"""`Team` and `Agent`: agents on one base model that share a canonical prefix.

An agent's context is the team's shared prefix followed by labelled turns:

    [shared prefix: system turn] [role (private)] [evidence] [conclusion] ...

Each turn is rendered with the model's chat template and tokenized on its own,
so span boundaries are exact and every agent of the team produces identical
prefix tokens. The agent keeps the KV-cache of its whole context and grows it
incrementally: reading is a prefill of only the new tokens.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from c2c.artifact import Artifact
from c2c.artifact.fingerprint import Fingerprint
from c2c.artifact.prefix import PrefixRef, SharedPrefix
from c2c.commit.author import Parents, commit_of
from c2c.context import Context
from c2c.conversation import Conversation
from c2c.errors import ConfigError, FingerprintMismatchError, HandoffError, RuntimeUnsupportedError
from c2c.runtime import edit, placement
from c2c.runtime.protocol import Generation, Runtime
from c2c.runtime.kvcache import EditStep, KVCache
from c2c.team.roles import AdapterPolicy, admit
from c2c.trust.isolation import ISOLATIONS, cut_slice
from c2c.trust.signing import sign


@dataclass(eq=False)
class Team:
    """Agents that share a model family, a trust domain and a canonical prefix."""

    shared: SharedPrefix
    domain: str = "default"
    adapter_policy: AdapterPolicy = field(default_factory=AdapterPolicy)
    # With a keyring, senders sign every exported cache with the domain's key and
    # receivers check signature, prefix and KV per the domain's policy (c2c.trust).
    keyring: Any = None
    _prefix: dict = field(default_factory=dict, repr=False)

    def prefix_tokens(self, runtime: Runtime) -> tuple[int, ...]:
        return self.shared.token_ids(runtime)

    def prefix_cache(self, runtime: Runtime) -> KVCache:
        """The KV of the shared prefix for ``runtime``, computed once per model and reused."""
        key = (id(runtime), runtime.name, runtime.adapters)  # an adapter changes every K/V
        if key not in self._prefix:
            _, cache = runtime.prefill(self.prefix_tokens(runtime))
            self._prefix[key] = cache
        return self._prefix[key]


@dataclass(frozen=True, kw_only=True)
class Stats:
    """Work an agent did: tokens prefilled and decoded, and seconds spent."""

    prefilled: int = 0
    decoded: int = 0
    prefill_s: float = 0.0
    decode_s: float = 0.0

    def plus(self, *, prefilled: int = 0, decoded: int = 0, prefill_s: float = 0.0, decode_s: float = 0.0) -> "Stats":
        return Stats(prefilled=self.prefilled + prefilled, decoded=self.decoded + decoded,
                     prefill_s=self.prefill_s + prefill_s, decode_s=self.decode_s + decode_s)


class Agent:
    """One agent: a runtime, a private role prompt, and its growing context + cache."""

    def __init__(self, name: str, runtime: Runtime, team: Team, *, role: str = ""):
        self.name = name
        self.runtime = runtime
        self.team = team
        self.role = role
        prefix = team.prefix_tokens(runtime)
        self.context = Context(token_ids=prefix, prefix_len=len(prefix))
        self.cache: KVCache = team.prefix_cache(runtime)
        self.stats = Stats()
        self._role_done = not role
        # The conversation as text, for paths that re-render it (text fallback, fusers).
        self.messages: list[dict[str, str]] = [{"role": "system", "content": team.shared.text()}]

    # ------------------------------------------------------------ identity
    @property
    def fingerprint(self) -> Fingerprint:
        return Fingerprint.of(self.runtime)

    @property
    def prefix(self) -> PrefixRef:
        return PrefixRef.of(self.context.token_ids[: self.context.prefix_len])

    # ------------------------------------------------------------- reading
    def _feed(self, text: str, label: str, *, role: str = "user", private: bool | None = None) -> None:
        ids = self.runtime.encode(self.runtime.render_turn(role, text))
        t0 = time.perf_counter()
        _, self.cache = self.runtime.prefill(ids, self.cache)
        self.stats = self.stats.plus(prefilled=len(ids), prefill_s=time.perf_counter() - t0)
        self.context = self.context.extend(ids, label, private=private)
        self.messages.append({"role": role, "content": text})

    def read_role(self) -> None:
        """Prefill the private role turn now (it is otherwise done before the first own turn)."""
        self._ensure_role()

    def _ensure_role(self) -> None:
        if not self._role_done:
            self._role_done = True
            self._feed(self.role, "role")

    def read(self, text: str, *, label: str = "evidence", private: bool | None = None) -> None:
        """Append ``text`` as a user turn (after the private role turn) and prefill it."""
        self._ensure_role()
        self._feed(text, label, private=private)

    # ------------------------------------------------------------- writing
    def respond(self, instruction: str, *, max_new_tokens: int = 64, min_new_tokens: int = 0,
                label: str = "conclusion") -> Generation:
        """Greedy reply to ``instruction``; the reply joins the context as span ``label``."""
        self._ensure_role()
        ids = self.runtime.encode(self.runtime.render_turn("user", instruction) + self.runtime.generation_prompt())
        gen = self.runtime.generate(ids, self.cache, max_new_tokens=max_new_tokens, min_new_tokens=min_new_tokens)
        self.stats = self.stats.plus(prefilled=len(ids), decoded=len(gen.token_ids),
                                     prefill_s=gen.prefill_s, decode_s=gen.decode_s)
        self.context = self.context.extend(ids, "instruction", private=False)
        # The cache holds every generated token but the last; the context records them all.
        self.cache = gen.cache
        self.context = self.context.extend(gen.token_ids[:-1], label)
        self.messages += [{"role": "user", "content": instruction}, {"role": "assistant", "content": gen.text}]
        return gen

    def exportable_labels(self) -> tuple[str, ...]:
        """Labels of the non-private spans after the last private one (what a minimized slice holds)."""
        spans = self.context.spans
        last_private = max((i for i, s in enumerate(spans) if s.private), default=-1)
        return tuple(dict.fromkeys(s.label for s in spans[last_private + 1:]))

    # ------------------------------------------------------------- editing
    def drop(self, *labels: str, reposition: bool = True, repair: str | None = None) -> EditStep:
        """Take the spans labelled ``labels`` out of the context and its cache, without a prefill
        (:func:`c2c.runtime.edit.drop`: the tokens after them are re-positioned, or the gaps left open, and
        ``repair`` recomputes some). The cache is then approximate (:attr:`KVCache.exact` is False), and so is
        what :meth:`export` publishes from it: its header records the edit.

        Raises:
            ConfigError: no span has these labels, or one is the shared prefix's.
        """
        chosen = [i for i, s in enumerate(self.context.spans) if s.label in labels]
        if not chosen:
            raise ConfigError(f"no span labelled {list(labels)}; this context has "
                              f"{[s.label for s in self.context.spans]}")
        if len(self.messages) != len(self.context.spans) + 1:
            raise RuntimeUnsupportedError(
                f"{self.name}'s messages no longer line up with its spans (an attached cache adds a span, not a "
                "message), so dropping spans would leave its text history wrong; drop before attaching")
        spans = [(self.context.spans[i].start, self.context.spans[i].end) for i in chosen]
        self.cache, step = edit.drop(self.runtime, self.cache, spans, reposition=reposition, repair=repair)
        self.context = self.context.without(chosen)
        # one message per span after the system message (a reply's instruction and answer are two of each)
        gone = set(chosen)
        self.messages = [m for j, m in enumerate(self.messages) if j - 1 not in gone]
        return step

    # ------------------------------------------------------------ exporting
    def export_cache(self, *, labels: tuple[str, ...] | None = None,
                     isolation: str | None = None) -> tuple[KVCache, dict[str, str]]:
        """The cache :meth:`export` would put in an artifact, and its span labels (no bytes, no digest).

        An in-process handoff (:class:`~c2c.handoff.transport.SharedTransport`) hands this over as it is.
        """
        if isolation is not None and isolation not in ISOLATIONS:
            raise ConfigError(f"isolation={isolation!r}: use 'recompute' or 'positions'")
        cache, _ = edit.close_gaps(self.runtime, self.cache)  # positions left open by drop(reposition=False)
        span_labels = {}
        if labels is not None:
            t0 = time.perf_counter()
            cache, isolation, recomputed = cut_slice(self.runtime, cache, self.context, labels, isolation=isolation,
                                                     prefix_cache=lambda: self.team.prefix_cache(self.runtime))
            if recomputed:
                self.stats = self.stats.plus(prefilled=cache.seq_len, prefill_s=time.perf_counter() - t0)
            span_labels = {"span": ",".join(labels), "isolation": isolation}
        return cache, span_labels

    def conversation(self) -> Conversation:
        """The context as a :class:`~c2c.conversation.Conversation`: one part per span, saying its message
        (``label: text``), or, where the spans no longer line up with the messages (a cache was attached), its
        tokens decoded."""
        spans, ids = self.context.spans, self.context.token_ids
        if len(self.messages) == len(spans) + 1:
            texts = [f"{s.label}: {m['content']}" for s, m in zip(spans, self.messages[1:])]
        else:
            texts = [self.runtime.decode(ids[s.start:s.end]).strip() for s in spans]
        return Conversation.of_context(self.context, texts)

    def commit(self, *, labels: tuple[str, ...] | None = None, withhold_tokens: bool = False,
               parents: Parents = Parents(), isolation: str | None = None,
               share: tuple[str, ...] = ()) -> "Artifact":
        """The unsigned commit of the whole cache (``labels=None``) or of the slice covering the spans
        ``labels`` (:func:`c2c.commit.author.commit_of`, as every front-end makes one); see :meth:`export`."""
        cache, span_labels = self.export_cache(labels=labels, isolation=isolation)
        conversation = self.conversation()
        return commit_of(conversation, cache=cache, fingerprint=self.fingerprint,
                         producer={"agent": self.name, "domain": self.team.domain}, labels=labels or (),
                         isolation=span_labels.get("isolation"), parents=parents, share=share,
                         withhold_tokens=withhold_tokens)

    def export(self, *, labels: tuple[str, ...] | None = None, withhold_tokens: bool = False,
               parents: tuple[str, ...] = (), isolation: str | None = None,
               share: tuple[str, ...] = ()) -> "Artifact":
        """The whole cache (``labels=None``) or the slice covering the spans ``labels``, signed with the
        team's domain key where it has a keyring (an artifact file, or a handoff without a store).

        A slice never includes private spans (see :meth:`Context.export_range`).
        ``isolation`` says how the slice is cut (:mod:`c2c.trust.isolation`):

        - ``"recompute"``: the slice's tokens are re-prefilled after the team's
          shared prefix only, so it sits at ``[prefix_len, prefix_len + n)``,
          carries no trace of earlier spans in any layer, and a receiver can
          verify it against its own prefix cache. Costs one prefill of ``n``.
        - ``"positions"``: the sender's K/V at their original positions (no
          compute); above layer 0 they leak earlier spans through attention,
          and receivers can verify only layer 0.
        - ``None`` (default): ``"recompute"`` when a private span precedes the
          slice, else ``"positions"``.

        The mode is recorded in the artifact's labels (``{"isolation": ...}``);
        a whole cache (``labels=None``) is exported as it is. ``share`` names other trust domains that may
        attach it (signed in the header, :data:`c2c.artifact.header.SHARE_KEY`). ``parents``: the commits it
        builds on, all of the team's domain (through a store, :func:`c2c.flows.chain.publish` splits them by owner).
        """
        artifact = self.commit(labels=labels, withhold_tokens=withhold_tokens, parents=Parents(own=tuple(parents)),
                               isolation=isolation, share=share)
        if self.team.keyring is not None:
            artifact = sign(artifact, self.team.keyring.signing_key(self.team.domain))
        return artifact

    # ------------------------------------------------------------ attaching
    def adopt(self, cache: KVCache, *, label: str) -> None:
        """Continue from ``cache`` (a whole context for this model, starting with our shared prefix).

        Raises:
            HandoffError: the cache does not start with this agent's shared prefix tokens.
        """
        P = self.context.prefix_len
        prefix = self.context.token_ids[:P]
        try:
            placement.require_continues(cache, prefix)   # the one rule (c2c.runtime.placement): K/V kept whole
        except HandoffError as e:
            raise HandoffError(f"{self.name} cannot adopt this cache: {e}") from None
        self.cache = cache
        self.context = Context(token_ids=prefix, prefix_len=P).extend(cache.token_ids[P:], label, private=False)
        self._role_done = not self.role

    def attach(self, artifact: "Artifact", *, engine: bool = True) -> None:
        """Continue from a received cache after checking model and prefix.

        A full cache replaces this agent's context (it must start with the same
        shared prefix); a slice is re-positioned to follow this agent's context.

        A cache made under another role adapter of the same base is handled by
        the team's :class:`~c2c.team.roles.AdapterPolicy` (``attach_note`` says what
        was done).

        ``engine=False``: the artifact may come from another engine (vLLM) with this model's
        weights, dtype and shapes; only for a cache :func:`c2c.handoff.decide` allowed across
        engines and whose K/V were verified (:func:`c2c.handoff.cross_engine.enforce`).

        Raises:
            FingerprintMismatchError: the artifact comes from another model.
            PrefixMismatchError: the shared prefix differs.
        """
        h = artifact.header
        h.prefix.require_match(self.context.token_ids[: self.context.prefix_len])
        cache = artifact.cache
        self.attach_note = ""
        try:
            self.fingerprint.require_same(h.fingerprint, engine=engine)
        except FingerprintMismatchError as e:  # another role adapter of the same base?
            cache, self.attach_note = admit(self.team.adapter_policy, self.runtime, artifact, e, context=self.cache)
        self._place(cache, full=h.kind == "full", source=h.producer.get("agent", "?"))

    def attach_cache(self, cache: KVCache, *, fingerprint, prefix, source: str) -> None:
        """Continue from another agent's cache in this process, shared as it is (no bytes, no copy).

        The same checks as :meth:`attach` for model and prefix; a KVCache is never written in
        place, so both agents keep what they had (copy-on-write by construction).

        Raises:
            FingerprintMismatchError, PrefixMismatchError.
        """
        prefix.require_match(self.context.token_ids[: self.context.prefix_len])
        self.fingerprint.require_same(fingerprint)
        self.attach_note = ""
        self._place(cache, full=cache.start == 0, source=source)

    def _place(self, cache: KVCache, *, full: bool, source: str) -> None:
        if full:
            self.adopt(cache, label=f"from:{source}")
        else:
            self.cache = placement.append(self.runtime, self.cache, cache, at=self.cache.end)
            self.context = self.context.extend(cache.token_ids, f"from:{source}", private=False)
