"""Evaluation: accuracy and per-question latency of five ways to answer a multiple-choice question.

Conditions (each question's context is the same system + user messages):

- ``receiver``: the Receiver alone.
- ``sharer``: the Sharer alone, with its own template.
- ``t2t``: the Sharer writes a short hint (greedy, ``hint_tokens``); the Receiver
  answers with the hint in its context.
- ``c2c``: the Receiver answers from the cache fused with the Sharer's (hard gates).
- ``control``: like c2c, but with a fuser trained the same way on the Receiver's
  own cache in place of the Sharer's: what the extra parameters alone buy.

Scoring (``scoring``): ``label`` compares the log-likelihood of each option's
label right after the generation prompt; ``text`` compares the mean per-token
log-likelihood of the whole answer ``"B. <option text>"``, which small models
bias less towards one label. The highest wins. ``generate`` lets the model answer
greedily (``GENERATE_TOKENS`` at most) and reads the label from its words
(:func:`parse_choice`); an answer that names no option counts as wrong.

Latency is the sum of the steps a condition needs, run one after another on
this process: for c2c, Receiver prefill + Sharer prefill +
alignment + fusion + scoring; for t2t, the Sharer's hint (prefill and decode) +
the Receiver's prefill of the longer context + scoring. Caches two conditions
share are computed once and their time is charged to both.
"""

from __future__ import annotations

import re
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable, Sequence

import torch
from tqdm import tqdm

from c2c.errors import ConfigError, FuserCheckpointError
from c2c.fuser import checkpoint as ckpt
from c2c.fuser.align import render
from c2c.fuser.data import Question, hint_messages, mc_messages, mc_response
from c2c.fuser.infer import FusedReceiver

CONDITIONS = ("receiver", "sharer", "t2t", "c2c", "control")


@dataclass(frozen=True, kw_only=True)
class EvalReport:
    """Accuracy (0..1) and mean latency (seconds per question) per condition, over ``n`` questions."""

    data: str
    n: int
    scoring: str
    accuracy: dict[str, float]
    latency_s: dict[str, float]
    records: tuple[dict, ...] = ()

    def to_dict(self, with_records: bool = False) -> dict:
        d = asdict(self)
        if not with_records:
            d.pop("records")
        return d


SCORINGS = ("label", "text", "generate")
GENERATE_TOKENS = 16  # generate scoring: enough for "The answer is B. <a few words>"


def parse_choice(text: str, q: Question) -> str:
    """The option a generated answer names, or ``""`` when it names none.

    In order: a label that opens the answer (``"B"``, ``"(B)"``, ``"B."``; not the
    article in ``"A careful look"``); a label after "answer (is)"/"答案"; the
    option whose text the answer contains first; the first label standing alone.
    """
    t = text.strip()
    alts = "|".join(re.escape(lab) for lab in sorted(q.labels, key=len, reverse=True))
    alone = rf"(?<![A-Za-z0-9])({alts})(?![A-Za-z0-9])"
    opening = rf"^\**\(?({alts})(?=$|[^\sA-Za-z0-9]|\s*\n)"
    stated = rf"(?i:answer|答案)(?i:\s*(?:is|was|would be|should be)\b)?[^A-Za-z0-9]{{0,6}}?{alone}"
    for pattern in (opening, stated):
        m = re.search(pattern, t)
        if m:
            return m.group(1)
    low = t.lower()
    hits = [(low.find(opt.strip().lower()), lab) for lab, opt in q.options if opt.strip()]
    hits = [(i, lab) for i, lab in hits if i >= 0]
    if hits:
        return min(hits)[1]
    m = re.search(alone, t)
    return m.group(1) if m else ""


