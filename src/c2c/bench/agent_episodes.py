"""A tool-using agent's episodes, for measuring what dropping old tool responses costs (agent_context benchmark).

An episode is ``steps`` steps. At step ``k`` the agent calls a tool (an assistant message)
and reads its response: a window of about ``doc_tokens`` tokens of real prose (LIMA's
outputs, as :mod:`c2c.bench.context_qa`) with ``facts_per_doc`` made-up facts planted in it.
At the checkpoints the agent is asked questions whose answers are facts of earlier responses:
``kept`` ones from the responses a rolling window of the last ``window`` still holds, and
``dropped`` ones from responses it has already dropped (what dropping loses). A question
branches off the episode: it is not part of the history of later steps.

Everything is drawn from ``seed``: the same episodes for every condition and every run.
"""

from __future__ import annotations

import random
from dataclasses import asdict, dataclass

from c2c.bench.context_qa import fact, plant, prose, window

SYSTEM = ("You are an agent that reads tool results. When asked a question, reply with the exact answer only: "
          "no other words.")
CHECKPOINTS = {6: (2, 0), 12: (5, 2), 16: (5, 2)}  # step -> (kept questions, dropped questions)


@dataclass(frozen=True, kw_only=True)
class AgentQuestion:
    id: str
    step: int            # asked after this step's tool response
    source: int          # the step whose tool response holds the fact
    kind: str            # "kept" (the window still holds it) or "dropped"
    question: str
    answer: str


def ask(question: str) -> str:
    """The user turn that asks ``question`` (it branches off the episode)."""
    return f"Stop calling tools. Question about the documents you read: {question} Reply with the answer only."


@dataclass(frozen=True, kw_only=True)
class Episode:
    id: str
    calls: tuple[str, ...]       # the assistant's tool call at each step
    responses: tuple[str, ...]   # the tool's response at each step
    questions: tuple[AgentQuestion, ...]

    def messages(self, step: int) -> list[dict]:
        """The full history after ``step`` tool responses (1-based): system, then call and response per step."""
        out = [{"role": "system", "content": SYSTEM}]
        for c, r in zip(self.calls[:step], self.responses[:step]):
            out += [{"role": "assistant", "content": c}, {"role": "tool", "content": r}]
        return out

    def to_dict(self) -> dict:
        return {"id": self.id, "questions": [asdict(q) for q in self.questions],
                "response_chars": [len(r) for r in self.responses]}


def response_index(step: int) -> int:
    """The index in :meth:`Episode.messages` of step ``step``'s tool response."""
    return 2 * step


def build(runtime, n: int, *, steps: int = 16, doc_tokens: int = 300, facts_per_doc: int = 2, keep: int = 8,
          checkpoints: dict[int, tuple[int, int]] = CHECKPOINTS, seed: int = 0) -> list[Episode]:
    """``n`` episodes (see the module docstring); ``keep`` is the policy's window, which decides kept and dropped."""
    paragraphs = prose()
    rng = random.Random(seed * 7_919 + steps * 31 + doc_tokens)
    out = []
    for e in range(n):
        facts: dict[int, list[tuple[str, str]]] = {}
        responses, seen = [], set()
        for k in range(1, steps + 1):
            sentences = window(runtime, paragraphs, rng, doc_tokens)
            planted = []
            while len(planted) < facts_per_doc:
                sentence, question, answer = fact(rng)
                if question not in seen:  # each question has one answer within the episode
                    seen.add(question)
                    planted.append((sentence, question, answer))
            facts[k] = [(q, a) for _, q, a in planted]
            responses.append(plant(sentences, [s for s, _, _ in planted], rng))
        questions, used = [], set()
        for step, (n_kept, n_dropped) in sorted(checkpoints.items()):
            if step > steps:
                continue
            first_kept = max(1, step - keep + 1)
            for kind, lo, hi, count in (("kept", first_kept, step, n_kept), ("dropped", 1, first_kept - 1, n_dropped)):
                pool = [(k, j) for k in range(lo, hi + 1) for j in range(facts_per_doc) if (k, j) not in used]
                for k, j in rng.sample(pool, min(count, len(pool))):
                    used.add((k, j))
                    q, a = facts[k][j]
                    questions.append(AgentQuestion(id=f"ep{seed}-{e}-s{step}-{len(questions)}", step=step, source=k,
                                                   kind=kind, question=q, answer=a))
        out.append(Episode(id=f"ep{seed}-{e}", calls=tuple(f"Calling read_document({k})." for k in range(1, steps + 1)),
                           responses=tuple(responses), questions=tuple(questions)))
    return out
