"""The fuser's answer quality, scored as lm-evaluation-harness scores it, with causal controls and records.

The one fuser evaluator: ``c2c fuser eval`` (:func:`evaluate_checkpoints`) and
``benchmarks/fuser_report.py`` both run :class:`HarnessEvaluator` and :func:`summarize`, and
keep their per-question records with :mod:`c2c.bench.fuser_records`.

Every condition answers the same question in lm-eval's ARC form, on every benchmark: the
context ``"Question: {q}\\nAnswer:"`` (plain text, no chat template, no options shown) and
each option's text as its continuation, scored by summed log-likelihood (``acc``) and per
character (``acc_norm``) with :func:`c2c.mc.score_options`, which
``benchmarks/lm_eval_agreement.py`` checks against lm-eval itself on ARC-Challenge. (lm-eval's
own OpenBookQA task drops the ``Question:``/``Answer:`` wrapper, and its MMLU and C-Eval tasks
score letters; one prompt for all four keeps the conditions comparable across them.) The
fusers were trained on chat-rendered conversations, so this plain context is new to them too.
The conditions:

- ``receiver``: the Receiver alone.
- ``sharer``: the Sharer alone, scored the same way (its own tokenizer).
- ``t2t``: the Sharer writes a hint (greedy, its chat template, ``hint_tokens``) from the
  question's stem alone, as it reads it under c2c (no options, no labels); the Receiver
  scores after ``"A hint from another assistant: {hint}\\n"`` + the context.
- ``t2t_choice``: the Sharer states the option it picks (its ``acc`` choice), and the
  Receiver scores after ``"Another assistant answered: {option}\\n"`` + the context.
- ``c2c``: the Receiver's cache of the context is fused with the Sharer's cache of the
  same text (aligned token by token, hard gates); the options are scored from it.
- ``control``: the matched control fuser (trained the same way on the Receiver's own
  cache): what the extra parameters alone buy.
- ``c2c_other``: the same fuser fed **another question's** Sharer cache (the question half
  the set away, so usually another subject; its id is in the record; positions mapped
  proportionally).
- ``c2c_zero``: the same fuser fed a **zeroed** Sharer cache, real alignment.

A gain that comes from what the Sharer read shows as c2c above both causal controls.
Derived per question: the oracle ``max(receiver, sharer)``, and every condition's agreement with
the Sharer's choice, with c2c's shift beyond the Receiver's and the controls' (:func:`summarize`).
Each question yields one JSON-able record with every option's log-likelihood under every
condition, so any number can be recomputed.

Latency (seconds per question, one after another in this process) is the sum of the steps
a condition needs; caches two conditions share are computed once and charged to both.
Tensor shapes are in the comments.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

import numpy as np
import torch
from tqdm import tqdm

from c2c.bench.fuser_records import CONDITIONS, Records
from c2c.bench.stats import bootstrap_mean
from c2c.errors import ConfigError, FuserCheckpointError
from c2c.fuser import checkpoint as ckpt
from c2c.fuser.align import CONTENT, TEMPLATE, Rendered, Section, align_tokens, render
from c2c.fuser.data import SYSTEM, Question
from c2c.fuser.infer import FusedReceiver
from c2c.mc import lm_eval_context, score_options
from c2c.runtime.kvcache import KVCache
from c2c.runtime.protocol import Offsets, require

_NEEDS_SHARER = {"sharer", "t2t", "t2t_choice", "c2c", "c2c_other", "c2c_zero"}
_NEEDS_FUSER = {"c2c", "c2c_other", "c2c_zero"}


def plain(runtime, text: str) -> Rendered:
    """``text`` as one content section, tokenized with offsets (BOS first, if the model has one)."""
    ids, offsets = require(runtime, Offsets).encode_with_offsets(text)
    bos = tuple(runtime.bos_ids)
    sections = (Section(kind=TEMPLATE, start=0, end=0), Section(kind=CONTENT, start=0, end=len(text)),
                Section(kind=TEMPLATE, start=len(text), end=len(text)))
    return Rendered(text=text, sections=sections, ids=bos + tuple(ids), offsets=((0, 0),) * len(bos) + tuple(offsets),
                    n_bos=len(bos))


def proportional_index(n_receiver: int, n_sharer: int) -> np.ndarray:
    """``(n_receiver,)`` Sharer positions spread evenly over ``n_sharer`` (for another text's cache)."""
    return np.minimum((np.arange(n_receiver) * n_sharer) // max(n_receiver, 1), n_sharer - 1).astype(np.int64)


class HarnessEvaluator:
    """Scores questions under :data:`CONDITIONS`; see the module docstring."""

    def __init__(self, receiver, *, sharer=None, fused: FusedReceiver | None = None,
                 control: FusedReceiver | None = None, hint_tokens: int = 32):
        for name, fr, want in (("fused", fused, 1), ("control", control, 0)):
            if fr is None:
                continue
            if fr.receiver is not receiver:
                raise ConfigError(f"the {name} fuser belongs to another Receiver runtime")
            if len(fr.links) != 1 or (fr.links[0].sharer is not None) != bool(want):
                raise ConfigError(f"the {name} fuser must be one {'Sharer' if want else 'control'} link")
            if want and fr.links[0].sharer is not sharer:
                raise ConfigError("the fuser's Sharer is not the Sharer runtime given")
        self.receiver, self.sharer, self.fused, self.control = receiver, sharer, fused, control
        self.hint_tokens = hint_tokens

    def _need(self, conditions: Sequence[str]) -> None:
        bad = [c for c in conditions if c not in CONDITIONS]
        if bad:
            raise ConfigError(f"unknown conditions {bad}; choose from {', '.join(CONDITIONS)}")
        if _NEEDS_SHARER & set(conditions) and self.sharer is None:
            raise ConfigError(f"{sorted(_NEEDS_SHARER & set(conditions))} need a Sharer")
        if _NEEDS_FUSER & set(conditions) and self.fused is None:
            raise ConfigError(f"{sorted(_NEEDS_FUSER & set(conditions))} need a trained fuser")
        if "control" in conditions and self.control is None:
            raise ConfigError("control needs a control fuser")

    def evaluate(self, questions: Sequence[Question], conditions: Sequence[str] = CONDITIONS, *,
                 done: Sequence[dict] = (), on_record: Callable[[dict], None] | None = None,
                 progress: bool = True, desc: str = "eval") -> list[dict]:
        """One record per question (``done`` records of the same questions are reused where they
        hold every asked condition; the rest are asked again and passed to ``on_record``)."""
        self._need(conditions)
        conditions = [c for c in CONDITIONS if c in conditions]
        prior = {r["id"]: r for r in done}
        out = []
        for i, q in enumerate(tqdm(questions, desc=desc, unit="q", disable=not progress)):
            rec = prior.get(q.id)
            missing = [c for c in conditions if rec is None or c not in rec["cond"]]
            if missing:
                new = self.ask(q, missing, other=other_question(questions, i))
                rec = new if rec is None else rec | {k: v for k, v in new.items() if k not in ("cond", "delta")} | {
                    "cond": rec["cond"] | new["cond"]} | (
                    {"delta": rec.get("delta", {}) | new["delta"]} if "delta" in new else {})
                if on_record is not None:
                    on_record(rec)
            out.append(rec)
        return out

    @torch.inference_mode()
    def ask(self, q: Question, conditions: Sequence[str], *, other: Question | None = None) -> dict:
        """One question under ``conditions``: ``{"id", "answer", "cond": {c: {"loglik", "chars", "acc",
        "norm", "s"}}[, "hint", "sharer_said"]}``, with ``answer`` and choices as option indices."""
        self._need(conditions)
        if {"c2c_other"} & set(conditions) and other is None:
            raise ConfigError("c2c_other needs another question")
        r, s = self.receiver, self.sharer
        labels = q.labels
        options = [text for _, text in q.options]
        ctx = lm_eval_context(q.question)
        rec: dict = {"id": q.id, "answer": labels.index(q.answer), "cond": {}}
        cond = rec["cond"]

        def put(name: str, scores, seconds: float) -> None:
            cond[name] = {"loglik": [round(x, 5) for x in scores.loglik], "chars": list(scores.chars),
                          "acc": scores.acc_choice, "norm": scores.norm_choice, "s": seconds}

        spent: dict[str, float] = {}

        def timed(key: str, fn):
            t0 = time.perf_counter()
            value = fn()
            spent[key] = time.perf_counter() - t0
            return value

        if "receiver" in conditions:
            put("receiver", timed("receiver", lambda: score_options(r, ctx, options)), spent["receiver"])
        sharer_scores = None
        if {"sharer", "t2t_choice"} & set(conditions):
            sharer_scores = timed("sharer", lambda: score_options(s, ctx, options))
            if "sharer" in conditions:
                put("sharer", sharer_scores, spent["sharer"])
        if "t2t" in conditions:
            def hint() -> str:  # the Sharer writes its hint as its own assistant turn, from the stem alone
                prompt = list(render(s, stem_hint_messages(q)).ids) + s.encode(s.generation_prompt())
                return s.generate(prompt, max_new_tokens=self.hint_tokens).text.strip()
            rec["hint"] = timed("hint", hint)
            scores = timed("t2t", lambda: score_options(r, f"A hint from another assistant: {rec['hint']}\n" + ctx,
                                                        options))
            put("t2t", scores, spent["hint"] + spent["t2t"])
        if "t2t_choice" in conditions:
            said = options[sharer_scores.acc_choice]
            rec["sharer_said"] = sharer_scores.acc_choice
            scores = timed("t2t_choice", lambda: score_options(r, f"Another assistant answered: {said}\n" + ctx,
                                                               options))
            put("t2t_choice", scores, spent["sharer"] + spent["t2t_choice"])
        fusing = [c for c in ("c2c", "control", "c2c_other", "c2c_zero") if c in conditions]
        if not fusing:
            return rec
        r_text = plain(r, ctx)
        _, r_cache = timed("r_prefill", lambda: r.prefill(list(r_text.ids)))           # [1, H_r, T_r, D_r]
        s_text = s_cache = index = None
        if _NEEDS_FUSER & set(fusing):
            s_text = plain(s, ctx)
            _, s_cache = timed("s_prefill", lambda: s.prefill(list(s_text.ids)))       # [1, H_s, T_s, D_s]
            index = timed("align", lambda: align_tokens(r_text, s_text))              # (T_r,)
        made: dict[str, KVCache] = {}
        for c in fusing:
            t0 = time.perf_counter()
            if c == "control":
                fused, _ = self.control.fuse_caches(r_cache, {})
            else:
                name = self.fused.links[0].sharer_name
                if c == "c2c":
                    given = (s_cache, index)
                elif c == "c2c_zero":
                    given = (_zeros_like(s_cache), index)
                else:  # c2c_other
                    rec["other_id"] = other.id
                    o_text = plain(s, lm_eval_context(other.question))
                    _, o_cache = s.prefill(list(o_text.ids))
                    given = (o_cache, proportional_index(len(r_text.ids), len(o_text.ids)))
                fused, _ = self.fused.fuse_caches(r_cache, {name: given})
            made[c] = fused
            # the context's last token runs again from the fused cache: its logits predict the options
            head = fused.slice(0, fused.seq_len - 1)
            scores = score_options(r, ctx, options, head=head)
            took = time.perf_counter() - t0 + spent["r_prefill"]
            if c != "control":
                took += spent.get("s_prefill", 0.0) + spent.get("align", 0.0)
            put(c, scores, took)
        rec["delta"] = cache_deltas(r_cache, made)
        return rec


@dataclass(frozen=True, kw_only=True)
class Evaluation:
    """What :func:`evaluate_checkpoints` found: per benchmark, one joined record per question."""

    records: dict[str, list[dict]]
    made: int  # records this run asked of the models (0: every one was read back from the records)

    def summary(self) -> dict:
        """:func:`summarize` over every benchmark's questions (pooled), with each benchmark's count."""
        pooled = [r for recs in self.records.values() for r in recs]
        return summarize(pooled) | {"benchmarks": {b: len(r) for b, r in self.records.items()}, "made": self.made}


def evaluate_checkpoints(checkpoint: str | Path, control_checkpoint: str | Path | None = None, *,
                         questions: dict[str, Sequence[Question]], conditions: Sequence[str] | None = None,
                         hint_tokens: int = 32, device: str = "cpu", records: str | Path | None = None,
                         kind: str = "general", extra: dict | None = None, progress: bool = True) -> Evaluation:
    """Score a fuser checkpoint (and its matched control) on ``questions`` (by benchmark name).

    With ``records`` (a pair's records folder, :mod:`c2c.bench.fuser_records`; ``kind`` names this
    fuser's files there), the records made with these checkpoints, models and hint length are read
    back and only what they lack is computed (and appended): when nothing is missing, no model is loaded.

    Args:
        conditions: a subset of :data:`CONDITIONS`; by default all of them (without ``control`` when no
            control checkpoint is given).

    Raises:
        FuserCheckpointError: not a fuser checkpoint, or a control where a fuser belongs (and the reverse).
        ConfigError: an unknown condition, or ``control`` without a control checkpoint.
    """
    meta = ckpt.read_meta(checkpoint)
    if meta.is_control:
        raise FuserCheckpointError(f"{checkpoint} is a control fuser; pass the Sharer's fuser as the checkpoint")
    control_meta = ckpt.read_meta(control_checkpoint) if control_checkpoint is not None else None
    if control_meta is not None and not control_meta.is_control:
        raise FuserCheckpointError(f"{control_checkpoint} is not a control fuser (its sharer is not \"self\")")
    if conditions is None:
        conditions = [c for c in CONDITIONS if c != "control" or control_meta is not None]
    bad = sorted(set(conditions) - set(CONDITIONS))
    if bad or not conditions:
        raise ConfigError(f"unknown conditions {bad}; choose from {', '.join(CONDITIONS)}")
    conditions = [c for c in CONDITIONS if c in conditions]
    if "control" in conditions and control_meta is None:
        raise ConfigError("the control condition needs the matched control fuser's checkpoint")
    store = Records.of(records, kind, meta, control_meta, hint_tokens=hint_tokens) if records is not None else None
    made = 0
    loaded: list[HarnessEvaluator] = []

    def evaluator() -> HarnessEvaluator:  # the models are loaded only when a record is missing
        if not loaded:
            fused = FusedReceiver.load([checkpoint], device=device)
            control = (FusedReceiver.load([control_checkpoint], receiver=fused.receiver, device=device)
                       if control_meta is not None else None)
            loaded.append(HarnessEvaluator(fused.receiver, sharer=fused.links[0].sharer, fused=fused,
                                           control=control, hint_tokens=hint_tokens))
        return loaded[0]

    def count(_rec: dict) -> None:
        nonlocal made
        made += 1

    out = {}
    for bench, qs in questions.items():
        ids = [q.id for q in qs]
        if store is not None and not store.missing(bench, ids, conditions):
            out[bench] = store.read(bench, ids, conditions)
        elif store is not None:
            out[bench] = store.run(evaluator(), bench, qs, conditions, extra=extra, progress=progress,
                                   on_record=count)
        else:
            out[bench] = evaluator().evaluate(qs, conditions, on_record=count, progress=progress, desc=bench)
    return Evaluation(records=out, made=made)


def other_question(questions: Sequence[Question], i: int) -> Question | None:
    """The question whose Sharer cache ``c2c_other`` feeds for question ``i``: the one half the list away
    (None for a list of one)."""
    return questions[(i + len(questions) // 2) % len(questions)] if len(questions) > 1 else None


def stem_hint_messages(q: Question) -> list[dict]:
    """The Sharer's t2t prompt: the stem it reads under c2c, and a request for the key fact."""
    return [{"role": "system", "content": SYSTEM},
            {"role": "user", "content": f"Question: {q.question.strip()}\n\nIn one or two sentences, state the key "
                                        "fact or reasoning needed to answer this question."}]


def cache_deltas(receiver: KVCache, fused: dict[str, KVCache]) -> dict[str, float]:
    """How far each fused cache lies from the Receiver's own (``"c2c~receiver"``), and c2c's from
    every other fused condition's (``"c2c~c2c_other"``): the Frobenius norm of the difference over
    every layer's K and V, relative to the Receiver cache's norm. A fuser that uses what the Sharer
    read moves its output when fed another question's cache; one that ignores it does not."""
    def flat(c: KVCache) -> list[torch.Tensor]:                      # each [1, H_r, T_r, D_r]
        return [t.float() for t in (*c.keys, *c.values)]

    def dist(a: list[torch.Tensor], b: list[torch.Tensor]) -> float | None:
        if [t.shape for t in a] != [t.shape for t in b]:
            return None
        return float(torch.sqrt(sum((x - y).square().sum() for x, y in zip(a, b))))

    base = flat(receiver)
    norm = float(torch.sqrt(sum(t.square().sum() for t in base))) or 1.0
    pairs = [(c, "receiver", flat(f), base) for c, f in fused.items()]
    if "c2c" in fused:
        pairs += [("c2c", c, flat(fused["c2c"]), flat(f)) for c, f in fused.items() if c != "c2c"]
    out = {}
    for a, b, x, y in pairs:
        d = dist(x, y)
        if d is not None:
            out[f"{a}~{b}"] = round(d / norm, 6)
    return out


def _zeros_like(cache: KVCache) -> KVCache:
    return KVCache(keys=tuple(torch.zeros_like(k) for k in cache.keys),
                   values=tuple(torch.zeros_like(v) for v in cache.values),
                   token_ids=cache.token_ids, start=cache.start, windows=cache.windows)


# ------------------------------------------------------------------ summary
def correct(records: Sequence[dict], condition: str, metric: str = "acc") -> np.ndarray:
    """``(n,)`` 0/1 per question; ``oracle`` is max(receiver, sharer)."""
    if condition == "oracle":
        return np.maximum(correct(records, "receiver", metric), correct(records, "sharer", metric))
    return np.array([int(r["cond"][condition][metric] == r["answer"]) for r in records], dtype=np.int64)


def summarize(records: Sequence[dict], *, compare_to: str = "c2c") -> dict:
    """Accuracy (acc, acc_norm) with 95% bootstrap intervals per condition, the oracle, latency,
    c2c/Sharer agreement, and paired differences ``compare_to - other`` with their intervals."""
    if not records:
        return {"n": 0, "conditions": {}}
    present = [c for c in CONDITIONS if all(c in r["cond"] for r in records)]
    conds = present + (["oracle"] if {"receiver", "sharer"} <= set(present) else [])
    out: dict = {"n": len(records), "conditions": {}, "paired": {}}
    for c in conds:
        row = {}
        for m in ("acc", "norm"):
            x = correct(records, c, m)
            row[m] = float(x.mean())
            row[f"{m}_ci95"] = bootstrap_mean(x, reps=4000)
        if c != "oracle":
            row["latency_s"] = float(np.mean([r["cond"][c]["s"] for r in records]))
        out["conditions"][c] = row
    if compare_to in present:
        for c in conds:
            if c == compare_to:
                continue
            row = {}
            for m in ("acc", "norm"):
                d = correct(records, compare_to, m) - correct(records, c, m)
                lo, hi = bootstrap_mean(d, reps=4000)
                row[m] = {"diff": float(d.mean()), "ci95": (lo, hi), "clears": lo > 0, "below": hi < 0}
            out["paired"][c] = row
    deltas: dict[str, list[float]] = {}
    for r in records:
        for k, v in r.get("delta", {}).items():
            deltas.setdefault(k, []).append(v)
    if deltas:  # mean relative distances between caches (see cache_deltas), over the questions that have them
        out["cache_delta"] = {k: {"mean": float(np.mean(v)), "n": len(v)} for k, v in sorted(deltas.items())}
    if {"c2c", "sharer"} <= set(present):
        out |= sharer_agreement(records, [c for c in present if c != "sharer"])
    return out


def sharer_agreement(records: Sequence[dict], conditions: Sequence[str]) -> dict:
    """How often each condition picks the Sharer's option (``acc`` choice), with 95% intervals, and
    c2c's agreement minus each other condition's, paired per question. c2c/Sharer agreement alone
    says little: two models that often guess, or find the same questions easy, agree without any
    handoff. Fusion that hands over what the Sharer read moves c2c toward the Sharer beyond the
    Receiver, its control and the causal controls."""
    def agrees(c: str) -> np.ndarray:  # (n,) 1 where condition c chose the Sharer's option
        return np.array([int(r["cond"][c]["acc"] == r["cond"]["sharer"]["acc"]) for r in records], dtype=np.int64)

    per = {c: agrees(c) for c in conditions}
    out = {"sharer_agreement": {c: {"rate": float(x.mean()), "ci95": bootstrap_mean(x, reps=4000)}
                                for c, x in per.items()},
           "sharer_agreement_shift": {}}
    for c, x in per.items():
        if c in ("c2c", "t2t_choice"):  # t2t_choice is told the Sharer's option: not a baseline for a shift
            continue
        d = per["c2c"] - x                                                   # (n,) in {-1, 0, 1}
        lo, hi = bootstrap_mean(d, reps=4000)
        out["sharer_agreement_shift"][c] = {"diff": float(d.mean()), "ci95": (lo, hi), "clears": lo > 0}
    return out
