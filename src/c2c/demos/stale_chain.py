"""Demo: researcher -> analyst -> writer over the store; upstream publishes v2 and the chain goes stale
(``c2c demo chain``)."""

from __future__ import annotations

import time

from c2c.artifact.prefix import SharedPrefix
from c2c.errors import StaleCommitError
from c2c.flows.chain import ChainReport, ChainStep, publish, pull
from c2c.runtime.protocol import Runtime
from c2c.team.agent import Agent, Team

DOC_V1 = ("Release notes v1.4: the export command now writes artifacts atomically. "
          "Known issue: the Redis backend does not support TLS yet.")
DOC_V2 = ("Release notes v1.5: the export command now writes artifacts atomically. "
          "The Redis backend now supports TLS through rediss:// URLs.")


def run(runtime: Runtime, store, *, policy: str = "re-pull", answer_tokens: int = 24) -> ChainReport:
    """Researcher -> analyst -> writer; then the researcher publishes a new version.

    ``policy`` is what the writer does with stale context: ``re-pull`` (rebuild the
    chain from the latest upstream version) or ``continue`` (answer from the old
    commit, flagged as built on stale context).
    """
    if policy not in ("re-pull", "continue"):
        raise ValueError("policy must be 're-pull' or 'continue'")
    team = Team(shared=SharedPrefix.build("Three agents maintain the project's release answers.",
                                          context={"project": "c2c"}))
    steps: list[ChainStep] = []
    answers: dict[str, str] = {}

    def timed(what: str, fn, note=""):
        t0 = time.perf_counter()
        out = fn()
        steps.append(ChainStep(what=what, commit=out if isinstance(out, str) else None, note=note,
                               seconds=time.perf_counter() - t0))
        return out

    def researcher_version(doc: str) -> str:
        r = Agent("researcher", runtime, team, role="You are the researcher.")
        r.read(doc, label="evidence")
        return publish(store, r)

    def analyst_from(commit: str) -> str:
        a = Agent("analyst", runtime, team, role="You are the analyst.")
        pull(store, commit, a, mode="full")
        answers[f"analyst on researcher v{store.show(commit).commit.version}"] = a.respond("Does the Redis backend support TLS? Answer yes or no with the version.",
                                       max_new_tokens=answer_tokens).text
        return publish(store, a, parents=(commit,))

    def writer_from(commit: str, allow_stale: bool = False) -> tuple[str, bool]:
        w = Agent("writer", runtime, team, role="You are the writer.")
        stale = pull(store, commit, w, mode="full", allow_stale=allow_stale).stale
        v = store.show(store.show(commit).commit.parents[0]).commit.version
        answers[f"writer on researcher v{v}" + (" (stale context)" if stale else "")] = w.respond(
            "Write one sentence for users about TLS support in Redis.", max_new_tokens=answer_tokens).text
        return publish(store, w, parents=(commit,)) if not stale else commit, stale

    r1 = timed("researcher publishes v1", lambda: researcher_version(DOC_V1))
    a1 = timed("analyst pulls v1, publishes", lambda: analyst_from(r1))
    timed("writer pulls analyst, publishes", lambda: writer_from(a1)[0])
    r2 = timed("researcher publishes v2 (supersedes v1)", lambda: researcher_version(DOC_V2))
    rec = store.show(a1)
    steps.append(ChainStep(what="analyst's commit is now", commit=a1, stale=rec.stale, note=rec.stale_reason or ""))
    try:
        writer_from(a1)
        steps.append(ChainStep(what="writer pulled without error (unexpected)", commit=a1))
    except StaleCommitError as e:
        steps.append(ChainStep(what="writer refuses stale context", commit=a1, stale=True, note=str(e)))
    if policy == "re-pull":
        a2 = timed("analyst re-pulls v2, publishes", lambda: analyst_from(store.latest("researcher").id))
        timed("writer pulls fresh analyst, publishes", lambda: writer_from(a2)[0])
    else:
        t0 = time.perf_counter()
        writer_from(a1, allow_stale=True)
        steps.append(ChainStep(what="writer continues on stale context (flagged)", commit=a1, stale=True,
                               note="built on stale context", seconds=time.perf_counter() - t0))
    del r2
    return ChainReport(steps=tuple(steps), answers=answers)


def format_report(rep: ChainReport) -> str:
    lines = []
    for s in rep.steps:
        flag = " STALE" if s.stale else ""
        cid = f" {s.commit[:12]}" if s.commit else ""
        lines.append(f"{s.what:<44}{cid}{flag}  {s.seconds:6.2f}s" + (f"\n    {s.note}" if s.note else ""))
    lines.append("")
    for who, text in rep.answers.items():
        lines.append(f"[{who}] {text.strip()}")
    return "\n".join(lines)
