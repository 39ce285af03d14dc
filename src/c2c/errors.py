"""The one exception tree of c2c.

Every failure c2c reports on purpose is a subclass of :class:`C2CError`; a caller
who wants "anything c2c refused" catches that one class. Messages name the
problem and say what to do instead.

    C2CError
    ├── ConfigError                 bad argument, flag or environment variable
    │   ├── ContextEditError          an instruction to drop messages from a session's cache that the
    │   │                             history contradicts, or out of range (400); the session is unchanged
    │   ├── SchemaError               a response_format schema the structured-output engine cannot compile
    │   └── ToolCallError             tools, tool_choice or a tool-call history that cannot be served (400)
    ├── ModelError                  a model cannot be found, pulled or loaded
    │   └── UnknownModelError       name is not in the zoo and not a directory
    ├── RuntimeUnsupportedError     the runtime cannot do this exactly (e.g. a slice
    │                               outside a sliding window), or its engine cannot do it
    │                               at all; it refuses, naming the way out
    ├── IncompatibleCacheError      a cache does not fit the model that would use it
    │   ├── FingerprintMismatchError  the artifact was made by a different model
    │   ├── PrefixMismatchError       the receiver's shared prefix differs
    │   └── MapMismatchError          a cross-model map was fitted for another model pair
    ├── ArtifactError               an exchanged artifact is unusable
    │   ├── TruncatedArtifactError    shorter than its header declares
    │   ├── CorruptArtifactError      malformed header, bad offsets, NaN/Inf, bad digest
    │   ├── ArtifactTooLargeError     declared sizes beyond the configured limit
    │   ├── UnsupportedVersionError   a format version this build does not read
    │   └── ArtifactWriteError        disk full / permission denied; nothing written
    ├── TrustError                  provenance or confidentiality failed
    │   ├── UnsignedArtifactError     a signature was required and is missing
    │   ├── BadSignatureError         signature does not verify (tampered bytes)
    │   ├── UnknownSignerError        key is not in the keyring for that domain
    │   ├── RevokedSignerError        key was revoked
    │   ├── DomainMismatchError       signed for another trust domain
    │   ├── VerificationFailedError   the KV does not encode the claimed tokens
    │   ├── UnverifiableError         the policy asks for a check this artifact cannot get
    │   │                             (tokens withheld, a slice without its context)
    │   ├── KeyringError              keyring or key file missing, malformed or not 0600
    │   └── SealError                 an AEAD envelope failed to open
    ├── StoreError                  the commit store refused or failed
    │   ├── CommitNotFoundError
    │   │   └── CommitNotVisibleError  none the caller's domain may see: absent, or never shared
    │   │                              with it (one answer for both, so no id is confirmed)
    │   ├── StaleCommitError          a consumer asked for fresh context and got stale
    │   ├── StoreWriteError           disk full, permission denied, server down;
    │   │                             nothing was half-written
    │   ├── QuotaExceededError        the put would take the domain past its byte quota;
    │   │                             nothing was written
    │   └── StoreCorruptError         stored bytes no longer hash to their digest
    │       ├── ChunkMissingError       a chunk a commit lists is not in the store
    │       └── ChunkCorruptError       a chunk (or the list of them) does not match its digest:
    │                                   tampered, or swapped for another
    ├── HandoffError                a handoff could not be done in the mode asked
    │   ├── EditedCacheError          an edited cache (messages dropped) asked for as an exact one (409)
    │   └── ChannelError              the shared-memory channel's peer is another user, gone,
    │                                 silent, or sent a malformed message
    ├── ServeError                  the HTTP server (`c2c serve`) refused a request, or is draining
    │   ├── AuthError                 no bearer token, or one the server does not know (401)
    │   ├── HostNotAllowedError       open access (no tokens) called with a non-loopback Host (400)
    │   ├── ContextLengthError        the prompt (+ max_tokens) exceeds the model's context (400)
    │   ├── RequestTooLargeError      the request body is over the server's limit (413)
    │   ├── QueueFullError            the model's queue, or the caller's share of it, is full;
    │   │                             retry after a moment (429)
    │   ├── RequestTimeoutError       the request ran past its deadline (504)
    │   └── ClientTimeoutError        the request body did not arrive in time (408)
    └── FuserError                  fuser config, checkpoint or alignment problem
        ├── AlignmentError            two renderings of a conversation cannot be aligned
        ├── FuserCheckpointError      a fuser checkpoint is missing, corrupt or for other models
        └── FuserDataError            training/eval data is malformed or a reported split
"""

from __future__ import annotations


