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

from c2c.commit.author import as_message
from c2c.errors import C2CError, ConfigError
from c2c.handoff.cross_engine import enforce
from c2c.handoff.decide import Party
from c2c.handoff.gate import Gate, Receiver
from c2c.handoff.policy import MODES, HandoffPolicy
from c2c.store.fetch import FetchReport
from c2c.team.agent import Agent
from c2c.trust.verify import slice_context


def publish(store, agent: Agent, parents: tuple[str, ...] = (), *, share: tuple[str, ...] = ()) -> str:
    """Commit ``agent``'s whole cache (:meth:`Agent.commit`, the one header author) on the agent's stream, in its
    domain's part of the store, through the one publisher (:meth:`c2c.handoff.gate.Gate.publish`: signed for the domain where the team
    has a keyring, its key created on first use). ``share`` names other trust domains that may attach it
    (a signed share list, and a grant in each).

    Raises:
        ConfigError: a bad domain in ``share``. QuotaExceededError, StoreWriteError: nothing was written.
    """
    gate = Gate(store, agent.team.keyring)
    if agent.team.keyring is not None:
        gate.signing_key(agent.team.domain)  # created on first use, as c2c serve and vLLM do
    art = agent.commit(parents=gate.parents(agent.team.domain, parents), share=tuple(share))
    return gate.publish(agent.team.domain, art, stream=agent.name).commit.id


@dataclass(frozen=True, kw_only=True)
class Pulled:
    """What :func:`pull` attached: whether it was stale, what crossed the wire (bytes fetched
    against bytes referenced), the decision behind it (``Decision.to_dict()``: every check, and for
    a cache of another engine the fidelity it was allowed on), the K/V check that forced, the trust
    checks the domain ran (``trust``), and the gate's record, as ``c2c serve`` and vLLM reply it."""

    commit: str
    stale: bool
    fetch: FetchReport
    decision: dict | None = None
    verified: dict | None = None
    record: dict | None = None
    trust: dict | None = None


def pull(store, commit_id: str, agent: Agent, *, mode: str = "auto", allow_stale: bool = False,
         policy: HandoffPolicy | None = None) -> Pulled:
    """Attach commit ``commit_id`` to ``agent`` through the one gate (:class:`c2c.handoff.gate.Gate`), as
    ``c2c serve`` and vLLM's connector do: the commit must be the agent's domain's own, or one another
    domain shared with it; its signature, domain and share list are read from the signed header (with
    the team's keyring; without one, the domain whose part of the store holds it is its provenance);
    :func:`c2c.handoff.decide` rules (model, prefix, the chain's hop count from the store, staleness);
    then the K/V check the domain's policy asks for runs before the cache is placed. The chunks of
    tokens ``agent`` already holds are not fetched.

    ``mode``, as ``c2c serve`` takes it: ``auto`` attaches the cache where every check passes and otherwise
    has the agent read the commit's text (as a user turn, in the words ``c2c serve`` uses,
    :func:`c2c.commit.author.as_message`), the reason in the record; ``full`` or ``slice`` attach the cache
    as what it is or raise the failed check's error; ``text`` reads the text. ``policy``: its ``cross_engine``
    opt-in lets a commit another engine made from the same weights (vLLM's) attach, after the K/V check the
    decision forces.

    Raises:
        ConfigError: an unknown mode.
        CommitNotVisibleError: not the agent's domain's, nor shared with it (one answer, whether or not it exists).
        TrustError, ArtifactError: it does not verify for the agent's domain (any mode).
        StaleCommitError, DomainMismatchError, FingerprintMismatchError, PrefixMismatchError, HandoffError: a
            check refused it in ``full``/``slice`` (``allow_stale`` lets a stale one attach, flagged).
        HandoffError: in ``auto``/``text``, the commit keeps no text the agent's tokenizer can read.
    """
    if mode not in MODES:
        raise ConfigError(f"unknown pull mode {mode!r}; use one of {', '.join(MODES)}")
    team = agent.team
    gate = Gate(store, team.keyring)  # no floor of its own: the domain's stored policy, else the default check
    receiver = Receiver(party=Party.of(agent), held=agent.cache, allow_stale=allow_stale,
                        policy=lambda h: HandoffPolicy.build(policy, mode=h.kind if mode in ("full", "slice")
                                                             else mode, auto_cache_mode=h.kind))
    adm = gate.admit(commit_id, receiver)
    art = adm.artifact
    report = verified = None
    if adm.path == "cache":
        prefix_ids = agent.context.token_ids[:agent.context.prefix_len]
        context = slice_context(art.header.start, prefix_ids, team.prefix_cache)
        try:
            report = gate.check_kv(adm, runtime=agent.runtime, prefix_ids=prefix_ids, context=context, engine=False)
            verified = enforce(adm.decision, art, agent.runtime, trust=report.to_dict() if report else None,
                               context=context)
            agent.attach(art, engine=adm.decision.verify is None)
        except C2CError as e:
            adm, report, verified = adm.fall_back(e), None, None  # raises in full / slice
    if adm.path == "text":
        sender = str(art.header.producer.get("agent", "?"))
        agent.read(as_message(sender, adm.commit, adm.text(agent.runtime)), label=f"from:{sender}", private=False)
    trust = report.to_dict() if report else None
    return Pulled(commit=adm.commit, stale=adm.stored.stale, fetch=adm.fetched, decision=adm.decision.to_dict(),
                  verified=verified, trust=trust,
                  record={**adm.record(), "used": "text" if adm.path == "text" else art.header.kind, "trust": trust})


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
