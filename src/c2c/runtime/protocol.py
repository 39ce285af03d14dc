"""`Runtime`: what every engine must do. One model loaded in one engine, speaking token ids and KVCaches.

Two engines implement it, each in the one module or package of c2c that imports its engine
(an import-linter contract in ``pyproject.toml`` keeps it so):

- :class:`c2c.runtime.transformers.TransformersRuntime`: transformers (any dtype, LoRA adapters, the fuser);
- :class:`c2c.runtime.llama_cpp.LlamaCppRuntime`: llama.cpp on a GGUF file as shipped.

Everything outside those modules is typed against :class:`Runtime` and uses nothing else of
an engine. ``tests/runtime/test_engine_conformance.py`` runs every engine through the same
suite; a new engine (vLLM) passes it and is done.

What the core protocol, :class:`Runtime`, covers (every engine has all of it):

- **identity** (the fingerprint's inputs): :attr:`~Runtime.facts` (a :class:`ModelFacts`),
  :attr:`~Runtime.engine_id` (an :class:`EngineId`: engine, build, cache format, numerics),
  ``tokenizer_digest``, ``weights_digest``, ``adapters``, ``name``;
- **chat**: encode, decode, the model's chat template, one turn's text;
- **compute**: ``prefill`` and ``generate`` return the grown cache (a cache *exported* from the
  engine as per-layer K/V), and take ``past=`` (a cache *attached* to the engine, checked by
  :meth:`~Runtime.check_cache` first); ``stepper`` grows one sequence pass by pass and exports
  it once, when asked; ``reposition`` moves a slice (or is refused, naming the way out, where the
  engine cannot do it exactly).

What only some engines do is a small capability protocol of its own, checked with
``isinstance`` (each is ``runtime_checkable``) through :func:`require`, which raises
:class:`~c2c.errors.RuntimeUnsupportedError` naming the way out (another mode, or another
engine), never an ``AttributeError``:

===================  =====================================================  ==============================
capability           members                                                used by
===================  =====================================================  ==============================
:class:`Scoring`     ``logits``, ``logits_batch``                           ``c2c.mc`` (multiple choice)
:class:`Probes`      ``probe_kv``, ``probe_first_layers``, ``probe_layer0``  sampled K/V checks, slice repair
:class:`Offsets`     ``encode_with_offsets``                                the fuser's token alignment
:class:`Gradients`   ``logits_with_grad``                                   training the fuser
:class:`Adapters`    ``attach_adapter``, ``detach_adapter``, ``train_adapter``  LoRA roles
:class:`RopeCodec`   ``rope_remove``, ``rope_apply``, ``vocab_digest``      cross-model maps (``c2c.xmodel``)
:class:`Grammars`    ``grammar_tokenizer``                                  structured output (``response_format``)
:class:`Batching`    ``feed_together``                                      ``c2c serve``'s batched passes
===================  =====================================================  ==============================

The transformers engine has every capability; llama.cpp has none of them.

Every engine grows a sequence pass by pass (``Runtime.stepper``), holding it between passes
(llama.cpp in its context, transformers in its own cache object) and exporting it once, when
asked. Every tensor
crossing a protocol is ``[1, kv_heads, seq, head_dim]`` per layer (a :class:`KVCache`) or
logits ``(vocab,)`` / ``(T, vocab)``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, Sequence, TypeVar, runtime_checkable

import torch

from c2c.errors import RuntimeUnsupportedError
from c2c.runtime.facts import EngineId, ModelFacts
from c2c.runtime.kvcache import KVCache


@dataclass(frozen=True, kw_only=True)
class Generation:
    """Result of a generation.

    ``cache`` covers every token fed plus every generated token but the last
    (whose K/V is computed only when something is fed after it).
    """

    token_ids: tuple[int, ...]
    cache: KVCache
    prefill_s: float
    decode_s: float
    text: str


@runtime_checkable
class Runtime(Protocol):
    """What every engine must do (see the module docstring). ``c2c.Runtime`` is this protocol."""

    name: str
    adapters: tuple[str, ...]           # active LoRA adapters as "name@digest16" (empty: the base model)
    eos_ids: frozenset[int]

    # ------------------------------------------------------------ identity
    @property
    def facts(self) -> ModelFacts: ...

    @property
    def engine_id(self) -> EngineId:
        """Engine, build, cache format and numerics (changes when the numerics do, e.g. weights unpacked)."""

    @property
    def device(self) -> torch.device: ...

    @property
    def dtype(self) -> torch.dtype: ...

    @property
    def tokenizer_digest(self) -> str: ...

    @property
    def weights_digest(self) -> str: ...

    @property
    def context_tokens(self) -> int:
        """The most tokens one sequence may hold (the serving context length)."""

    @property
    def chars_per_token(self) -> float | None:
        """The most characters of text one token stands for (``None``: no bound known): a text of ``n``
        characters is at least ``n / chars_per_token`` tokens, so a server can refuse an oversized prompt
        before tokenizing it."""

    @property
    def bos_ids(self) -> tuple[int, ...]:
        """The ids a sequence must start with (e.g. Gemma's ``<bos>``); empty for ChatML models."""

    # ---------------------------------------------------------------- chat
    def encode(self, text: str) -> list[int]: ...

    def decode(self, ids: Sequence[int]) -> str: ...

    def render_chat(self, messages: list[dict], add_generation_prompt: bool = False, *,
                    tools: list[dict] | None = None) -> str | None:
        """``messages`` rendered with the model's own chat template, given ``tools`` (OpenAI's ``tools`` entries)
        as the template places them; ``None`` without a template."""

    def render_turn(self, role: str, content: str) -> str: ...

    def generation_prompt(self) -> str: ...

    # ------------------------------------------------------------- compute
    def check_cache(self, cache: KVCache | None) -> None:
        """Raise :class:`~c2c.errors.IncompatibleCacheError` unless ``cache`` fits this model."""

    def prefill(self, ids: Sequence[int], past: KVCache | None = None, *,
                start: int = 0) -> tuple[torch.Tensor, KVCache]:
        """Run ``ids`` after ``past``: (next-token logits ``(vocab,)``, the grown cache).

        ``start`` places a fresh sequence (no ``past``) at positions ``start...``.
        """

    def stepper(self, past: KVCache | None) -> Stepper:
        """One sequence grown from ``past`` (checked by ``check_cache`` first) pass by pass: a served turn's prompt
        chunks, then its decode steps. Every pass gives the logits :meth:`prefill` would, bit for bit; the engine
        holds the sequence between passes and exports it once, when asked, not after every pass."""

    def generate(self, ids: Sequence[int], past: KVCache | None = None, *, max_new_tokens: int = 32,
                 min_new_tokens: int = 0, temperature: float = 0.0, top_p: float = 1.0,
                 generator: torch.Generator | None = None) -> Generation:
        """Feed ``ids`` after ``past``, then decode (greedy unless ``temperature > 0``)."""

    def reposition(self, cache: KVCache, new_start: int) -> KVCache:
        """``cache`` moved to positions ``new_start...``."""

    def close(self) -> None:
        """Free what the engine holds outside Python's memory (a no-op where it holds nothing)."""


# ------------------------------------------------------------------ capabilities
@runtime_checkable
class Scoring(Protocol):
    """Logits at every position, for scoring options (:mod:`c2c.mc`)."""

    def logits(self, ids: Sequence[int], past: KVCache | None = None) -> torch.Tensor:
        """Next-token logits ``(T, vocab)`` at every position of ``ids`` (for scoring)."""

    def logits_batch(self, seqs: Sequence[Sequence[int]], past: KVCache | None = None) -> list[torch.Tensor]:
        """:meth:`logits` of several continuations of one ``past``."""


@runtime_checkable
class Probes(Protocol):
    """K/V re-computed at chosen positions: sampled K/V checks (:mod:`c2c.trust.probe`) and slice repair."""

    def probe_kv(self, ids: Sequence[int], positions: Sequence[int], past: KVCache,
                 allowed: torch.Tensor) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Every layer's K/V of ``ids`` at explicit ``positions`` after ``past``, under a custom mask.

        ``allowed``: bool ``(len(ids), past.seq_len + len(ids))``, which cache entries (then which
        new tokens) each new token attends to. Returns per layer ``(1, kv_heads, len(ids), head_dim)``
        keys and values.
        """

    def probe_first_layers(self, ids: Sequence[int], past: KVCache,
                           n_layers: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """K/V of ``ids`` after ``past`` for the first ``n_layers`` layers only."""

    def probe_layer0(self, ids: Sequence[int], start: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Layer-0 K/V of ``ids`` at positions ``start...``: ``(1, kv_heads, T_0, head_dim)`` each."""


@runtime_checkable
class Offsets(Protocol):
    """Token ids with their character spans (the fuser aligns two tokenizers by them)."""

    def encode_with_offsets(self, text: str) -> tuple[list[int], list[tuple[int, int]]]:
        """Token ids of ``text`` and each token's character span ``[a, b)``."""


@runtime_checkable
class Gradients(Protocol):
    """Logits differentiable with respect to a cache (training the fuser)."""

    def logits_with_grad(self, ids: Sequence[int], past: KVCache | None = None) -> torch.Tensor:
        """``(T, vocab)`` logits, differentiable with respect to ``past``'s tensors (the weights stay frozen)."""


@runtime_checkable
class Adapters(Protocol):
    """LoRA role adapters (:mod:`c2c.runtime.adapters`)."""

    def attach_adapter(self, path: Path, name: str) -> None:
        """Load (once) and activate the LoRA adapter at ``path`` under ``name``."""

    def detach_adapter(self) -> None:
        """Run the plain base model again."""

    def train_adapter(self, texts: Sequence[str], out_dir: Path, *, steps: int, rank: int, lr: float,
                      max_tokens: int, seed: int, progress: bool, eval_texts: Sequence[str]) -> dict:
        """Train a LoRA adapter on ``texts`` and save it to ``out_dir``; the loss curve."""


@runtime_checkable
class RopeCodec(Protocol):
    """Keys with their rotary embedding taken out and put back, per layer (cross-model maps, :mod:`c2c.xmodel`)."""

    @property
    def vocab_digest(self) -> str:
        """sha256 of what token ids mean (vocabulary, specials), without the chat template."""

    def rope_remove(self, layer: int, keys: torch.Tensor, start: int) -> torch.Tensor:
        """``keys`` ``(1, H, T, D)`` of ``layer`` at positions ``start...`` with RoPE taken out (fp32)."""

    def rope_apply(self, layer: int, plain: torch.Tensor, start: int) -> torch.Tensor:
        """Un-rotated keys ``(1, H, T, D)`` rotated for ``layer`` at positions ``start...`` (fp32)."""


@runtime_checkable
class Grammars(Protocol):
    """Constrained decoding (:mod:`c2c.runtime.grammar`): the model's vocabulary as the structured-output engine
    (llguidance) reads it."""

    def grammar_tokenizer(self) -> Any:
        """The vocabulary as an ``llguidance.LLTokenizer`` (built once)."""


@runtime_checkable
class Batching(Protocol):
    """Several sequences in one forward pass (``c2c serve``'s batched decode): the weights are read once per pass
    for all of them, so decode steps ride along with one another and with a prefill chunk."""

    def feed_together(self, seqs: Sequence["Stepper"], ids: Sequence[Sequence[int]]) -> list[torch.Tensor]:
        """Feed ``ids[b]`` after what ``seqs[b]`` (this runtime's steppers) holds, all in one pass; each
        sequence's last logits ``(vocab,)``. Each sequence is left as its own feed of its tokens leaves it."""


@runtime_checkable
class Stepper(Protocol):
    """One sequence grown pass by pass (a served turn: its prompt's chunks, then one token per step)."""

    def feed(self, ids: Sequence[int]) -> torch.Tensor:
        """Run ``ids`` after what the sequence holds; the last position's logits ``(vocab,)``."""

    def cache(self) -> KVCache:
        """What the sequence holds, as a cache (exported here, once until the next pass)."""


#: every capability, with the way out an engine without it is told
CAPABILITIES: dict[type, str] = {
    Scoring: "it keeps only the last position's logits; score options (c2c.mc) with the transformers backend "
             "(--backend transformers)",
    Probes: "it cannot recompute K/V under a custom attention mask or stop a forward after the first layers "
            "(the probes of `c2c verify --mode sample`, and slice repair); verify with --mode strict (it "
            "re-prefills with the engine itself), or load the model with --backend transformers",
    Offsets: "the cache fuser aligns tokenizers by character offsets on the transformers backend; load the model "
             "with --backend transformers",
    Gradients: "the cache fuser trains and runs on the transformers backend (it needs gradients through the "
               "model); load the Receiver with --backend transformers",
    Adapters: "LoRA role adapters run on the transformers backend (PEFT wraps its linear layers); load the model "
              "with --backend transformers",
    RopeCodec: "cross-model maps need the transformers backend (it re-applies RoPE with the model's own rotary "
               "embedding); load the model with --backend transformers",
    Batching: "its sequences run one per forward pass (the server takes turns between them); serve the model "
              "with --backend transformers for batched decode",
    Grammars: "structured output (response_format json_object or json_schema) constrains each step to the tokens "
              "a grammar allows, over the transformers backend's tokenizer; serve the model with --backend "
              "transformers, or leave response_format out",
}
C = TypeVar("C")


def require(runtime: object, capability: type[C]) -> C:
    """``runtime`` as a ``capability`` (one of :data:`CAPABILITIES`), checked with ``isinstance``.

    Raises:
        RuntimeUnsupportedError: its engine lacks the capability; the message names the way out.
    """
    if isinstance(runtime, capability):
        return runtime
    kind = getattr(getattr(runtime, "engine_id", None), "kind", None) or type(runtime).__name__
    raise RuntimeUnsupportedError(f"the {kind} backend has no {capability.__name__.lower()} capability: "
                                  f"{CAPABILITIES[capability]}")