class C2CError(Exception):
    """Base class of every error c2c raises on purpose.

    ``doc`` names the docs section on a common refusal and its fix (``docs/trust.md#stale``); its
    message then ends with a pointer to it."""

    doc: str | None = None

    def __str__(self) -> str:
        msg = super().__str__()
        if self.doc is None or msg.endswith(f"(see docs/{self.doc})"):
            return msg
        return f"{msg} (see docs/{self.doc})"


class ConfigError(C2CError):
    """A bad argument, flag or environment variable."""


class ContextEditError(ConfigError):
    """An instruction to drop messages from a session's cache that cannot be applied: an index out of range,
    the system message, a drop the history contradicts, or an earlier drop left out. Nothing was changed."""


class SchemaError(ConfigError):
    """A JSON schema the structured-output engine cannot compile (``response_format``'s, or a tool's
    ``parameters``); ``param`` names the field."""

    def __init__(self, message: str, *, param: str = "response_format"):
        super().__init__(message)
        self.param = param


class ToolCallError(ConfigError):
    """``tools``, ``tool_choice`` or a tool-call history that cannot be served (a model whose chat template does
    not render tools, a ``tool_call_id`` that answers no call); ``param`` names the field."""

    def __init__(self, message: str, *, param: str = "tools"):
        super().__init__(message)
        self.param = param


class ModelError(C2CError):
    """A model cannot be found, pulled, converted or loaded."""


class UnknownModelError(ModelError):
    """The name is neither a zoo model nor a local model directory."""


class RuntimeUnsupportedError(C2CError):
    """The runtime cannot do this exactly for this model, so it refuses."""

    doc = "trust.md#engine"


class IncompatibleCacheError(C2CError):
    """A cache does not fit the model or context that would use it."""

    doc = "trust.md#layout"


class FingerprintMismatchError(IncompatibleCacheError):
    """The cache was produced by a model whose fingerprint differs."""

    doc = "trust.md#fingerprint"

    def __init__(self, message: str, differences: dict | None = None):
        super().__init__(message)
        self.differences = differences or {}


class PrefixMismatchError(IncompatibleCacheError):
    """The receiver's shared-prefix hashes differ from the artifact's."""

    doc = "trust.md#prefix"


class MapMismatchError(IncompatibleCacheError):
    """A cross-model map (:mod:`c2c.xmodel`) was fitted for another source or target model."""

    doc = "trust.md#map-not-earned"

    def __init__(self, message: str, differences: dict | None = None):
        super().__init__(message)
        self.differences = differences or {}


class ArtifactError(C2CError):
    """An exchanged artifact cannot be used."""


class TruncatedArtifactError(ArtifactError):
    """The artifact is shorter than its header declares."""


class CorruptArtifactError(ArtifactError):
    """Malformed header, inconsistent offsets, bad digest or non-finite values."""


class ArtifactTooLargeError(ArtifactError):
    """Declared sizes exceed the configured limit."""


class UnsupportedVersionError(ArtifactError):
    """The artifact's format version is not one this build reads."""


class ArtifactWriteError(ArtifactError):
    """Writing an artifact failed (disk full, permission denied); no partial file is left."""


class TrustError(C2CError):
    """Provenance, integrity or confidentiality could not be established."""


class UnsignedArtifactError(TrustError):
    """A signature was required and the artifact has none."""


class BadSignatureError(TrustError):
    """The signature does not verify: header or tensor bytes were changed."""


class UnknownSignerError(TrustError):
    """The signing key is not trusted for the domain."""


class RevokedSignerError(TrustError):
    """The signing key was revoked."""


class DomainMismatchError(TrustError):
    """The artifact belongs to another trust domain."""

    doc = "trust.md#domain"


class VerificationFailedError(TrustError):
    """The KV-cache does not encode the tokens its header claims."""


class UnverifiableError(TrustError):
    """The policy asks for a KV check this artifact cannot get (tokens withheld, slice without context)."""

    doc = "trust.md#unverifiable"


class KeyringError(TrustError):
    """A keyring or key file is missing, malformed, or readable by others than its owner."""


class SealError(TrustError):
    """An AEAD envelope failed to authenticate or is malformed."""


class StoreError(C2CError):
    """The commit store refused or failed an operation."""


class CommitNotFoundError(StoreError):
    """No commit with that id exists in the store."""


class CommitNotVisibleError(CommitNotFoundError):
    """No commit with that id is visible to the caller's trust domain: none exists, or its
    owner did not share it. Both get this one answer, so a caller learns nothing of other domains."""

    doc = "trust.md#not-visible"


class StaleCommitError(StoreError):
    """A commit is stale and the caller asked for fresh context only."""

    doc = "trust.md#stale"


class StoreWriteError(StoreError):
    """A write failed (disk full, permission denied, server down); nothing was half-written."""


