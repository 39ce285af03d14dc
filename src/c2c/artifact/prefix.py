"""The shared prefix of a team, and chained block hashes over token ids.

A cache is bound to the exact tokens before it. Agents of one team therefore
share one canonical prefix: the system prompt, the tool list and the shared JSON
context, serialized canonically (sorted keys, fixed separators), rendered with
the model's chat template and tokenized the same way by everyone.
:func:`prefix_token_ids` is the one place those tokens are made (BOS, then the
system turn, its text verbatim); the library's teams, the server and
``c2c export`` / ``import-slot`` all call it.

Block hashes are chained like vLLM's: ``h_i = sha256(h_{i-1} || n || tokens_i)``
with tokens as little-endian uint32, so they are identical across processes and
machines (never Python's ``hash()``). Comparing the lists finds the first block
where two prefixes diverge.
"""

from __future__ import annotations

import hashlib
import json
import struct
from dataclasses import dataclass, field
from typing import Any, NewType, Sequence

from c2c.errors import PrefixMismatchError

BlockHash = NewType("BlockHash", str)  # 64 hex chars
BLOCK_SIZE = 16
MAX_BLOCK_SIZE = 4096           # bounds on what a (possibly hostile) header may declare
MAX_PREFIX_TOKENS = 1 << 20
_ROOT = hashlib.sha256(b"c2c-prefix-v1").digest()


def block_hashes(token_ids: Sequence[int], block_size: int = BLOCK_SIZE, *,
                 root: bytes | None = None) -> tuple[BlockHash, ...]:
    """Chained sha256 per block of ``block_size`` tokens; the last block may be partial.

    ``root`` (32 bytes) stands in for the hash before the first block: a chain over tokens that
    follow other context (:mod:`c2c.artifact.chunks` roots its chunk keys in the model and dtype).
    """
    out: list[BlockHash] = []
    parent = _ROOT if root is None else root
    for i in range(0, len(token_ids), block_size):
        block = token_ids[i: i + block_size]
        h = hashlib.sha256(parent + struct.pack("<I", len(block)) + struct.pack(f"<{len(block)}I", *block))
        parent = h.digest()
        out.append(BlockHash(h.hexdigest()))
    return tuple(out)


