"""`ChatService`: one chat completion, from validated request to result, on the model's worker.

This is what ``POST /v1/chat/completions`` calls, once. It owns the models'
workers, the sessions, and the :class:`~c2c.serve.exchange.Exchange` with the
store. Before a request is queued, a prompt whose characters alone cannot fit
the model's context is refused (no tokenizing: :meth:`ChatService.submit`).
One request, while it holds its model's turn (:mod:`c2c.serve.worker`):

1. take the session (if named) out of the pool;
2. attach the requested commits (:meth:`Exchange.attach`), or keep the session's;
3. render the messages (:mod:`c2c.conversation.render`), check the context length;
4. reuse the session's cache and prefill the rest (:mod:`c2c.conversation.reuse`);
5. generate, streaming deltas (:mod:`c2c.conversation.decode`);
6. publish, if asked: close the reply's turn and commit the cache (a whole cache is
   signed and stored after the model's turn is given up: no forward pass is left);
7. put the session back (it may evict its tenant's older caches: :mod:`c2c.serve.sessions`).
"""

from __future__ import annotations

import math
import time
import uuid
from dataclasses import dataclass, field, replace
from typing import Any

from c2c.artifact.prefix import PrefixRef
from c2c.errors import ConfigError, ContextEditError, ContextLengthError, PrefixMismatchError, UnknownModelError
from c2c.runtime.pace import Pace
from c2c.runtime.grammar import Grammar
from c2c.runtime.protocol import Batching, Grammars, Runtime, require
from c2c.serve.auth import Principal
from c2c.serve.config import ServeConfig
from c2c.runtime.edit import close_gaps
from c2c.conversation import editing
from c2c.conversation.editing import EditSpec
from c2c.conversation.decode import Decoded, Sampling, generate
from c2c.serve.exchange import Exchange
from c2c.serve.metrics import Metrics
from c2c.conversation import Conversation, Part
from c2c.conversation.render import Message, continuation, render, split_system, template_stability
from c2c.conversation.reuse import extend, prepare, truncate
from c2c.serve.sessions import Attachments, Session, SessionKey, SessionPool
from c2c.conversation.tools import ToolCall, Tools
from c2c.serve.worker import Channel, Job, ModelWorker



@dataclass(frozen=True, kw_only=True)
class JsonFormat:
    """``response_format``: JSON that validates against ``schema`` (None: any JSON object, ``json_object``)."""

    schema: dict[str, Any] | None = None


@dataclass(frozen=True, kw_only=True)
class PublishSpec:
    stream: str | None = None
    labels: tuple[str, ...] = ()
    share: tuple[str, ...] = ()    # other trust domains that may attach the commit


@dataclass(frozen=True, kw_only=True)
class ChatRequest:
    """A validated chat completion request (the HTTP schema converts to this)."""

    model: str
    messages: tuple[Message, ...]
    max_tokens: int | None = None
    temperature: float = 1.0
    top_p: float = 1.0
    seed: int | None = None
    stop: tuple[str, ...] = ()
    logit_bias: tuple[tuple[int, float], ...] = ()
    session: str | None = None
    attach: tuple[str, ...] = ()
    mode: str = "auto"
    publish: PublishSpec | None = None
    timeout_s: float | None = None
    stream: bool = False           # send ("delta", (choice, Delta)) events as the replies grow
    edit: EditSpec | None = None   # drop messages from the session's cache (c2c.conversation.editing)
    logprobs: int | None = None    # None: none; K: each token's log-probability and its K most likely
    n: int = 1                     # choices, each its own decode from the prompt's one prefill (no session)
    json: JsonFormat | None = None  # response_format json_object / json_schema (compiled at submit)
    tools: Tools | None = None     # tools, tool_choice, parallel_tool_calls (c2c.conversation.tools)
    grammar: Grammar | None = None  # ``json`` or a forced call, compiled for the request's model (:meth:`ChatService.submit`)


#: the most choices one request may ask for (``n``)
MAX_N = 8