class QuotaExceededError(StoreError):
    """A put would take its trust domain past the domain's byte quota; nothing was written."""

    doc = "trust.md#quota"

    def __init__(self, message: str, *, domain: str = "", quota_bytes: int = 0, stored_bytes: int = 0,
                 adding_bytes: int = 0):
        super().__init__(message)
        self.domain, self.quota_bytes, self.stored_bytes, self.adding_bytes = domain, quota_bytes, stored_bytes, adding_bytes


class StoreCorruptError(StoreError):
    """Stored bytes no longer hash to their digest."""


class ChunkMissingError(StoreCorruptError):
    """A chunk that a commit lists is not in the store (deleted behind its back, or evicted)."""


class ChunkCorruptError(StoreCorruptError):
    """A stored chunk does not hash to its digest (tampered, or swapped for another chunk), or a
    commit's list of chunks no longer matches its signed header."""


class HandoffError(C2CError):
    """A handoff could not be carried out in the requested mode."""


class EditedCacheError(HandoffError):
    """A cache edited without a prefill (messages dropped: :mod:`c2c.runtime.edit`) was asked for in an exact mode
    (``full`` or ``slice``); ``auto`` takes it as approximate, or re-prefill from text."""


class ChannelError(HandoffError):
    """The shared-memory channel (:mod:`c2c.handoff.shm`) failed: a peer of another user, a closed or
    silent peer, a malformed control message or arena."""


class ServeError(C2CError):
    """The HTTP server refused a request (see :mod:`c2c.serve.http_errors` for the status of each)."""


class AuthError(ServeError):
    """No bearer token, or a token the server does not know."""


class HostNotAllowedError(ServeError):
    """An open-access server (no tokens) was called with a ``Host`` that is not a loopback name.

    A web page whose domain was rebound to 127.0.0.1 sends its own name; refusing it
    keeps such a page off a server that trusts whoever can reach it.
    """


class ContextLengthError(ServeError):
    """The prompt, plus the tokens asked for, does not fit in the model's context."""


class RequestTooLargeError(ServeError):
    """The request body is larger than the server accepts."""


class QueueFullError(ServeError):
    """The model's request queue is full; the client should retry after a moment."""

    def __init__(self, message: str, retry_after_s: float = 1.0):
        super().__init__(message)
        self.retry_after_s = retry_after_s


class RequestTimeoutError(ServeError):
    """The request ran past its deadline (waiting in the queue included)."""


class ClientTimeoutError(ServeError):
    """The client sent its request body too slowly: it did not arrive within the server's read timeout."""


class FuserError(C2CError):
    """A fuser config, checkpoint or alignment problem."""


class AlignmentError(FuserError):
    """Two models' renderings of the same messages cannot be aligned section by section."""


class FuserCheckpointError(FuserError):
    """A fuser checkpoint is missing, corrupt, or was trained for other models."""


class FuserDataError(FuserError):
    """Training or evaluation data is malformed, or a training source is a reported split."""


# --------------------------------------------------------------------------- the one error table
# Every front-end (c2c serve, vLLM's middleware, c2c.client) renders a refusal from this table, so
# the same error gives the same status, ``type``, ``code`` and ``c2c_error`` from either server.
#
# The first matching row decides:
#
# =======================  ======  =======================  ======================================================
# error                    status  code                     when
# =======================  ======  =======================  ======================================================
# AuthError                401     invalid_api_key          no or unknown bearer token
# HostNotAllowedError      400     host_not_allowed         open access, called with a non-loopback ``Host``
# RequestTooLargeError     413     request_too_large        body over ``--max-body-mb``
# QueueFullError           429     rate_limit_exceeded      the model's queue, or the tenant's share, is full
#                                                           (``Retry-After``)
# RequestTimeoutError      504     timeout                  past the request's deadline
# ClientTimeoutError       408     request_timeout          the body did not arrive within ``--read-timeout``
# ContextLengthError       400     context_length_exceeded  prompt (+ max_tokens) over the model's context
# ServeError               503     unavailable              the server is shutting down
# UnknownModelError        404     model_not_found          a model the server does not serve
# CommitNotVisibleError    403     commit_not_visible       an id the caller's domain may not see (or none: one answer)
# CommitNotFoundError      404     commit_not_found         an unknown commit id
# DomainMismatchError      403     wrong_domain             another domain's cache, asked for explicitly
# StaleCommitError         409     stale_commit             a stale commit, asked for as a cache
# IncompatibleCacheError   409     incompatible_cache       another model, or another shared prefix
# RuntimeUnsupportedError  409     runtime_unsupported      the runtime cannot do this exactly
# EditedCacheError         409     edited_cache             an edited cache (messages dropped), asked for as exact
# HandoffError             409     handoff_refused          the hop limit, or a commit without its tokens / text
# KeyringError             500     keyring_error            the server's own keyring is unusable
# TrustError               422     untrusted_artifact       tampered, unsigned or untrusted artifact
# ArtifactError            422     bad_artifact             an artifact that does not parse
# StoreCorruptError        422     store_corrupt            stored bytes that no longer hash to their id
# QuotaExceededError       429     quota_exceeded           a publish would take the caller's domain past its store quota
# ContextEditError         400     invalid_edit             a drop out of range, of the system message, or that the
#                                                           history contradicts (the session is left as it was)
# SchemaError              400     invalid_schema           a response_format schema that does not compile (param)
# ToolCallError            400     invalid_tools            tools a model cannot call, a tool history that does not
#                                                           add up (param)
# ConfigError              400     invalid_value            a bad value (stream name, label, id, cursor, sampling)
# StoreError               503     store_unavailable        the store failed
# ModelError               503     model_unavailable        a model failed
# C2CError                 500     c2c_error                anything else c2c refused
# =======================  ======  =======================  ======================================================