@dataclass(frozen=True, kw_only=True)
class PrefixRef:
    """What an artifact records about the prefix it was computed after."""

    length: int
    hashes: tuple[BlockHash, ...]
    block_size: int = BLOCK_SIZE

    @classmethod
    def of(cls, token_ids: Sequence[int], block_size: int = BLOCK_SIZE) -> "PrefixRef":
        return cls(length=len(token_ids), hashes=block_hashes(token_ids, block_size), block_size=block_size)

    def to_dict(self) -> dict[str, Any]:
        return {"length": self.length, "hashes": list(self.hashes), "block_size": self.block_size}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "PrefixRef":
        """Validate and build: ``block_size`` in [1, MAX_BLOCK_SIZE], ``length`` bounded, and exactly
        ``ceil(length / block_size)`` sha256 hex hashes. Anything else raises ``ValueError``."""
        if not isinstance(d, dict) or set(d) - {"length", "hashes", "block_size"}:
            raise ValueError("prefix must be an object with length, hashes and block_size")
        length, block_size, hashes = d.get("length"), d.get("block_size", BLOCK_SIZE), d.get("hashes")
        for name, v, hi in (("length", length, MAX_PREFIX_TOKENS), ("block_size", block_size, MAX_BLOCK_SIZE)):
            if not isinstance(v, int) or isinstance(v, bool) or not (name == "length" or v >= 1) or not 0 <= v <= hi:
                raise ValueError(f"prefix {name} must be an integer in [{int(name != 'length')}, {hi}], got {v!r}")
        if not isinstance(hashes, list) or len(hashes) != -(-length // block_size):
            raise ValueError(f"prefix of {length} tokens in blocks of {block_size} needs "
                             f"{-(-length // block_size)} block hashes")
        for h in hashes:
            if not isinstance(h, str) or len(h) != 64 or any(c not in "0123456789abcdef" for c in h):
                raise ValueError("prefix hashes must be sha256 hex digests")
        return cls(length=length, hashes=tuple(BlockHash(h) for h in hashes), block_size=block_size)

    def require_match(self, token_ids: Sequence[int]) -> None:
        """Raise :class:`PrefixMismatchError` unless ``token_ids`` is exactly this prefix."""
        PrefixRef.of(token_ids, self.block_size).require_same(self, here="here", there="in the artifact")

    def require_same(self, other: "PrefixRef", *, here: str = "here", there: str = "there") -> None:
        """Raise :class:`PrefixMismatchError` naming the first differing block unless ``other`` equals this."""
        if other == self:
            return
        first = next((i for i, (a, b) in enumerate(zip(self.hashes, other.hashes)) if a != b),
                     min(len(self.hashes), len(other.hashes)))
        if self.block_size != other.block_size:
            first = 0
        raise PrefixMismatchError(
            f"shared prefix differs: {self.length} tokens {here} vs {other.length} {there}, first differing "
            f"block {first} (tokens {first * self.block_size}..); make every agent of the team use the same "
            "SharedPrefix (system prompt, tools, context) and model"
        )


@dataclass(frozen=True, kw_only=True)
class SharedPrefix:
    """What every agent of a team puts first: system prompt, tools, shared context.

    ``context`` is any JSON-able mapping; it is serialized canonically so that two
    agents holding equal dicts produce equal tokens.
    """

    system: str
    tools: tuple[str, ...] = ()
    context: str = field(default="{}")  # canonical JSON text

    @classmethod
    def build(cls, system: str, tools: Sequence[str] = (), context: dict | None = None) -> "SharedPrefix":
        return cls(system=system, tools=tuple(tools), context=canonical_context(context or {}))

    def text(self) -> str:
        """The system turn's text: the system prompt as given, then the tools and the context, if any."""
        parts = [self.system]
        if self.tools:
            parts.append("Tools:\n" + "\n".join(f"- {t}" for t in self.tools))
        if self.context != "{}":
            parts.append("Shared context (JSON):\n" + self.context)
        return "\n\n".join(parts)

    def token_ids(self, runtime) -> tuple[int, ...]:
        """Tokens of the prefix for ``runtime``'s model: BOS (if any) + the system turn."""
        return prefix_token_ids(runtime, self.text())


def prefix_token_ids(runtime, system: str | None) -> tuple[int, ...]:
    """The shared prefix for ``runtime``'s model: BOS (if the model has one), then the system turn of
    ``system`` exactly as given (no system turn when ``None``; an empty one for ``""``).

    NOTE: the text is not stripped or otherwise normalized: what a client sends is what the model
    reads, and a llama-server slot holds the system text as it was sent, so ``"X\n"`` and ``"X"``
    are two prefixes everywhere.
    """
    turn = runtime.encode(runtime.render_turn("system", system)) if system is not None else ()
    return tuple(runtime.bos_ids) + tuple(turn)


_PROBE = "\ue000"   # a private-use character: no system text a template writes on its own


def declared_prefix_len(runtime, token_ids: Sequence[int], *, tries: int = 8) -> int:
    """How many of ``token_ids`` (a whole prompt, known only as tokens) are its shared prefix as
    :func:`prefix_token_ids` makes one: BOS, and the system turn the tokens open on, if any.

    The system turn's end is found where the template's end-of-turn tokens occur (at most ``tries``
    candidates), and a candidate counts only where ``prefix_token_ids`` of the text between gives exactly
    those tokens again: never wrong tokens, at worst BOS alone (0 where the tokens do not begin with it).
    """
    ids, bos = tuple(token_ids), tuple(runtime.bos_ids)
    if ids[:len(bos)] != bos:
        return 0
    head, probe, tail = runtime.render_turn("system", _PROBE).partition(_PROBE)
    if not probe or not tail:
        return len(bos)
    tail_ids, head_text = tuple(runtime.encode(tail)), runtime.decode(runtime.encode(head))
    n = len(tail_ids)
    ends = [k + n for k in range(len(bos), len(ids) - n + 1) if ids[k:k + n] == tail_ids][:tries]
    for end in ends:
        said = runtime.decode(ids[len(bos):end - n])
        if not said.startswith(head_text):
            continue
        if prefix_token_ids(runtime, said[len(head_text):]) == ids[:end]:
            return end
    return len(bos)


def canonical_context(obj: Any) -> str:
    """Canonical JSON text: sorted keys, fixed separators, no NaN."""
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
