"""The fuser harness's per-question records: where they live, and how one fuser's passes join per question.

A pair's records sit in one folder (``benchmarks/results/fuser_records/pair_b``), one JSON line per
question in one file per benchmark and pass::

    <benchmark>.base.jsonl             receiver, sharer, t2t, t2t_choice: independent of the fuser; tagged
                                       with both models' weight digests and the hint length
    <benchmark>.<kind>.jsonl           c2c, c2c_other, c2c_zero: tagged with the fuser's id
    <benchmark>.<kind>.control.jsonl   control: tagged with the control fuser's id

``kind`` names how the fuser was trained (``general`` or ``task-tuned``). A record made with other
models, checkpoints or settings is never read back (:meth:`Records.read` keeps only its own tags),
so a run resumes from what matches, and a new checkpoint starts afresh beside the old records.
Every number :func:`c2c.bench.harness.summarize` gives can be recomputed from these files
without loading a model: ``c2c fuser eval --records`` and ``benchmarks/fuser_report.py`` do.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

# what the harness (c2c.bench.harness) scores, in its order; every record's "cond" holds some of them
CONDITIONS = ("receiver", "sharer", "t2t", "t2t_choice", "c2c", "control", "c2c_other", "c2c_zero")
BASE = ("receiver", "sharer", "t2t", "t2t_choice")     # independent of the fuser
FUSED = ("c2c", "c2c_other", "c2c_zero")               # per fuser checkpoint
CONTROL = ("control",)                                 # per control checkpoint
BENCHMARKS = {  # name -> path under the data root; the first four are reported splits, never trained on
    "ARC-Challenge dev": "eval/arc_challenge/ARC-Challenge-Dev.jsonl",
    "OpenBookQA": "eval/openbookqa/test.jsonl",
    "MMLU val": "eval/mmlu/val",
    "C-Eval val": "eval/ceval/val",
    "ARC-Easy test": "eval/arc_easy/ARC-Easy-Test.jsonl",
}


def slug(name: str) -> str:
    """A benchmark's name as a file name: ``"ARC-Easy test"`` -> ``"arc_easy_test"``."""
    return "".join(ch if ch.isalnum() else "_" for ch in name.lower()).strip("_")


def record_file(folder: Path, bench: str, group: str | None) -> Path:
    """``group``: None (the fuser-free pass), a kind (its fuser's), or ``KIND.control``."""
    return Path(folder) / f"{slug(bench)}.{group or 'base'}.jsonl"


def read_records(path: Path, tag: dict | None = None) -> dict[str, dict]:
    """Complete lines by question id (a run killed mid-write leaves a partial line, skipped); with
    ``tag``, only the records whose fields hold those values (made with the same checkpoints and settings)."""
    out = {}
    for line in path.read_text().splitlines() if path.is_file() else []:
        try:
            r = json.loads(line)
        except ValueError:
            continue
        if isinstance(r, dict) and "id" in r and (tag is None or all(r.get(k) == v for k, v in tag.items())):
            out[r["id"]] = r
    return out


def open_for_append(path: Path):
    """Append to ``path``, first cutting a partial last line (a killed run's), so nothing glues onto it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.is_file():
        data = path.read_bytes()
        if data and not data.endswith(b"\n"):
            with open(path, "r+b") as f:
                f.truncate(data.rfind(b"\n") + 1)
    return open(path, "a")


@dataclass(frozen=True, kw_only=True)
class Pass:
    """One pass of the harness over a benchmark: its conditions, its file and the tag its records carry."""

    name: str                     # "base", "fused" or "control"
    conditions: tuple[str, ...]
    path: Path
    tag: dict[str, Any] | None


@dataclass(frozen=True, kw_only=True)
class Records:
    """One fuser's records in a pair's folder (see the module docstring).

    ``base_tag``: ``{"receiver_w", "sharer_w", "hint_tokens"}`` (None reads every base record);
    ``fuser_id`` / ``control_id``: the checkpoints whose fused and control records are read.
    """

    folder: Path
    kind: str
    base_tag: dict[str, Any] | None
    fuser_id: str | None
    control_id: str | None = None

    @classmethod
    def of(cls, folder: str | Path, kind: str, fuser, control=None, *, hint_tokens: int) -> "Records":
        """The records of the fuser (and control) whose :class:`~c2c.fuser.checkpoint.FuserMeta` are given."""
        return cls(folder=Path(folder), kind=kind, fuser_id=fuser.fuser_id,
                   control_id=control.fuser_id if control is not None else None,
                   base_tag={"receiver_w": fuser.receiver["weights_digest"][:16],
                             "sharer_w": fuser.sharer["weights_digest"][:16], "hint_tokens": hint_tokens})

    def passes(self, bench: str, conditions: Sequence[str] = BASE + FUSED + CONTROL) -> list[Pass]:
        """The passes that hold ``conditions`` (in the harness's order), those with none of them left out."""
        out = []
        for name, conds, group, tag in (("base", BASE, None, self.base_tag),
                                        ("fused", FUSED, self.kind, {"fuser_id": self.fuser_id}),
                                        ("control", CONTROL, f"{self.kind}.control", {"control_id": self.control_id})):
            asked = tuple(c for c in conds if c in conditions)
            if asked:
                out.append(Pass(name=name, conditions=asked, path=record_file(self.folder, bench, group), tag=tag))
        return out

    def read(self, bench: str, ids: Sequence[str], conditions: Sequence[str] = BASE + FUSED + CONTROL) -> list[dict]:
        """One record per question of ``ids`` (in that order) joining the passes of ``conditions``: a question
        is kept when every pass but the control's holds it; the control's conditions join where measured."""
        found = [(p, read_records(p.path, p.tag)) for p in self.passes(bench, conditions)]
        needed = [recs for p, recs in found if p.name != "control"] or [recs for _, recs in found]
        out = []
        for i in ids:
            if not all(i in recs for recs in needed):
                continue
            have = [recs[i] for _, recs in found if i in recs]
            rec: dict = {"id": i, "answer": have[0]["answer"], "cond": {}}
            delta: dict = {}
            for r in have:
                rec["cond"] |= r["cond"]
                delta |= r.get("delta", {})
            out.append(rec | ({"delta": delta} if delta else {}))
        return out

    def missing(self, bench: str, ids: Sequence[str], conditions: Sequence[str]) -> bool:
        """Whether a question of ``ids`` lacks a condition of ``conditions`` in the records."""
        recs = {r["id"]: r for r in self.read(bench, ids, conditions)}
        return any(i not in recs or not set(conditions) <= set(recs[i]["cond"]) for i in ids)

    def run(self, evaluator, bench: str, questions: Sequence, conditions: Sequence[str], *,
            extra: dict[str, Any] | None = None, progress: bool = True,
            on_record: Callable[[dict], None] | None = None) -> list[dict]:
        """Ask ``evaluator`` (a :class:`~c2c.bench.harness.HarnessEvaluator`) what the records lack, pass by
        pass, appending each new record (with its pass's tag and ``extra``) to its file; then :meth:`read`."""
        for p in self.passes(bench, conditions):
            done = list(read_records(p.path, p.tag).values())
            with open_for_append(p.path) as f:
                def write(rec: dict, f=f, p=p) -> None:
                    f.write(json.dumps(rec | (p.tag or {}) | (extra or {})) + "\n")
                    f.flush()
                    if on_record is not None:
                        on_record(rec)
                evaluator.evaluate(questions, p.conditions, done=done, desc=f"{bench} ({p.name})",
                                   on_record=write, progress=progress)
        return self.read(bench, [q.id for q in questions], conditions)