HTTP_TABLE: tuple[tuple[type[C2CError], int, str], ...] = (
    (AuthError, 401, "invalid_api_key"),
    (HostNotAllowedError, 400, "host_not_allowed"),
    (RequestTooLargeError, 413, "request_too_large"),
    (QueueFullError, 429, "rate_limit_exceeded"),
    (RequestTimeoutError, 504, "timeout"),
    (ClientTimeoutError, 408, "request_timeout"),
    (ContextLengthError, 400, "context_length_exceeded"),
    (ServeError, 503, "unavailable"),
    (UnknownModelError, 404, "model_not_found"),
    (CommitNotVisibleError, 403, "commit_not_visible"),
    (CommitNotFoundError, 404, "commit_not_found"),
    (DomainMismatchError, 403, "wrong_domain"),
    (StaleCommitError, 409, "stale_commit"),
    (IncompatibleCacheError, 409, "incompatible_cache"),
    (RuntimeUnsupportedError, 409, "runtime_unsupported"),
    (EditedCacheError, 409, "edited_cache"),
    (HandoffError, 409, "handoff_refused"),
    (KeyringError, 500, "keyring_error"),
    (TrustError, 422, "untrusted_artifact"),
    (ArtifactError, 422, "bad_artifact"),
    (StoreCorruptError, 422, "store_corrupt"),
    (QuotaExceededError, 429, "quota_exceeded"),
    (ContextEditError, 400, "invalid_edit"),
    (SchemaError, 400, "invalid_schema"),
    (ToolCallError, 400, "invalid_tools"),
    (ConfigError, 400, "invalid_value"),
    (StoreError, 503, "store_unavailable"),
    (ModelError, 503, "model_unavailable"),
    (C2CError, 500, "c2c_error"),
)

# OpenAI's error types, by status; any other 4xx is an invalid request, any 5xx a server error
_TYPES = {401: "authentication_error", 403: "permission_error", 404: "not_found_error", 429: "rate_limit_error"}


def type_of(status: int) -> str:
    """OpenAI's error ``type`` for an HTTP status."""
    return "server_error" if status >= 500 else _TYPES.get(status, "invalid_request_error")


def status_of(e: C2CError) -> tuple[int, str]:
    """(HTTP status, error ``code``) for ``e``: the first row of :data:`HTTP_TABLE` it is an instance of."""
    for cls, status, code in HTTP_TABLE:
        if isinstance(e, cls):
            return status, code
    return 500, "c2c_error"


def error_payload(e: C2CError) -> tuple[int, dict]:
    """(HTTP status, body) for ``e`` in the one error shape, OpenAI's plus ``c2c_error``::

        {"error": {"message", "type", "code", "param": null, "c2c_error": "StaleCommitError"}}
    """
    status, code = status_of(e)
    return status, {"error": {"message": str(e), "type": type_of(status), "code": code,
                              "param": getattr(e, "param", None), "c2c_error": type(e).__name__}}


def error_named(name: str, message: str) -> C2CError:
    """An instance of the :class:`C2CError` subclass called ``name`` (a plain :class:`C2CError` for a name that is
    none), for an error that crossed a process boundary as ``{"type": name, "message": ...}``."""
    cls = globals().get(str(name))
    if not (isinstance(cls, type) and issubclass(cls, C2CError)):
        cls = C2CError
    try:
        return cls(message)
    except TypeError:  # a subclass whose constructor takes more (QueueFullError's retry_after_s)
        err = C2CError.__new__(cls)
        Exception.__init__(err, message)
        return err
