"""`Team` and `Agent`: agents on one base model that share a canonical prefix.

An agent holds one :class:`~c2c.conversation.Conversation`: the team's shared prefix followed by labelled
parts, one per chat message (or per cache it attached):

    [shared prefix: system turn] [role (private)] [evidence] [instruction] [conclusion] ...

It is rendered the way ``c2c serve`` renders a session (:func:`c2c.conversation.render.render`): the model's
own chat template, turn by turn where the template is prefix-stable (checked once per model), else the whole
conversation re-rendered and the cache reused up to the first token that differs (an agent holding a cache it
attached cannot be re-rendered whole: on such a template it is refused by name, never given other tokens). So span boundaries are exact,
every agent of the team produces identical prefix tokens, and an agent's tokens are those a server would
render for its messages. The agent keeps the KV-cache of its whole conversation and grows it incrementally:
reading is a prefill of only the new tokens.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Sequence

from c2c.artifact import Artifact
from c2c.artifact.fingerprint import Fingerprint
from c2c.artifact.prefix import PrefixRef, SharedPrefix
from c2c.commit.author import Parents, commit_of
from c2c.context import Context
from c2c.conversation import Conversation, Message, Part
from c2c.conversation.render import render, template_stability, turn
from c2c.conversation.decode import Sampling, generate
from c2c.conversation.editing import drop_parts
from c2c.conversation.reuse import common_prefix, extend, truncate
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
        system = Message(role="system", content=team.shared.text())
        # the one record of what the agent has read and said: its parts' tokens are exactly what ``cache`` holds
        self.conversation = Conversation(parts=(Part(label="prefix", token_ids=team.prefix_tokens(runtime),
                                                     message=system),))
        self._cache: KVCache = team.prefix_cache(runtime)   # a prefix of the conversation (see ``cache``)
        self.stats = Stats()
        self._role_done = not role

    # ------------------------------------------------------------ identity
    @property
    def fingerprint(self) -> Fingerprint:
        return Fingerprint.of(self.runtime)

    @property
    def prefix(self) -> PrefixRef:
        return PrefixRef.of(self.conversation.prefix_ids)

    @property
    def context(self) -> Context:
        """The conversation's tokens and labelled spans (one per part after the prefix)."""
        return self.conversation.context()

    @property
    def messages(self) -> list[dict[str, str]]:
        """The chat messages the conversation renders, the system message first (for paths that re-render it:
        the text fallback, fusers); a cache attached from another agent is no message of this one."""
        return [{"role": m.role, "content": m.content} for m in self.history]

    @property
    def history(self) -> tuple[Message, ...]:
        """The chat messages of :attr:`messages` as the conversation holds them (labels and privacy too)."""
        return tuple(p.message for p in self.conversation.parts if p.message is not None)

    @property
    def cache(self) -> KVCache:
        """The K/V of exactly the conversation's tokens. A reply's own message (its last token and the template's
        end of turn) is fed when the cache is next needed, in the pass that reads what comes next."""
        self._cache = self._fed(self.conversation, self._cache)
        return self._cache

    # ------------------------------------------------------------- reading
    def _after(self, said: Sequence[Message]) -> Conversation:
        """The conversation with ``said`` after it, rendered as :func:`~c2c.conversation.render.render` renders
        it: turn by turn where the template is prefix-stable (checked once per model), else whole."""
        rt, parts = self.runtime, self.conversation.parts
        if template_stability(rt).stable:
            return Conversation(parts=parts + tuple(turn(rt, m) for m in said))
        if any(p.message is None for p in parts[1:]):
            raise RuntimeUnsupportedError(
                f"{template_stability(rt).reason}; {self.name} holds an attached cache, which a whole re-rendering "
                "cannot place: attach to an agent on a model with a prefix-stable template, or hand off as text")
        grown = render(rt, [p.message for p in parts] + list(said), generation_prompt=False)
        if grown.prefix_ids != self.conversation.prefix_ids:
            raise RuntimeUnsupportedError(f"{template_stability(rt).reason}; rendered whole, its shared prefix is "
                                          "not the team's: hand off as text")
        return grown

    def _fed(self, conversation: Conversation, cache: KVCache) -> KVCache:
        """``cache`` made to hold exactly ``conversation``'s tokens (:func:`c2c.conversation.reuse.extend`: cut
        where they differ, what it lacks prefilled)."""
        t0 = time.perf_counter()
        cache, n = extend(self.runtime, cache, conversation.token_ids)
        if n:
            self.stats = self.stats.plus(prefilled=n, prefill_s=time.perf_counter() - t0)
        return cache

    def _feed(self, said: Sequence[Message]) -> None:
        grown = self._after(said)
        cache = self._fed(grown, self._cache)
        self.conversation, self._cache = grown, cache   # both, once the prefill is done

    def read_role(self) -> None:
        """Prefill the private role turn now (it is otherwise done before the first own turn)."""
        self._ensure_role()

    def _ensure_role(self) -> None:
        if not self._role_done:
            self._role_done = True
            self._feed([Message(role="user", content=self.role, name="role")])

    def read(self, text: str, *, label: str = "evidence", private: bool | None = None) -> None:
        """Append ``text`` as a user turn (after the private role turn) and prefill it."""
        self._ensure_role()
        self._feed([Message(role="user", content=text, name=label, private=private)])

    # ------------------------------------------------------------- writing
    def respond(self, instruction: str, *, max_new_tokens: int = 64, min_new_tokens: int = 0,
                label: str = "conclusion") -> Generation:
        """Greedy reply to ``instruction``; the reply joins the conversation as the assistant's message, span
        ``label`` (its end-of-turn tokens included, as the template writes the message)."""
        self._ensure_role()
        asked = self._after([Message(role="user", content=instruction, name="instruction", private=False)])
        target = asked.token_ids + tuple(self.runtime.encode(self.runtime.generation_prompt()))
        cache = truncate(self._cache, common_prefix(self._cache.token_ids, target))   # None: nothing reusable
        ids = target[cache.seq_len if cache is not None else 0:]
        # the one decode loop (c2c serve's): greedy, the end of turn banned for the first min_new_tokens
        d = generate(self.runtime, cache, ids, Sampling(max_tokens=max_new_tokens, temperature=0.0,
                                                        min_tokens=min(min_new_tokens, max_new_tokens)))
        self.stats = self.stats.plus(prefilled=len(ids), decoded=d.completion_tokens,
                                     prefill_s=d.prefill_s, decode_s=d.decode_s)
        self.conversation = asked
        # The reply joins as the assistant's message, as the template writes it; the cache holds every generated
        # token but the last, and the rest of the message is fed when the cache is next needed (:attr:`cache`).
        self.conversation, self._cache = self._after([Message(role="assistant", content=d.text, name=label)]), d.cache
        return Generation(token_ids=d.token_ids, cache=d.cache, prefill_s=d.prefill_s, decode_s=d.decode_s,
                          text=d.text)

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
        parts = self.conversation.parts
        chosen = [i for i, p in enumerate(parts) if i and p.label in labels]
        if not chosen:
            raise ConfigError(f"no span labelled {list(labels)}; this context has {[p.label for p in parts[1:]]}")
        self.conversation, self._cache, step = drop_parts(self.runtime, self.conversation, self.cache, chosen,
                                                         reposition=reposition, repair=repair)
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

    def commit(self, *, labels: tuple[str, ...] | None = None, withhold_tokens: bool = False,
               parents: Parents = Parents(), isolation: str | None = None,
               share: tuple[str, ...] = ()) -> "Artifact":
        """The unsigned commit of the whole cache (``labels=None``) or of the slice covering the spans
        ``labels`` (:func:`c2c.commit.author.commit_of`, as every front-end makes one); see :meth:`export`."""
        cache, span_labels = self.export_cache(labels=labels, isolation=isolation)
        return commit_of(self.conversation, cache=cache, fingerprint=self.fingerprint,
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
    def adopt(self, cache: KVCache, *, label: str, messages: Sequence[Message] = ()) -> None:
        """Continue from ``cache`` (a whole context for this model, starting with our shared prefix).

        ``messages`` (another agent's :attr:`history`, the system message first), where known, are what its tokens
        say: where this
        agent renders them into exactly those tokens, the conversation takes them message by message (their
        labels kept: a later drop or slice can name them); else it is one part labelled ``label``.

        Raises:
            HandoffError: the cache does not start with this agent's shared prefix tokens.
        """
        prefix = self.conversation.prefix_ids
        try:
            placement.require_continues(cache, prefix)   # the one rule (c2c.runtime.placement): K/V kept whole
        except HandoffError as e:
            raise HandoffError(f"{self.name} cannot adopt this cache: {e}") from None
        self._cache = cache
        said = list(messages)
        whole = render(self.runtime, said, generation_prompt=False) if said and said[0].role == "system" else None
        if whole is not None and whole.token_ids == tuple(cache.token_ids) and whole.prefix_ids == prefix:
            self.conversation = whole
        else:
            self.conversation = Conversation(parts=self.conversation.parts[:1]).after_prefix(
                [self._attached(cache.token_ids[len(prefix):], label)])
        self._role_done = not self.role

    def _attached(self, token_ids: Sequence[int], label: str) -> Part:
        """A part holding another agent's tokens: no message of this one; its text is its tokens decoded."""
        return Part(label=label, token_ids=tuple(token_ids), private=False,
                    text=self.runtime.decode(list(token_ids)).strip())

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
        h.prefix.require_match(self.conversation.prefix_ids)
        cache = artifact.cache
        self.attach_note = ""
        try:
            self.fingerprint.require_same(h.fingerprint, engine=engine)
        except FingerprintMismatchError as e:  # another role adapter of the same base?
            cache, self.attach_note = admit(self.team.adapter_policy, self.runtime, artifact, e, context=self.cache)
        self._place(cache, full=h.kind == "full", source=h.producer.get("agent", "?"))

    def attach_cache(self, cache: KVCache, *, fingerprint, prefix, source: str,
                     messages: Sequence[Message] = ()) -> None:
        """Continue from another agent's cache in this process, shared as it is (no bytes, no copy).

        The same checks as :meth:`attach` for model and prefix; a KVCache is never written in
        place, so both agents keep what they had (copy-on-write by construction).

        ``messages``: what a whole cache's tokens say, where known (see :meth:`adopt`).

        Raises:
            FingerprintMismatchError, PrefixMismatchError.
        """
        prefix.require_match(self.conversation.prefix_ids)
        self.fingerprint.require_same(fingerprint)
        self.attach_note = ""
        self._place(cache, full=cache.start == 0, source=source, messages=messages)

    def _place(self, cache: KVCache, *, full: bool, source: str, messages: Sequence[Message] = ()) -> None:
        if full:
            self.adopt(cache, label=f"from:{source}", messages=messages)
        else:
            held = self.cache
            self._cache = placement.append(self.runtime, held, cache, at=held.end)
            self.conversation = Conversation(parts=self.conversation.parts
                                             + (self._attached(cache.token_ids, f"from:{source}"),))