@torch.inference_mode()
def choose(runtime, gen_ids: Sequence[int], cache, q: Question, scoring: str = "label"
           ) -> tuple[str, dict[str, float]]:
    """The best option after ``gen_ids`` (fed after ``cache``), and every option's score.

    ``label``: log p(label); ``text``: mean log p per token of ``"label. option text"``;
    ``generate``: 1 for the option a greedy answer names (:func:`parse_choice`), else 0.
    """
    if scoring not in SCORINGS:
        raise ConfigError(f"unknown scoring {scoring!r}; use one of {SCORINGS}")
    if scoring == "generate":
        said = runtime.generate(list(gen_ids), cache, max_new_tokens=GENERATE_TOKENS).text
        pred = parse_choice(said, q)
        return pred, {label: float(label == pred) for label in q.labels}
    answers = q.labels if scoring == "label" else [mc_response(q_, "label_text") for q_ in _as_answers(q)]
    answer_ids = [runtime.encode(a) for a in answers]
    if scoring == "label" and all(len(ids) == 1 for ids in answer_ids):  # one forward scores every option
        logits, _ = runtime.prefill(list(gen_ids), cache)
        lp = torch.log_softmax(logits.float(), -1)
        scores = {label: float(lp[ids[0]]) for label, ids in zip(q.labels, answer_ids)}
    else:
        scores = {}
        P = len(gen_ids)
        batch = runtime.logits_batch([list(gen_ids) + ids for ids in answer_ids], cache)  # one forward
        for label, ids, logits in zip(q.labels, answer_ids, batch):
            lp = torch.log_softmax(logits.float(), -1)                                     # (P+L, V)
            total = float(sum(lp[P - 1 + k, t] for k, t in enumerate(ids)))
            scores[label] = total if scoring == "label" else total / len(ids)
    return max(scores, key=scores.get), scores


def _as_answers(q: Question) -> list[Question]:
    """``q`` once per option, with that option as the answer (to spell each candidate response)."""
    return [Question(id=q.id, question=q.question, options=q.options, answer=label, subject=q.subject)
            for label in q.labels]


