"""The one exception tree of c2c.

Every failure c2c reports on purpose is a subclass of :class:`C2CError`; a caller
who wants "anything c2c refused" catches that one class. Messages name the
problem and say what to do instead.

    C2CError
    ├── ConfigError                 bad argument, flag or environment variable
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
    """Base class of every error c2c raises on purpose."""


class ConfigError(C2CError):
    """A bad argument, flag or environment variable."""


class ModelError(C2CError):
    """A model cannot be found, pulled, converted or loaded."""


class UnknownModelError(ModelError):
    """The name is neither a zoo model nor a local model directory."""


class RuntimeUnsupportedError(C2CError):
    """The runtime cannot do this exactly for this model, so it refuses."""


class IncompatibleCacheError(C2CError):
    """A cache does not fit the model or context that would use it."""


class FingerprintMismatchError(IncompatibleCacheError):
    """The cache was produced by a model whose fingerprint differs."""

    def __init__(self, message: str, differences: dict | None = None):
        super().__init__(message)
        self.differences = differences or {}


class PrefixMismatchError(IncompatibleCacheError):
    """The receiver's shared-prefix hashes differ from the artifact's."""


class MapMismatchError(IncompatibleCacheError):
    """A cross-model map (:mod:`c2c.xmodel`) was fitted for another source or target model."""

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


class VerificationFailedError(TrustError):
    """The KV-cache does not encode the tokens its header claims."""


class UnverifiableError(TrustError):
    """The policy asks for a KV check this artifact cannot get (tokens withheld, slice without context)."""


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


class StaleCommitError(StoreError):
    """A commit is stale and the caller asked for fresh context only."""


class StoreWriteError(StoreError):
    """A write failed (disk full, permission denied, server down); nothing was half-written."""


class QuotaExceededError(StoreError):
    """A put would take its trust domain past the domain's byte quota; nothing was written."""

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
