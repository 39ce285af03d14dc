"""The demo scenario: an analyst works through real exam questions and hands off to a writer.

Run once by text (the analyst writes a message, the writer reads it) and once by
cache (the writer continues from the analyst's KV-cache), on a real zoo model,
and report time per stage, bytes moved, tokens decoded and prefilled, and both
final answers. The questions (MMLU dev) ship with the package.
"""

from __future__ import annotations

import csv
import json
import time
from importlib import resources
from dataclasses import dataclass

from c2c.artifact.prefix import SharedPrefix
from c2c.config import data_dir
from c2c.errors import ConfigError
from c2c.handoff import hand_off
from c2c.runtime.protocol import Runtime
from c2c.team.agent import Agent, Team

SYSTEM = ("You are part of a two-agent team answering exam questions. The analyst studies the questions; "
          "the writer gives the final answers.")
ANALYST = "You are the analyst. Study each question and its options carefully."
WRITER = "You are the writer. Reply with only the final answers, one per line, like '1: A'."


@dataclass(frozen=True, kw_only=True)
class DemoResult:
    mode: str
    stages: dict[str, float]
    bytes_moved: int
    tokens_decoded: int
    tokens_prefilled: int
    answer: str
    reason: str

    @property
    def total_s(self) -> float:
        return sum(self.stages.values())


def load_questions(n: int = 3) -> list[dict]:
    """The first ``n`` questions the demo ships (5, MMLU dev, high-school computer science).

    More than that are read from the shared data (``C2C_DATA``), the same subject's dev split.
    """
    shipped = json.loads(resources.files("c2c.demos").joinpath("data/mmlu_hs_cs_dev.json").read_text())["questions"]
    if n <= len(shipped):
        return shipped[:n]
    path = data_dir() / "eval" / "mmlu" / "dev" / "high_school_computer_science_dev.csv"
    try:
        with open(path, newline="") as f:
            rows = list(csv.reader(f))
    except OSError:
        raise ConfigError(f"the demo ships {len(shipped)} questions; for {n}, set C2C_DATA to the shared data "
                          f"folder (cannot read {path})") from None
    return [{"question": r[0], "options": dict(zip("ABCD", r[1:5])), "answer": r[5]} for r in rows[:n]]


def material(questions: list[dict]) -> str:
    parts = []
    for i, q in enumerate(questions, 1):
        opts = "\n".join(f"{k}. {v}" for k, v in q["options"].items())
        parts.append(f"Question {i}: {q['question']}\n{opts}")
    return "\n\n".join(parts)


def run_mode(runtime: Runtime, team: Team, text: str, mode: str, *, message_tokens: int,
             answer_tokens: int) -> DemoResult:
    analyst = Agent("analyst", runtime, team, role=ANALYST)
    writer = Agent("writer", runtime, team, role=WRITER)
    t0 = time.perf_counter()
    analyst.read(text, label="evidence")
    read_s = time.perf_counter() - t0
    h = hand_off(analyst, writer, mode=mode, message_tokens=message_tokens,
                 message_prompt="Write a short analysis of each question for the writer, with the answer you favour.")
    t0 = time.perf_counter()
    gen = writer.respond("Give the letter of the correct option for each question.", max_new_tokens=answer_tokens)
    answer_s = time.perf_counter() - t0
    stages = {"analyst reads": read_s, **{k.removesuffix("_s").replace("_", " "): v for k, v in h.timings.items()},
              "writer answers": answer_s}
    return DemoResult(mode=h.used, stages=stages, bytes_moved=h.artifact_bytes or len((h.message or "").encode()),
                      tokens_decoded=analyst.stats.decoded + writer.stats.decoded,
                      tokens_prefilled=analyst.stats.prefilled + writer.stats.prefilled,
                      answer=gen.text.strip(), reason=h.reason)


def run(runtime: Runtime, *, questions: int = 3, message_tokens: int = 96, answer_tokens: int = 24) -> dict:
    qs = load_questions(n=questions)
    team = Team(shared=SharedPrefix.build(SYSTEM, context={"exam": "MMLU", "subject": "high_school_computer_science"}))
    team.prefix_cache(runtime)
    text = material(qs)
    results = [run_mode(runtime, team, text, m, message_tokens=message_tokens, answer_tokens=answer_tokens)
               for m in ("text", "full")]
    return {
        "model": runtime.name,
        "correct": [q["answer"] for q in qs],
        "runs": [{"mode": r.mode, "total_s": r.total_s, "stages": r.stages, "bytes_moved": r.bytes_moved,
                  "tokens_decoded": r.tokens_decoded, "tokens_prefilled": r.tokens_prefilled,
                  "answer": r.answer, "reason": r.reason} for r in results],
        "speedup": results[0].total_s / results[1].total_s,
    }


def format_table(report: dict) -> str:
    runs = report["runs"]
    order = ["analyst reads", "write message", "read message", "export", "write", "read", "import", "writer answers"]
    seen = {s for r in runs for s in r["stages"]}
    stages = [s for s in order if s in seen] + sorted(seen - set(order))
    w = max(len(s) for s in stages + ["tokens prefilled"]) + 2
    lines = [f"model: {report['model']}", "", f"{'':<{w}}" + "".join(f"{r['mode']:>14}" for r in runs)]
    for s in stages:
        lines.append(f"{s:<{w}}" + "".join(f"{r['stages'].get(s, 0.0):>13.2f}s" for r in runs))
    lines.append(f"{'total':<{w}}" + "".join(f"{r['total_s']:>13.2f}s" for r in runs))
    lines.append(f"{'bytes moved':<{w}}" + "".join(f"{r['bytes_moved']:>14,}" for r in runs))
    lines.append(f"{'tokens decoded':<{w}}" + "".join(f"{r['tokens_decoded']:>14}" for r in runs))
    lines.append(f"{'tokens prefilled':<{w}}" + "".join(f"{r['tokens_prefilled']:>14}" for r in runs))
    lines.append("")
    lines.append(f"cache pipeline is {report['speedup']:.1f}x faster end to end")
    lines.append(f"correct answers: {', '.join(f'{i}: {a}' for i, a in enumerate(report['correct'], 1))}")
    for r in runs:
        lines.append(f"\n[{r['mode']}] writer's answer ({r['reason']}):\n  " + r["answer"].replace("\n", "\n  "))
    return "\n".join(lines)