@dataclass(frozen=True, kw_only=True)
class Reply:
    """One choice of a completion: its content (``""`` when it is only calls), why it ended, the tool calls it
    makes, and its tokens' log-probabilities (when asked for)."""

    text: str
    finish_reason: str
    logprobs: tuple[dict, ...] | None = None
    tool_calls: tuple[ToolCall, ...] = ()


@dataclass(frozen=True, kw_only=True)
class Completion:
    """The result of one request (serialized by :mod:`c2c.serve.schema`): ``replies``, one per choice;
    ``completion_tokens`` counts all of them."""

    id: str
    created: int
    model: str
    replies: tuple[Reply, ...]
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int
    c2c: dict[str, Any] = field(default_factory=dict)
    usage_extra: dict[str, int] = field(default_factory=dict)   # more ``usage`` fields (an edit's counts)

    @property
    def text(self) -> str:
        return self.replies[0].text

    @property
    def finish_reason(self) -> str:
        return self.replies[0].finish_reason


@dataclass(frozen=True, kw_only=True)
class Started:
    """Sent when a request has passed every check and its prompt is prefilled (streams start here)."""

    id: str
    created: int
    model: str


class ChatService:
    """Chat completions over loaded runtimes, a store and a keyring (see the module docstring)."""

    def __init__(self, config: ServeConfig, runtimes: dict[str, Runtime], exchange: Exchange,
                 metrics: Metrics | None = None, *, tenants: int = 1):
        """``tenants``: how many trust domains share the server (the shares of ``config.shares``)."""
        self.config = config
        self.runtimes = runtimes
        self.exchange = exchange
        self.metrics = metrics or Metrics()
        self.context = {name: rt.context_tokens for name, rt in runtimes.items()}
        self.chars_per_token = {name: rt.chars_per_token for name, rt in runtimes.items()}
        self.shares = config.shares(tenants)
        self.pool = SessionPool(config.session_budget_bytes, max_sessions=config.max_sessions,
                                tenant_bytes=self.shares.session_bytes, tenant_sessions=self.shares.sessions,
                                on_evict=lambda s: self.metrics.evictions.inc())
        import torch  # lazy: the service needs torch only for its engine threads' count (the models brought it)
        threads = torch.get_num_threads()
        self.workers = {name: ModelWorker(name, max_queue=config.max_queue, tenant_queue=self.shares.queue,
                                          half_life_s=config.fair_half_life_s,
                                          on_depth=self.metrics.queue_depth.labels(model=name).set,
                                          batch=rt.feed_together if isinstance(rt, Batching) else None,
                                          max_batch=config.max_batch,
                                          on_batch=self.metrics.batch.labels(model=name).observe,
                                          engine_init=lambda: torch.set_num_threads(threads))
                        for name, rt in runtimes.items()}

    # ------------------------------------------------------------- queries
    def models(self) -> list[dict[str, Any]]:
        return [{"id": name, "object": "model", "created": 0, "owned_by": "c2c",
                 "context_length": self.context[name],
                 "c2c": {"max_batch": self.workers[name].max_batch,
                         "batched_decode": self.workers[name].batch is not None,
                         "prefix_stable": t.stable, "rendering": t.reason}}
                for name, t in ((n, template_stability(rt)) for n, rt in self.runtimes.items())]

    def model_name(self, name: str) -> str:
        """The served model ``name`` refers to (exact, else case-insensitive).

        Raises:
            UnknownModelError: the server does not serve it.
        """
        if name in self.runtimes:
            return name
        for served in self.runtimes:
            if served.lower() == name.lower():
                return served
        raise UnknownModelError(f"model {name!r} is not served here; this server serves "
                                f"{', '.join(self.runtimes)} (GET /v1/models)")

    # ------------------------------------------------------------- requests
    def submit(self, principal: Principal, request: ChatRequest, channel: Channel) -> Job:
        """Queue ``request`` on its model's worker; events arrive on ``channel``.

        Events: ``("ready", Started)``, ``("delta", str)`` ... (when ``request.stream``), then
        ``("done", Completion)``, ``("error", C2CError)`` or ``("cancelled", None)``.

        Raises:
            UnknownModelError, ContextLengthError (too many characters to fit: :meth:`check_size`),
            SchemaError (a ``response_format`` schema that does not compile), RuntimeUnsupportedError
            (structured output on an engine without :class:`~c2c.runtime.protocol.Grammars`),
            QueueFullError, ServeError (shutting down).
        """
        name = self.model_name(request.model)
        request = replace(request, model=name)
        self.check_size(request)
        tools, rt = request.tools, self.runtimes[name]
        if tools is not None and isinstance(rt, Grammars):   # each tool's parameters compile: checked before it queues
            for i, t in enumerate(tools.tools):
                if t.parameters is not None:
                    Grammar.json(t.parameters, rt.grammar_tokenizer(), field=f"tools.{i}.function.parameters")
        answer = request.json.schema if request.json is not None else None
        if tools is not None and tools.calls and (tools.forced or request.json is not None):   # a call is constrained
            schema = tools.forced_schema() if tools.forced else tools.either_schema(answer)
            request = replace(request, grammar=Grammar.json(schema, require(rt, Grammars).grammar_tokenizer(),
                                                             kind="tool_calls", field="tools"))
        elif request.json is not None:  # compiled before it queues: a schema that does not compile is a 400 now
            request = replace(request, grammar=Grammar.json(answer, require(rt, Grammars).grammar_tokenizer()))
        timeout = min(request.timeout_s or math.inf, self.config.request_timeout_s)
        # a session's requests run in order; a request without one runs beside the agent's others (its own lane)
        lane = (principal, "session", request.session) if request.session else object()
        job = Job(lambda job: self._run(job, principal, request), channel, timeout_s=timeout, owner=principal,
                  lane=lane)
        return self.workers[name].submit(job)

    def check_size(self, request: ChatRequest) -> None:
        """Refuse a request whose messages cannot fit its model's context, by their characters alone.

        Each message is tokenized on its own, into at least ``ceil(characters / c)`` tokens,
        where ``c`` is the most characters one of the model's tokens stands for
        (:attr:`Runtime.chars_per_token`, computed once per model). So this never refuses a
        prompt that fits, and costs no tokenizing: an oversized message is refused before it
        is queued, instead of holding the model while it is tokenized. The exact check
        follows the rendering.

        Raises:
            ContextLengthError: even the fewest tokens the messages could be, plus ``max_tokens``
                (at least 1), exceed the context.
        """
        per_token, window = self.chars_per_token[request.model], self.context[request.model]
        if per_token is None:  # the tokenizer gives no bound (see c2c.runtime.transformers.tokenizer.chars_per_token)
            return
        least = sum(math.ceil(len(m.content) / per_token) for m in request.messages)
        wanted = request.max_tokens or 1
        if least + wanted > window:
            chars = sum(len(m.content) for m in request.messages)
            raise ContextLengthError(
                f"the messages hold {chars} characters: at least {least} tokens of {request.model} (one token "
                f"stands for at most {per_token:g} characters), and {wanted} more were asked for, but "
                f"{request.model} reads at most {window}; shorten the messages or lower max_tokens")

    def _run(self, job: Job, principal: Principal, req: ChatRequest) -> Completion:
        t0 = time.perf_counter()
        rt = self.runtimes[req.model]
        key = SessionKey(principal.domain, principal.agent, req.session, req.model) if req.session else None
        session = self.pool.take(key) if key is not None else Session(key=None)
        state = session.state
        try:
            return self._turn(job, principal, req, rt, session, state, t0)
        finally:
            self.pool.put(session)
            self.metrics.sessions.set(self.pool.stats.sessions)
            self.metrics.session_bytes.set(self.pool.stats.held_bytes)

    def _turn(self, job: Job, principal: Principal, req: ChatRequest, rt: Runtime, session: Session, state: str,
              t0: float) -> Completion:
        edited, messages, held_cache = None, req.messages, session.cache
        # every forward pass of this turn; its decode steps in one pass with the other requests' (the batch)
        pace = Pace(chunk=self.config.prefill_chunk, between=job.between_passes, join=job.step)
        if req.edit is None and session.dropped:
            raise ContextEditError(
                f"session {req.session!r} has dropped messages {sorted(session.dropped)}, and this request sends no "
                "edit: it would bring them back. List every dropped index in each request (c2c: {\"edit\": "
                "{\"drop\": [...]}}; c2c.client.context_policy does), or start a new session")
        if req.edit is not None:
            if req.session is None:
                raise ContextEditError("an edit drops messages from a session's cache: name the session too "
                                       "(c2c: {\"session\": ...})")
            if req.attach:
                raise ContextEditError("send an edit and an attach in separate requests")
            job.between_passes()
            edited = editing.apply(rt, session.cache, req.messages, req.edit, dropped_before=session.dropped,
                                        held=session.held, pace=pace)
            messages, held_cache = edited.kept, edited.cache
        _, rest = split_system(messages)
        if req.publish is not None:
            self.exchange.check_publish(principal, req.publish.stream, req.publish.labels,
                                        [n for m in rest for n in (m.label, *m.aliases)] + ["assistant"],
                                        req.publish.share)
        entries = req.tools.entries() if req.tools is not None else ()
        own = render(rt, messages, tools=entries)   # the request's own messages; the attachments go after its prefix
        prefix = own.prefix_ids
        got = self._attachments(principal, req, rt, session, prefix, pace)
        attachments, attached, via_text, records, prefix_kv, continues = (
            got.parts, got.attached, got.via_text, got.records, got.prefix_kv, got.continues)
        if req.tools is not None:   # the catalogue is in the prefix: a prefix that differs says so
            for rec, _ in records:
                if any(c.get("name") == "prefix" and c.get("ok") is False for c in rec.get("checks", ())):
                    rec["reason"] += ("; this request's shared prefix holds its tool catalogue (the chat template "
                                      "writes the tools into the system turn): a sender with other tools, or none, "
                                      "has another prefix")
        if got.unheld:  # a continued commit went stale: its K/V on the caller's messages are re-prefilled
            held_cache = truncate(held_cache, len(prefix))
        t_attach = time.perf_counter()
        rendering = own.after_prefix(attachments)
        parts_of = tuple(n for _, n in records) if records else session.attachments.placed
        if continues is not None:  # the messages may begin with the commit's own conversation: then they carry it
            cont = continuation(own, continues, attachments[0] if attachments else None)
            if cont is not None:
                rendering, n, rec = cont.rendering, cont.messages, dict(records[0][0])
                carried = cont.carried and prefix_kv is not None
                rec["tokens"] = sum(len(p.token_ids) for p in rendering.parts[1:n + 1]) + (len(prefix) if carried
                                                                                          else 0)
                if not cont.carried:
                    rec["reason"] += ("; the messages continue its conversation: prefilled as sent, nothing inserted"
                                      if rec["path"] == "text" else "; the messages continue its conversation, but its "
                                      "K/V cannot lie on them (the model's sliding-window layers no longer hold all "
                                      "of it, or a map gave them on other tokens): prefilled as sent")
                    rec["used"] = "text"
                    cid = rec["commit"]
                    had = session.attachments
                    if cid in had.commits and cid not in had.via_text:  # K/V the session holds of it
                        held_cache = truncate(held_cache, len(prefix))
                    prefix_kv = None
                records, attachments, parts_of = [(rec, n)], (), (0,)
        if prefix_kv is not None:  # a full cache brings its own (identical) prefix K/V
            rendering = replace(rendering, parts=(replace(rendering.parts[0], kv=prefix_kv),) + rendering.parts[1:])
        n_prompt, window = len(rendering), self.context[req.model]
        max_tokens = req.max_tokens or min(self.config.default_max_tokens, max(window - n_prompt, 1))
        if n_prompt + max_tokens > window:
            raise ContextLengthError(
                f"the prompt is {n_prompt} tokens and {max_tokens} more were asked for, but {req.model} reads at "
                f"most {window}; shorten the messages or lower max_tokens")
        if held_cache is not None and held_cache.gaps and held_cache.end - held_cache.seq_len + n_prompt + \
                max_tokens > window:  # open gaps use positions too: close them before they run past the context
            held_cache, moved = close_gaps(rt, held_cache)
            if edited is not None:
                edited = replace(edited, cache=held_cache, closed=edited.closed + moved)
        vocab = rt.facts.vocab_size
        if any(not 0 <= i < vocab for i, _ in req.logit_bias):
            raise ConfigError(f"logit_bias names a token id outside {req.model}'s vocabulary [0, {vocab})")
        sampling = Sampling(max_tokens=max_tokens, temperature=req.temperature, top_p=req.top_p, seed=req.seed,
                            stop=req.stop, logit_bias=req.logit_bias, logprobs=req.logprobs, grammar=req.grammar)
        job.between_passes()
        prepared = prepare(rt, held_cache, rendering, pace)
        records = _accounted(records, prepared.per_part, prefix_kv is not None)
        # Commit what this request established: the cache (exact by its token ids, unless edited), where its
        # messages sit, and the attachments.
        session.cache = prepared.cache
        kept_index = edited.kept_index if edited is not None else tuple(range(len(req.messages)))
        # its tokens and messages, never K/V (the cache holds those, within the pool's budget)
        session.conversation = Conversation(parts=tuple(replace(p, kv=None) for p in rendering.parts))
        session.history = kept_index
        session.dropped = frozenset(req.edit.drop) if req.edit is not None else frozenset()
        session.attachments = Attachments(parts=tuple(replace(p, kv=None) for p in attachments), commits=attached,
                                          via_text=via_text, placed=parts_of,
                                          mode=req.mode if req.attach else session.attachments.mode,
                                          prefix=PrefixRef.of(prefix) if attachments else None)
        t_prep = time.perf_counter()
        cid, created = f"chatcmpl-{uuid.uuid4().hex}", int(time.time())
        job.emit("ready", Started(id=cid, created=created, model=req.model))
        decoded, others = self._decode(job, rt, prepared, sampling, pace, req)
        session.cache = decoded.cache
        session.state, session.turns = "warm", session.turns + 1
        t_gen = time.perf_counter()
        published = None
        replies = tuple(self._reply(d, req.tools) for d in (decoded, *others))
        if req.publish is not None:
            said = Message(role="assistant", content=replies[0].text, tool_calls=replies[0].tool_calls)
            whole = render(rt, messages + (said,), tools=entries, attachments=session.attachments.parts,
                           generation_prompt=False)
            session.cache, _ = extend(rt, session.cache, whole.token_ids, pace)
            commit_cache, _ = close_gaps(rt, session.cache)  # a commit's positions are contiguous
            if not req.publish.labels:  # a whole cache is stored as it is: no forward pass from here on
                job.release_turn()
            published = self.exchange.publish(runtime=rt, principal=principal, session=req.session,
                                              cache=commit_cache, conversation=whole, stream=req.publish.stream,
                                              labels=req.publish.labels, parents=attached,
                                              text_parents=via_text, share=req.publish.share, pace=pace)
            self.metrics.handoff_bytes.labels(direction="publish").inc(published["bytes"])
        t_end = time.perf_counter()
        completion_tokens = decoded.completion_tokens + sum(d.completion_tokens for d in others)
        for kind, n in (("prompt", n_prompt), ("cached", prepared.cached), ("completion", completion_tokens)):
            self.metrics.tokens.labels(kind=kind).inc(n)
        c2c = {
            "session": None if req.session is None else {
                "name": req.session, "state": {"evicted": "rebuilt"}.get(state, state), "turns": session.turns},
            "cached_tokens": prepared.cached, "reused_tokens": prepared.reused,
            "imported_tokens": prepared.imported, "prefilled_tokens": prepared.prefilled + len(prepared.pending),
            "attach": records, "attached": list(session.attachments.commits), "publish": published,
            "edit": None if edited is None else edited.record(session.cache),
            "timings": {"queue_s": job.queued_s, "attach_s": t_attach - t0, "prefill_s": t_prep - t_attach
                        + sum(d.prefill_s for d in (decoded, *others)),
                        "decode_s": sum(d.decode_s for d in (decoded, *others)), "publish_s": t_end - t_gen,
                        "forward_s": sum(d.prefill_s + d.decode_s for d in (decoded, *others)),
                        "total_s": t_end - t0 + job.queued_s},
        }
        extra = {}
        if edited is not None:
            e = c2c["edit"]
            extra = {"dropped_tokens": e["dropped_tokens"], "repositioned_tokens": e["repositioned_tokens"],
                     "recomputed_tokens": e["recomputed_tokens"], "prefilled_tokens": c2c["prefilled_tokens"]}
        return Completion(id=cid, created=created, model=req.model, replies=replies, prompt_tokens=n_prompt,
                          completion_tokens=completion_tokens, cached_tokens=prepared.cached, c2c=c2c,
                          usage_extra=extra)

    @staticmethod
    def _reply(d: Decoded, tools: Tools | None) -> Reply:
        """A decode as a reply: its text read as tool calls where the request has tools (:meth:`Tools.parse`)."""
        content, calls = tools.parse(d.text) if tools is not None else (d.text, ())
        return Reply(text=content or "", finish_reason="tool_calls" if calls else d.finish_reason,
                     logprobs=d.logprobs, tool_calls=calls)

    def _decode(self, job: Job, rt: Runtime, prepared, sampling: Sampling, pace: Pace,
                req: ChatRequest) -> tuple[Decoded, tuple[Decoded, ...]]:
        """The request's ``n`` replies: the first, and the others. With ``n > 1`` the prompt is prefilled once
        (all but its last token) and each choice decodes from that cache, never copying it (a cache is
        immutable: each choice's engine sequence starts from it). A seeded request gives choice ``i`` the
        seed ``seed + i``: reproducible, and not ``n`` copies of one draw."""
        def emit(i: int):
            return (lambda d: job.emit("delta", (i, d))) if req.stream else (lambda d: None)

        cache, pending = prepared.cache, prepared.pending
        if req.n > 1 and len(pending) > 1:
            _, cache = pace.prefill(rt, pending[:-1], cache)
            pending = pending[-1:]
        out = [generate(rt, cache, pending, replace(sampling, seed=None if sampling.seed is None else
                                                    (sampling.seed + i) % (1 << 63)),
                        pace=pace, on_delta=emit(i)) for i in range(req.n)]
        return out[0], tuple(out[1:])

    def _attachments(self, principal: Principal, req: ChatRequest, rt: Runtime, session: Session,
                     prefix: tuple[int, ...], pace: Pace) -> "_Attached":
        """What this request attaches (:class:`_Attached`): the commits it names, else the session's own.

        A session's cache attachment whose commit has gone stale since is not reused: the
        session's commits are attached again (with the mode they were attached with), so the
        stale one takes the path a fresh attach would (text in ``auto``, an error otherwise).
        A commit the session *continued* (its messages began with the commit's conversation, so it
        placed no part) is the caller's own messages: when it goes stale it inserts nothing (drops
        made since still apply), and its K/V on those messages are re-prefilled from what is sent.
        A commit that is gone from the store since (retired by its stream's retention, collected,
        or no longer shared) never breaks the session: it goes on from the K/V it holds of it (or,
        once evicted, from the tokens it holds, re-prefilled exactly), and a re-attach record says so.
        """
        attach, mode = req.attach, req.mode
        kept: dict[str, tuple[Part, ...]] = {}
        continued: set[str] = set()
        had = session.attachments
        if not attach:
            if had.parts and had.prefix != PrefixRef.of(prefix):
                raise PrefixMismatchError(
                    f"session {req.session!r} holds attachments placed after another system message; send the "
                    "same system message, attach again, or use a new session")
            # A commit that placed no part was continued: its conversation is the caller's own messages (edits
            # and drops included), so it adds nothing when it goes stale and is never attached again.
            continued = {c for c, n in zip(had.commits, had.placed) if not n}
            state = {c: self.exchange.freshness(principal, c) for c in had.commits if c not in had.via_text}
            if "stale" not in state.values():
                return _Attached(parts=had.parts, attached=had.commits, via_text=had.via_text)
            attach, mode = had.commits, had.mode
            at = 0
            for c, n in zip(had.commits, had.placed):
                gone = state.get(c) == "gone" or (c in had.via_text
                                                  and self.exchange.freshness(principal, c) == "gone")
                if gone:
                    kept[c] = had.parts[at: at + n]
                elif c in continued and state.get(c) != "stale":
                    kept[c] = ()
                at += n
        found = [self.exchange.attach(cid, runtime=rt, principal=principal, prefix_ids=prefix, mode=mode,
                                      held=session.cache, pace=pace) for cid in attach
                 if cid not in kept and cid not in continued]   # a continued one needs nothing of the store
        for a in found:
            self.metrics.handoffs.labels(path=a.path, reason=a.metric_reason).inc()
            self.metrics.handoff_bytes.labels(direction="attach").inc(a.nbytes)
        by_id = {a.commit: a for a in found}
        parts, records, via_text = [], [], []
        for cid in attach:
            if cid in kept:
                parts.append(kept[cid])
                reason = ("no longer in the store (retired, collected or no longer shared): the session goes on "
                          "from what it holds of it") if cid not in continued or state.get(cid) == "gone" else \
                    "continued: its conversation is the session's own messages; nothing is inserted for it"
                records.append(({"commit": cid, "requested": mode, "path": "held", "used": "held",
                                 "reason": reason}, len(kept[cid])))
                if cid in had.via_text:
                    via_text.append(cid)
                continue
            if cid in continued:  # stale, and continued: the caller's messages carry it; nothing goes in
                records.append(({"commit": cid, "requested": mode, "path": "text", "used": "text", "stale": True,
                                 "reason": "went stale since it was attached; the session continued its "
                                           "conversation: its messages are re-prefilled as sent (drops included), "
                                           "nothing is inserted"}, 0))
                via_text.append(cid)
                continue
            a = by_id[cid]
            parts.append(a.parts)
            records.append((a.record, len(a.parts)))
            if a.path == "text":
                via_text.append(cid)
        first = found[0] if found and found[0].commit == attach[0] and attach[0] not in continued else None
        return _Attached(parts=tuple(p for ps in parts for p in ps), attached=tuple(attach), via_text=tuple(via_text),
                         records=records, prefix_kv=first.prefix_kv if first is not None else None,
                         continues=first.tokens if first is not None and len(attach) == 1 and
                         first.path in ("cache", "text") else None,
                         unheld=any(c in continued and c not in kept for c in attach))

    def close(self) -> None:
        """Refuse new requests, finish the queued ones (up to the shutdown timeout), stop the workers."""
        for w in self.workers.values():
            w.close(self.config.shutdown_timeout_s)


