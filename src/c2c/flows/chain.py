"""A chain of agents over the commit store: publish, pull, go stale, re-pull or continue flagged.

Each agent publishes its cache as a commit on its own stream, with the commits it
was built from as parents. When an upstream agent publishes a new version, the
store marks every downstream commit stale, with the chain of causes. A
downstream agent then either re-pulls fresh context or continues explicitly
flagged as built on stale context.

A pull fetches only what the receiving agent lacks: the chunks of the tokens it
already holds (its team's shared prefix, at least) come from its own cache, checked
against the commit's signed digests (:mod:`c2c.store.fetch`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from c2c.handoff.cross_engine import enforce
from c2c.handoff.decide import Party, decide
from c2c.handoff.paths import receive
from c2c.handoff.policy import HandoffPolicy
from c2c.store.fetch import FetchReport, fetch
from c2c.store.hops import hop_report
from c2c.team.agent import Agent
from c2c.trust.verify import slice_context


def publish(store, agent: Agent, parents: tuple[str, ...] = ()) -> str:
    """Export ``agent``'s whole cache and commit it on the agent's stream."""
    art = agent.export(parents=parents)
    return store.put(art.encode(), stream=agent.name).id


@dataclass(frozen=True, kw_only=True)
class Pulled:
    """What :func:`pull` attached: whether it was stale, what crossed the wire (bytes fetched
    against bytes referenced), the decision behind it (``Decision.to_dict()``: every check, and for
    a cache of another engine the fidelity it was allowed on) and the K/V check that forced."""

    commit: str
    stale: bool
    fetch: FetchReport
    decision: dict | None = None
    verified: dict | None = None


def pull(store, commit_id: str, agent: Agent, *, allow_stale: bool = False,
         policy: HandoffPolicy | None = None) -> Pulled:
    """Attach commit ``commit_id`` to ``agent``, as every hop goes: the receiving team's trust checks
    (where it has a keyring), then :func:`c2c.handoff.decide` (domain, model, prefix, the chain's hop
    count from the store, staleness). The chunks of tokens ``agent`` already holds are not fetched.

    ``policy``: its ``cross_engine`` opt-in lets a commit another engine made from the same weights
    (vLLM's) attach, after the K/V check the decision forces; its mode is the commit's kind.

    Raises:
        StaleCommitError: the commit is stale and ``allow_stale`` is False.
        TrustError, ArtifactError: it does not verify for the agent's domain.
        DomainMismatchError, FingerprintMismatchError, PrefixMismatchError, HandoffError: a check refused it.
    """
    rec, fetched = fetch(store, commit_id, held=agent.cache, fingerprint=agent.fingerprint, allow_stale=True)
    art, report = receive(agent, rec.data, engine=False)  # the engine is decide()'s to rule on, below
    h = art.header
    signer = (report or {}).get("signer") or {}
    sender = Party(name=h.producer.get("agent", "?"), domain=signer.get("domain", h.producer.get("domain")),
                   fingerprint=h.fingerprint, prefix=h.prefix)
    decision = decide(sender, Party.of(agent), HandoffPolicy.build(policy, mode=h.kind),
                      hops=hop_report(store, commit_id).depth + 1,
                      stale=rec.stale_reason if rec.stale and not allow_stale else None)
    refusal = decision.refusal()
    if refusal is not None:
        raise refusal
    prefix_ids = agent.context.token_ids[:agent.context.prefix_len]
    verified = enforce(decision, art, agent.runtime, trust=report,
                       context=slice_context(h.start, prefix_ids, agent.team.prefix_cache))
    agent.attach(art, engine=decision.verify is None)
    return Pulled(commit=rec.id, stale=rec.stale, fetch=fetched, decision=decision.to_dict(), verified=verified)


@dataclass(frozen=True, kw_only=True)
class ChainStep:
    what: str
    commit: str | None = None
    stale: bool = False
    note: str = ""
    seconds: float = 0.0


@dataclass(frozen=True, kw_only=True)
class ChainReport:
    steps: tuple[ChainStep, ...]
    answers: dict[str, str] = field(default_factory=dict)

    def to_dict(self) -> dict:
        return {"steps": [s.__dict__ for s in self.steps], "answers": self.answers}
