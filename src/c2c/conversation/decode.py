"""The decode loop of one request: sample, stream text deltas, honour stop strings, stop when told.

It runs on the model's worker thread. Before every forward pass it calls the pace's
``between()`` (:class:`~c2c.runtime.pace.Pace`), which passes the model's turn on and
raises when the client went away or the deadline passed, so an abandoned request stops
within one forward pass.
"""

from __future__ import annotations

import secrets
import time
from dataclasses import dataclass
from typing import Callable, Sequence

import torch

from c2c.errors import ConfigError
from c2c.runtime.grammar import Constraint, Grammar
from c2c.runtime.pace import ONE_PASS, Pace
from c2c.runtime.protocol import Grammars, Runtime, require
from c2c.runtime.sampling import check_sampling, sample_next
from c2c.runtime.kvcache import KVCache

MAX_TOP_LOGPROBS = 20  # as OpenAI and vLLM


@dataclass(frozen=True, kw_only=True)
class Sampling:
    """How to pick tokens: ``temperature`` 0 is greedy; ``seed`` makes a sampled reply reproducible;
    ``logit_bias`` adds to the logits of the given token ids before every pick (OpenAI's -100..100);
    ``min_tokens`` (as vLLM's) bans the end of turn until that many tokens are out."""

    max_tokens: int
    min_tokens: int = 0
    temperature: float = 1.0
    top_p: float = 1.0
    seed: int | None = None
    stop: tuple[str, ...] = ()
    logit_bias: tuple[tuple[int, float], ...] = ()
    logprobs: int | None = None   # None: none; K: each token's log-probability and the K most likely (0..20)
    grammar: Grammar | None = None  # every step constrained to what it allows (structured output)

    def __post_init__(self) -> None:
        check_sampling(self.temperature, self.top_p)
        if not 0 <= self.min_tokens <= self.max_tokens:
            raise ConfigError(f"min_tokens must lie in [0, max_tokens={self.max_tokens}]")
        if any(not -100 <= b <= 100 for _, b in self.logit_bias):
            raise ConfigError("logit_bias values must lie in [-100, 100]")
        if self.logprobs is not None and not 0 <= self.logprobs <= MAX_TOP_LOGPROBS:
            raise ConfigError(f"top_logprobs must lie in [0, {MAX_TOP_LOGPROBS}]")


@dataclass(frozen=True)
class Delta:
    """A piece of the reply as it grows: its text, and (when asked for) the log-probabilities of the tokens whose
    text it completes, in OpenAI's shape (``{"token", "logprob", "bytes", "top_logprobs"}`` each)."""

    text: str
    logprobs: tuple[dict, ...] = ()


@dataclass(frozen=True, kw_only=True)
class Decoded:
    """What one generation produced.

    ``cache`` holds the prompt and every generated token but the last sampled one
    (an end-of-turn token is never fed); ``completion_tokens`` counts every sampled
    token, the end-of-turn token included.
    """

    token_ids: tuple[int, ...]
    text: str
    finish_reason: str            # "stop" (end of turn or a stop string) | "length"
    completion_tokens: int
    cache: KVCache
    prefill_s: float
    decode_s: float
    logprobs: tuple[dict, ...] | None = None   # per token of ``text`` (None: not asked for)