class Evaluator:
    """Runs the conditions over questions. Build with :meth:`from_checkpoint` or pass the parts."""

    def __init__(self, *, receiver, sharer=None, fused: FusedReceiver | None = None,
                 control: FusedReceiver | None = None, hint_tokens: int = 48, scoring: str = "label"):
        if scoring not in SCORINGS:
            raise ConfigError(f"unknown scoring {scoring!r}; use one of {SCORINGS}")
        self.receiver, self.sharer = receiver, sharer
        self.fused, self.control = fused, control
        self.hint_tokens, self.scoring = hint_tokens, scoring

    @classmethod
    def from_checkpoint(cls, checkpoint: str | Path, *, control_checkpoint: str | Path | None = None,
                        conditions: Sequence[str] = CONDITIONS, device: str = "cpu", dtype: str = "float32",
                        hint_tokens: int = 48, scoring: str = "label") -> "Evaluator":
        """Load the fuser, its models, and (for ``control``) the control fuser.

        The control checkpoint defaults to ``<checkpoint>-control``, else ``control``,
        next to ``checkpoint``.
        """
        fused = FusedReceiver.load([checkpoint], device=device, dtype=dtype)
        if fused.links[0].sharer is None:
            raise ConfigError(f"{checkpoint} is a control fuser; pass the Sharer's fuser as --checkpoint")
        control = None
        if "control" in conditions:
            here = Path(checkpoint)
            candidates = [Path(control_checkpoint)] if control_checkpoint else [
                here.with_name(here.name + "-control"), here.with_name("control")]
            path = next((c for c in candidates if (c / ckpt.CONFIG).is_file()), candidates[0])
            if not (path / ckpt.CONFIG).is_file():
                raise FuserCheckpointError(f"no control fuser at {path}; train one (sharer \"self\") or drop "
                                           "'control' from --conditions")
            control = FusedReceiver.load([path], receiver=fused.receiver, device=device)
            if control.links[0].sharer is not None:
                raise FuserCheckpointError(f"{path} is not a control fuser (its sharer is not \"self\")")
        return cls(receiver=fused.receiver, sharer=fused.links[0].sharer, fused=fused, control=control,
                   hint_tokens=hint_tokens, scoring=scoring)

    def _need(self, conditions: Sequence[str]) -> None:
        bad = [c for c in conditions if c not in CONDITIONS]
        if bad:
            raise ConfigError(f"unknown conditions {bad}; choose from {', '.join(CONDITIONS)}")
        if any(c in conditions for c in ("sharer", "t2t", "c2c")) and self.sharer is None:
            raise ConfigError("sharer, t2t and c2c need a Sharer")
        if "c2c" in conditions and self.fused is None:
            raise ConfigError("c2c needs a trained fuser")
        if "control" in conditions and self.control is None:
            raise ConfigError("control needs a control fuser")

    def evaluate(self, questions: Sequence[Question], conditions: Sequence[str] = CONDITIONS, *,
                 data: str = "", progress: bool = True, done: Sequence[dict] = (),
                 on_record: Callable[[dict], None] | None = None) -> EvalReport:
        """Run ``conditions`` over ``questions``.

        ``done`` holds records of an interrupted run of the same questions and
        conditions (by question id): those questions are not asked again, and the
        report counts them. ``on_record`` gets each new record as it is made (to
        save progress).
        """
        self._need(conditions)
        prior = {rec["id"]: rec for rec in done}
        conditions = [c for c in CONDITIONS if c in conditions]
        r = self.receiver
        r_gen = r.encode(r.generation_prompt())
        s_gen = self.sharer.encode(self.sharer.generation_prompt()) if self.sharer is not None else []
        correct = {c: 0 for c in conditions}
        latency = {c: 0.0 for c in conditions}
        records = []
        for q in tqdm(questions, desc="eval", unit="q", disable=not progress):
            rec = prior.get(q.id)
            if rec is None or not all(c in rec["pred"] for c in conditions):
                rec = self._ask(q, conditions, r_gen, s_gen)
                if on_record is not None:
                    on_record(rec)
            for c in conditions:
                correct[c] += int(rec["pred"][c] == q.answer)
                latency[c] += rec["latency_s"][c]
            records.append(rec)
        n = len(questions)
        return EvalReport(data=data, n=n, scoring=self.scoring, accuracy={c: correct[c] / n if n else 0.0 for c in conditions},
                          latency_s={c: latency[c] / n if n else 0.0 for c in conditions}, records=tuple(records))

    def _ask(self, q: Question, conditions: Sequence[str], r_gen: list[int], s_gen: list[int]) -> dict:
        """One question under every condition: ``{"id", "answer", "pred", "latency_s"[, "hint"]}``."""
        r = self.receiver
        msgs = mc_messages(q)
        rec: dict = {"id": q.id, "answer": q.answer, "pred": {}, "latency_s": {}}
        t0 = time.perf_counter()
        r_ctx = render(r, msgs)
        _, r_cache = r.prefill(list(r_ctx.ids))
        t_r = time.perf_counter() - t0
        s_ctx = None
        if self.sharer is not None and {"sharer", "c2c"} & set(conditions):
            t0 = time.perf_counter()
            sr = render(self.sharer, msgs)
            _, s_cache = self.sharer.prefill(list(sr.ids))
            s_ctx, t_s = (sr, s_cache), time.perf_counter() - t0
        for c in conditions:
            t0 = time.perf_counter()
            if c == "receiver":
                pred, _ = choose(r, r_gen, r_cache, q, self.scoring)
                spent = t_r
            elif c == "sharer":
                pred, _ = choose(self.sharer, s_gen, s_ctx[1], q, self.scoring)
                spent = t_s
            elif c == "t2t":
                h = render(self.sharer, hint_messages(q))
                # the Sharer writes its hint as its own assistant turn
                hint = self.sharer.generate(list(h.ids) + s_gen, max_new_tokens=self.hint_tokens).text
                rh = render(r, mc_messages(q, hint=hint))
                _, rh_cache = r.prefill(list(rh.ids))
                pred, _ = choose(r, r_gen, rh_cache, q, self.scoring)
                rec["hint"] = hint
                spent = 0.0
            elif c == "c2c":
                fused = self.fused.fuse(msgs, context=(r_ctx, r_cache),
                                        sharer_contexts={self.fused.links[0].sharer_name: s_ctx})
                pred, _ = choose(r, r_gen, fused.cache, q, self.scoring)
                spent = t_r + t_s
            else:  # control
                fused = self.control.fuse(msgs, context=(r_ctx, r_cache))
                pred, _ = choose(r, r_gen, fused.cache, q, self.scoring)
                spent = t_r
            spent += time.perf_counter() - t0
            rec["pred"][c], rec["latency_s"][c] = pred, spent
        return rec
