"""Constrained decoding: a JSON schema as a grammar, and each step's logits masked to what it allows.

``response_format`` ``json_object`` and ``json_schema`` are served by constraining every
decode step to the tokens the schema's grammar allows, so the reply always parses and
validates: guaranteed, not hoped for. The engine is llguidance, one of the two vLLM uses
(``--structured-outputs-config.backend guidance``), so the two servers compile and refuse
schemas alike; c2c writes no grammar engine of its own.

A :class:`Grammar` is compiled once per request, before it is queued (a schema it cannot
compile is a :class:`~c2c.errors.SchemaError`, 400, naming ``response_format``). A
:class:`Constraint` follows one decode: :meth:`Constraint.mask` before each pick,
:meth:`Constraint.accept` after it; the reply ends when the grammar is complete.
"""

from __future__ import annotations

import functools
import json
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import llguidance
import llguidance.torch as llg_torch
import torch

from c2c.errors import SchemaError

MAX_SCHEMA_BYTES = 64 * 1024  # a schema larger than this is refused before it is compiled


@functools.cache
def _masks() -> ThreadPoolExecutor:
    """The one thread that computes next-token masks ahead (made on first use). NOTE: one is enough: a served model
    runs one forward pass at a time (:mod:`c2c.serve.worker`), so at most one mask is worth computing meanwhile."""
    return ThreadPoolExecutor(max_workers=1, thread_name_prefix="c2c-grammar")


@dataclass(frozen=True)
class Grammar:
    """A compiled grammar (llguidance's text form) and what it came from (``json_object`` or ``json_schema``)."""

    text: str
    kind: str

    @classmethod
    def json(cls, schema: dict[str, Any] | None, tokenizer: Any, *, kind: str | None = None,
             field: str = "response_format") -> "Grammar":
        """The grammar of JSON that validates against ``schema`` (None: any JSON object), checked against the
        model's ``tokenizer`` (:meth:`~c2c.runtime.protocol.Grammars.grammar_tokenizer`). ``kind`` names what it
        constrains (default ``json_object`` or ``json_schema``), ``field`` the request field an error names.

        Raises:
            SchemaError: not a JSON schema the engine compiles (a wrong type name, an unsupported keyword,
                too large); the message is the engine's.
        """
        kind = kind or ("json_object" if schema is None else "json_schema")
        text = _compile({"type": "object"} if schema is None else schema, field)
        error = llguidance.LLMatcher.validate_grammar(text, tokenizer)
        if error:
            raise SchemaError(f"{field}'s schema does not compile: {str(error)[:300]}", param=field)
        return cls(text=text, kind=kind)


def _compile(schema: Any, field: str) -> str:
    """``schema`` compiled to the engine's grammar text (what it means is checked once a tokenizer is given:
    :meth:`Grammar.json`).

    Raises:
        SchemaError: not a JSON object, too large, or not a schema the engine compiles; ``param`` is ``field``.
    """
    if not isinstance(schema, dict):
        raise SchemaError(f"{field} must be a JSON object (a JSON Schema)", param=field)
    if len(json.dumps(schema)) > MAX_SCHEMA_BYTES:
        raise SchemaError(f"{field}'s schema is over {MAX_SCHEMA_BYTES // 1024} KiB", param=field)
    try:
        return llguidance.LLMatcher.grammar_from_json_schema(schema, defaults={"whitespace_flexible": False})
    except (ValueError, TypeError) as e:
        raise SchemaError(f"{field}'s schema does not compile: {str(e)[:300]}", param=field) from None


class Constraint:
    """One decode's place in a :class:`Grammar`: which tokens may come next, and whether it is complete.

    The next step's allowed tokens are computed on a thread of their own while the model runs the step's
    forward pass (:meth:`prefetch`, as vLLM overlaps them): the engine's mask work leaves the GIL, so it
    costs the decode loop almost nothing but the masking itself.
    """

    def __init__(self, grammar: Grammar, tokenizer: Any):
        self._matcher = llguidance.LLMatcher(tokenizer, grammar.text)
        self._bitmask = llg_torch.allocate_token_bitmask(1, tokenizer.vocab_size)   # (1, ceil(vocab / 32))
        self._pending: Future | None = None

    def prefetch(self) -> None:
        """Start computing what may come next (call after :meth:`accept`, before the next forward pass)."""
        if self._pending is None and not self.complete:
            self._pending = _masks().submit(llg_torch.fill_next_token_bitmask, self._matcher, self._bitmask, 0)

    def mask(self, logits: torch.Tensor) -> torch.Tensor:
        """``logits`` ``(vocab,)`` with every token the grammar does not allow next at -inf (a new tensor)."""
        if self._pending is None:
            llg_torch.fill_next_token_bitmask(self._matcher, self._bitmask, 0)
        else:
            self._pending.result()
            self._pending = None
        out = logits.float().clone()[None]                                        # (1, vocab)
        n = min(out.shape[-1], self._bitmask.shape[-1] * 32)
        llg_torch.apply_token_bitmask_inplace(out[:, :n], self._bitmask)
        if out.shape[-1] > n:  # ids past the tokenizer's vocabulary (padding rows of the embedding)
            out[:, n:] = float("-inf")
        return out[0]

    def accept(self, token: int) -> None:
        """Advance past ``token`` (one :meth:`mask` allowed; never while a :meth:`prefetch` runs)."""
        if not self._matcher.consume_token(token):
            raise SchemaError(f"internal: the grammar refused a token it allowed ({self._matcher.get_error()})")

    @property
    def complete(self) -> bool:
        """The grammar is done: nothing more may follow."""
        return self._matcher.is_stopped()
