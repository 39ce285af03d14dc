"""One commit author: :func:`commit_of` makes the artifact of a conversation for every front-end.

The library (:meth:`c2c.team.agent.Agent.commit`), ``c2c serve`` (:meth:`c2c.serve.exchange.Exchange.publish`)
and vLLM's publisher (:meth:`c2c.vllm.commits.Publisher.publish`) each hold a
:class:`~c2c.conversation.Conversation` and the K/V to commit; the header's fields mean the same whoever wrote it:

=====================  ==============================================================================
``prefix``             the conversation's part 0 (BOS and the system turn), as :func:`c2c.handoff.decide`
                       compares it with the receiver's
``extra[TEXT_KEY]``    the text of the parts the commit covers (never the prefix's), oldest cut first
                       past :data:`MAX_TEXT_BYTES`: what a receiver that may not take the K/V reads instead
``labels["span"]``     the labels of a slice's parts, and how it was cut (``isolation``)
``parents``            the attached commits of the publisher's own domain (store parents: invalidation and
                       hop counts follow them); another domain's are named in the ``shared_parents`` label,
                       and those read as text in the ``text_parents`` label (:mod:`c2c.store.hops`)
``extra[SHARE_KEY]``   the other domains that may attach it, checked once (:func:`c2c.trust.isolation.check_share`)
=====================  ==============================================================================

The artifact comes back unsigned: :meth:`c2c.handoff.gate.Gate.publish` signs it once, for the publisher's
domain, as it commits it. :func:`text_of` reads the text back on the other side.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Sequence

from c2c.artifact import Artifact
from c2c.artifact.fingerprint import Fingerprint
from c2c.artifact.header import SHARE_KEY
from c2c.artifact.prefix import PrefixRef
from c2c.canon import canonical_json
from c2c.conversation import Conversation
from c2c.errors import ConfigError, HandoffError
from c2c.runtime.kvcache import KVCache
from c2c.store.hops import text_parents_label
from c2c.trust.isolation import check_share

TEXT_KEY = "c2c.text"              # extra: {"v": 1, "agent", "text", "truncated"}
LEGACY_TEXT_KEYS = ("c2c.serve",)  # what c2c serve wrote before every front-end kept text: still read
MAX_TEXT_BYTES = 48 << 10          # of extra[TEXT_KEY] as canonical JSON; the header allows 64 KiB
SHARED_PARENTS = "shared_parents"  # label: attached commits of other domains (never store parents)


@dataclass(frozen=True)
class Parents:
    """The commits a conversation attached, split by owner once (:meth:`c2c.handoff.gate.Gate.parents`).

    Attributes:
        own: the publisher's domain's: the commit's store parents.
        shared: other domains' (shared with it): named in a label, never store parents, so that the
            dependency graph, and invalidation, stay inside a domain.
        as_text: those of ``own`` read as text: no cache hop (:mod:`c2c.store.hops`).
    """

    own: tuple[str, ...] = ()
    shared: tuple[str, ...] = ()
    as_text: tuple[str, ...] = ()

    def labels(self) -> dict[str, str]:
        return {**text_parents_label(self.own, self.as_text),
                **({SHARED_PARENTS: ",".join(self.shared)} if self.shared else {})}


def commit_of(conversation: Conversation, *, cache: KVCache, fingerprint: Fingerprint,
              producer: Mapping[str, str], labels: Sequence[str] = (), isolation: str | None = None,
              parents: Parents = Parents(), share: Sequence[str] | None = (),
              withhold_tokens: bool = False) -> Artifact:
    """The (unsigned) artifact committing ``cache`` of ``conversation``: the whole conversation after its shared
    prefix (``labels`` empty; ``cache`` holds every token from position 0) or the slice of the parts ``labels``
    name (``cache`` holds exactly their tokens, cut with ``isolation``).

    Raises:
        ConfigError: a bad share list; labels that name no part, or parts that cannot be one slice.
        HandoffError: ``cache`` does not hold what it should (a front-end's own mistake).
    """
    share = check_share(share, field="share")
    P = len(conversation.prefix_ids)
    if labels:
        try:
            start, end = conversation.context().export_range(tuple(labels))
        except HandoffError as e:
            raise ConfigError(f"publish labels: {e}") from None
        if cache.seq_len != end - start:
            raise HandoffError(f"internal: a slice of {cache.seq_len} tokens for parts of {end - start}")
        span = {"span": ",".join(labels), **({"isolation": isolation} if isolation else {})}
    else:
        start, end = P, len(conversation)
        if cache.start != 0 or tuple(cache.token_ids) != conversation.token_ids:
            raise HandoffError("internal: the cache to commit does not hold the conversation from position 0")
        span = {}
    text, truncated = bounded_text(conversation.text_between(start, end))
    extra: dict = {TEXT_KEY: {"v": 1, "agent": str(producer.get("agent", "")), "text": text,
                              "truncated": truncated}}
    if share:
        extra[SHARE_KEY] = list(share)
    return Artifact.build(cache, fingerprint=fingerprint, prefix=PrefixRef.of(conversation.prefix_ids),
                          withhold_tokens=withhold_tokens, producer=dict(producer), parents=parents.own,
                          labels={**span, **parents.labels()}, extra=extra)


def text_of(artifact: Artifact, *, runtime=None) -> str:
    """The commit's text, for a receiver that reads it instead of its K/V: the text its author kept, else (a
    commit made before every front-end kept text) its own tokens after its declared shared prefix, decoded by
    ``runtime`` where its tokenizer is the commit's; the sender's system turn, in the prefix, is never read out.

    Raises:
        HandoffError: no text can be had: none kept, and its tokens withheld, of another tokenizer, or nothing
            beyond the prefix.
    """
    h = artifact.header
    for key in (TEXT_KEY, *LEGACY_TEXT_KEYS):
        kept = h.extra.get(key)
        if isinstance(kept, dict) and isinstance(kept.get("text"), str):
            return kept["text"]
    declared = h.start > 0 or h.prefix.length > 0  # a whole cache without a declared prefix may open on a system turn
    if runtime is not None and h.tokens is not None and declared and \
            h.fingerprint.tokenizer_digest == runtime.tokenizer_digest:
        ids = h.tokens[h.prefix.length:] if h.start == 0 else h.tokens
        text = runtime.decode(ids).strip() if ids else ""
        if text:
            return text
    raise HandoffError("the commit keeps no text and its tokens cannot be read as text here (withheld, of another "
                       "tokenizer, or nothing beyond its shared prefix); attach it with mode full or slice")


def as_message(sender: str, commit_id: str, text: str) -> str:
    """The user turn a receiver reads a commit's text in, at every front-end."""
    return f"Context from {sender} (c2c commit {commit_id[:12]}):\n{text}"


def bounded_text(text: str) -> tuple[str, bool]:
    """``text``, its oldest part cut until it fits :data:`MAX_TEXT_BYTES` as canonical JSON; whether it was cut."""
    def size(t: str) -> int:
        return len(canonical_json({TEXT_KEY: {"v": 1, "agent": "x" * 64, "text": t, "truncated": True}}))

    if size(text) <= MAX_TEXT_BYTES:
        return text, False
    keep = len(text)
    while keep and size(text[-keep:]) > MAX_TEXT_BYTES - 64:
        keep = keep * 3 // 4
    return f"[... {len(text) - keep} earlier characters cut]\n" + text[-keep:], True
