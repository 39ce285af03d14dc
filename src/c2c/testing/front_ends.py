"""The front-ends' conformance cases: one table of what admitting a commit must give, whoever asks.

The library (:func:`c2c.flows.chain.pull`), ``c2c serve`` and ``vllm serve`` with the connector
all admit commits through :class:`c2c.handoff.gate.Gate`. Each has a test file that runs every
case of :data:`CASES` against it (``tests/flows/test_front_end_library.py``,
``tests/serve/test_front_end_serve.py``, ``tests/vllm/test_front_end_vllm.py``) and compares
what it got, as an :class:`Outcome`, with :func:`expected`: the same path, what was used, the reason
code, HTTP status, ``type``, ``code``, ``c2c_error``, and the same redacted record. Every case that
attaches runs in each of :data:`MODES`: in ``full`` a failed check is an error, the same error
everywhere; in ``auto`` it is the commit's text, the failed check named; ``text`` reads the text of
every commit the caller may see. A commit the caller may not see, or whose bytes do not verify, is
the same error in every mode.

One case differs by design, by what a front-end can run: a domain whose stored policy asks for
a sampled K/V check gets it run where the front-end holds the model to re-compute with (the
library, ``c2c serve``), and is refused by name where it does not (vLLM's connector): never
accepted unchecked.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from c2c.errors import C2CError, error_payload

CASES = ("own", "shared", "foreign", "made_up", "stale", "tampered", "wrong_model", "wrong_prefix", "over_quota",
         "kv_policy")
#: the modes every front-end offers an attach in
MODES = ("auto", "full", "text")
#: the cases that attach a commit (the others publish): each runs in every mode
ATTACH_CASES = tuple(c for c in CASES if c != "over_quota")
#: (case, mode) as every front-end's test runs them: each attach case in every mode, a publish case once
CASE_MODES = tuple((c, m) for c in CASES for m in (MODES if c in ATTACH_CASES else ("full",)))
#: the trust domains of the cases: the receiver's, and another
DOMAIN, OTHER = "research", "other"


@dataclass(frozen=True, kw_only=True)
class Outcome:
    """What a front-end answered, in the terms every front-end shares.

    Attributes:
        path: the record's path (``cache`` or ``text``), or None for an error.
        used: what the request used (``full``, ``text``), or None for an error.
        reason: the reason code: ``ok`` (the cache), ``requested`` (text asked for), the first failed check's
            name, or ``error:<class>`` (a check after the decision failed in ``auto``); None for an error.
        status: the HTTP status (a library error: the one table's, :func:`c2c.errors.error_payload`).
        type, code, c2c_error: the error's (None for a success).
        shared, signer, hops_shown: what the attach record shows (None for an error): whether the commit
            was another domain's, the signer's fields, whether the chain depth is shown.
        kv: the K/V check that ran on the cache (``none``, ``sample``, ``strict``), where known.
    """

    path: str | None
    status: int
    used: str | None = None
    reason: str | None = None
    type: str | None = None
    code: str | None = None
    c2c_error: str | None = None
    shared: bool | None = None
    signer: tuple[str, ...] | None = None
    hops_shown: bool | None = None
    kv: str | None = None

    def comparable(self) -> "Outcome":
        """Without ``kv``: every front-end's record shares the rest (the K/V check is one case's business)."""
        return Outcome(path=self.path, status=self.status, used=self.used, reason=self.reason, type=self.type,
                       code=self.code, c2c_error=self.c2c_error, shared=self.shared, signer=self.signer,
                       hops_shown=self.hops_shown)


def _error(status: int, type_: str, code: str, cls: str) -> Outcome:
    return Outcome(path=None, status=status, type=type_, code=code, c2c_error=cls)


NOT_VISIBLE = _error(403, "permission_error", "commit_not_visible", "CommitNotVisibleError")
_OWN = Outcome(path="cache", status=200, used="full", reason="ok", shared=False, signer=("domain", "key_id"),
               hops_shown=True)
_SHARED = Outcome(path="cache", status=200, used="full", reason="ok", shared=True, signer=("domain",),
                  hops_shown=False)
EXPECTED: dict[str, Outcome] = {
    "own": _OWN,
    "shared": _SHARED,
    "foreign": NOT_VISIBLE,
    "made_up": NOT_VISIBLE,
    "stale": _error(409, "invalid_request_error", "stale_commit", "StaleCommitError"),
    "tampered": _error(422, "invalid_request_error", "store_corrupt", "ChunkCorruptError"),
    "wrong_model": _error(409, "invalid_request_error", "incompatible_cache", "FingerprintMismatchError"),
    "wrong_prefix": _error(409, "invalid_request_error", "incompatible_cache", "PrefixMismatchError"),
    "over_quota": _error(429, "rate_limit_error", "quota_exceeded", "QuotaExceededError"),
}
#: the kv_policy case: run by a front-end that holds the model, refused by name by one that does not
KV_CHECKED = replace(_OWN, kv="sample")
KV_REFUSED = _error(422, "invalid_request_error", "untrusted_artifact", "UnverifiableError")


def of_error(e: C2CError) -> Outcome:
    """The outcome of a library call that raised ``e``."""
    status, body = error_payload(e)
    return of_body(status, body)


def of_body(status: int, body: dict[str, Any]) -> Outcome:
    """The outcome of an HTTP error reply in the one error shape."""
    err = body["error"]
    return _error(status, err["type"], err["code"], err["c2c_error"])


def reason_code(record: dict[str, Any]) -> str:
    """The record's reason as a code (see :class:`Outcome`)."""
    if record["path"] != "text":
        return "ok"
    if record.get("requested") == "text":
        return "requested"
    failed = [c["name"] for c in record.get("checks") or () if c.get("ok") is False]
    if failed:
        return failed[0]
    reason = str(record.get("reason", ""))
    return "error:" + reason.split(": ")[1] if reason.startswith("fell back to text: ") else reason