@dataclass(frozen=True, kw_only=True)
class _Attached:
    """What a request attaches (:meth:`ChatService._attachments`).

    Attributes:
        parts: the parts placed after the prefix; ``attached`` their commits, ``via_text`` those read as text.
        records: (attach record, number of parts placed) of each commit attached now.
        prefix_kv: a full cache's own prefix K/V, or None.
        continues: the token ids of the one full commit attached now (the request may continue its
            conversation: :func:`~c2c.conversation.render.continuation`), or None.
        unheld: a commit the session continued went stale: the K/V the session holds of it are not used.
    """

    parts: tuple[Part, ...]
    attached: tuple[str, ...]
    via_text: tuple[str, ...]
    records: list[tuple[dict, int]] = field(default_factory=list)
    prefix_kv: Any = None
    continues: tuple[int, ...] | None = None
    unheld: bool = False


def _accounted(records: list[tuple[dict, int]], per_part: tuple[tuple[int, int, int], ...], full_prefix: bool) -> list[dict]:
    """Each attach record with the tokens of its parts that were imported, reused from the session's
    cache, and prefilled (they add up to ``tokens``). Attachments are the rendering's parts after the
    prefix, one each but for a commit that holds only the shared prefix (none); a full cache's prefix
    part counts for the first record."""
    out, i = [], 1
    for n, (rec, nparts) in enumerate(records):
        own = list(per_part[i: i + nparts])
        i += len(own)
        if n == 0 and full_prefix:
            own.append(per_part[0])
        reused, imported, computed = (sum(t[k] for t in own) for k in range(3))
        out.append({**rec, "imported_tokens": imported, "reused_tokens": reused, "prefilled_tokens": computed})
    return out