def generate(runtime: Runtime, cache: KVCache | None, pending: Sequence[int], sampling: Sampling, *,
             on_delta: Callable[[Delta], None] = lambda delta: None, pace: Pace = ONE_PASS) -> Decoded:
    """Feed ``pending`` after ``cache`` (in passes of ``pace.chunk`` tokens: :meth:`Pace.feed`), then
    sample up to ``sampling.max_tokens`` tokens.

    ``on_delta`` receives the reply as it grows (never a part of a stop string, nor a half-decoded character),
    each token's log-probabilities with the delta that completes its text; ``pace.between`` is called before
    every forward pass (a decode step goes through ``pace.step``, which a server batches). Log-probabilities are
    the model's own (``log_softmax`` of its logits, before ``logit_bias`` and temperature), as vLLM reports them
    by default.
    """
    constraint = Constraint(sampling.grammar, require(runtime, Grammars).grammar_tokenizer()) \
        if sampling.grammar is not None else None
    gen = torch.Generator(device=runtime.device)
    gen.manual_seed(sampling.seed if sampling.seed is not None else secrets.randbits(63))
    t0 = time.perf_counter()
    seq = runtime.stepper(cache)  # the engine holds the sequence between passes and exports it once, at the end
    logits = pace.feed(seq, pending)
    t1 = time.perf_counter()
    hold = max((len(s) for s in sampling.stop), default=1) - 1
    bias_ids = torch.tensor([i for i, _ in sampling.logit_bias], dtype=torch.long, device=logits.device)
    bias = torch.tensor([b for _, b in sampling.logit_bias], dtype=logits.dtype, device=logits.device)
    out: list[int] = []
    entries: list[dict] = []      # one per token of ``out`` (when asked for)
    ends: list[int] = []          # the reply's length in characters once each token of ``out`` is in
    text, emitted, sent, finish, sampled = "", 0, 0, "length", 0
    eos = torch.tensor(sorted(runtime.eos_ids), dtype=torch.long, device=logits.device)
    for step in range(sampling.max_tokens):
        raw = logits
        if len(bias_ids):
            logits = logits.clone()
            logits[bias_ids] += bias  # (vocab,)
        if step < sampling.min_tokens and len(eos):
            logits = logits.clone()
            logits[eos] = float("-inf")  # (vocab,): no end of turn yet
        if constraint is not None:
            logits = constraint.mask(logits)  # (vocab,): what the grammar does not allow next is -inf
        tok = sample_next(logits, temperature=sampling.temperature, top_p=sampling.top_p, generator=gen)
        sampled += 1
        if tok in runtime.eos_ids:
            finish = "stop"
            break
        if constraint is not None:
            constraint.accept(tok)
        out.append(tok)
        if sampling.logprobs is not None:
            entries.append(_logprob_entry(runtime, raw, tok, sampling.logprobs))
        text = runtime.decode(out)
        ends.append(len(text.rstrip("\ufffd")))   # what is whole so far: a half character is not in it yet
        cut = _first_stop(text, sampling.stop)
        if cut is not None:
            text, finish = text[:cut], "stop"
            if entries:  # the tokens of the stop string are no part of the reply
                entries = [e for i, e in enumerate(entries) if (ends[i - 1] if i else 0) < cut]
            break
        safe = len(text) - hold
        while safe > emitted and text[safe - 1] == "\ufffd":  # maybe half a character: wait for the rest
            safe -= 1
        if safe > emitted:
            done = sum(1 for e in ends if e <= safe)
            on_delta(Delta(text[emitted:safe], tuple(entries[sent:done])))
            emitted, sent = safe, max(sent, done)
        if constraint is not None and constraint.complete:   # the grammar allows nothing more
            finish = "stop"
            break
        if step == sampling.max_tokens - 1:
            break
        if constraint is not None:
            constraint.prefetch()   # the next step's allowed tokens, on a thread, while the model runs
        logits = pace.step(seq, tok)   # alone, or in one pass with other sequences' steps (the server's batch)
    if len(text) > emitted or sent < len(entries):
        on_delta(Delta(text[emitted:], tuple(entries[sent:])))
    return Decoded(token_ids=tuple(out), text=text, finish_reason=finish, completion_tokens=sampled,
                   cache=seq.cache(), prefill_s=t1 - t0, decode_s=time.perf_counter() - t1,
                   logprobs=tuple(entries) if sampling.logprobs is not None else None)


def _logprob_entry(runtime: Runtime, logits: torch.Tensor, tok: int, top: int) -> dict:
    """``tok``'s log-probability under ``logits`` ``(vocab,)``, and the ``top`` most likely tokens', in OpenAI's
    shape (a token's text, its UTF-8 bytes, and its log-probability)."""
    lp = torch.log_softmax(logits.float(), dim=-1)  # (vocab,)

    def one(t: int) -> dict:
        s = runtime.decode([t])
        return {"token": s, "logprob": max(float(lp[t]), -9999.0), "bytes": list(s.encode("utf-8"))}

    entry = one(tok)
    if top:
        values, ids = torch.topk(lp, top)
        entry["top_logprobs"] = [one(int(t)) for t in ids]
    else:
        entry["top_logprobs"] = []
    return entry


def _first_stop(text: str, stops: Sequence[str]) -> int | None:
    hits = [i for i in (text.find(s) for s in stops if s) if i >= 0]
    return min(hits) if hits else None