def of_record(record: dict[str, Any], status: int = 200) -> Outcome:
    """The outcome of a successful attach, from its record (every front-end's has these fields)."""
    trust = record.get("trust") or {}
    kv = (trust.get("policy") or {}).get("kv") if trust else None
    return Outcome(path=record["path"], status=status, used=record["used"], reason=reason_code(record),
                   shared=record["shared"], signer=tuple(sorted(record["signer"])), hops_shown="hops" in record,
                   kv=kv)


#: what a failed check gives in ``auto``: the commit's text, the check named
_FAILS = {"stale": "staleness", "wrong_model": "fingerprint", "wrong_prefix": "prefix"}


def expected(case: str, *, checks_kv: bool, mode: str = "full") -> Outcome:
    """What ``case`` must give in ``mode`` on a front-end that can (``checks_kv``) or cannot run a sampled K/V
    check."""
    if case == "kv_policy":
        if mode == "text":
            return replace(_OWN, path="text", used="text", reason="requested")
        if checks_kv:
            return KV_CHECKED
        # refused by name in full; in auto the commit's text, the refusal named
        return KV_REFUSED if mode == "full" else replace(_OWN, path="text", used="text",
                                                           reason="error:UnverifiableError")
    want = EXPECTED[case]
    if mode == "full" or want.path is None and case not in _FAILS:
        return want
    base = _SHARED if case == "shared" else _OWN
    if mode == "text":
        return replace(base, path="text", used="text", reason="requested")
    return replace(base, path="text", used="text", reason=_FAILS[case]) if case in _FAILS else want


def same_answer(a: str, b: str, *ids: str) -> bool:
    """Whether two messages are equal once the commit ids (their first 12 characters) are masked."""
    for cid in ids:
        a, b = a.replace(cid[:12], "<id>"), b.replace(cid[:12], "<id>")
    return a == b
