"""`Runtime`: what every engine must do. One model loaded in one engine, speaking token ids and KVCaches.

Two engines implement it, each in the one module or package of c2c that imports its engine
(an import-linter contract in ``pyproject.toml`` keeps it so):

- :class:`c2c.runtime.transformers.TransformersRuntime`: transformers (any dtype, LoRA adapters, the fuser);
- :class:`c2c.runtime.llama_cpp.LlamaCppRuntime`: llama.cpp on a GGUF file as shipped.

Everything outside those modules is typed against :class:`Runtime` and uses nothing else of
an engine. ``tests/runtime/test_engine_conformance.py`` runs every engine through the same
suite; a new engine (vLLM) passes it and is done.

What the protocol covers:

- **identity** (the fingerprint's inputs): :attr:`~Runtime.facts` (a :class:`ModelFacts`),
  :attr:`~Runtime.engine_id` (an :class:`EngineId`: engine, build, cache format, numerics),
  ``tokenizer_digest``, ``weights_digest``, ``adapters``, ``name``;
- **chat**: encode, decode, the model's chat template, one turn's text;
- **compute**: ``prefill`` and ``generate`` return the grown cache (a cache *exported* from the
  engine as per-layer K/V), and take ``past=`` (a cache *attached* to the engine, checked by
  :meth:`~Runtime.check_cache` first); ``reposition`` moves a slice; ``logits`` score every position;
- **probes** for verification and repair: K/V recomputed at chosen positions under a mask, of
  the first layers only, or of layer 0;
- **adapters and gradients** (LoRA roles, the cache fuser).

An engine that cannot do one of these raises :class:`~c2c.errors.RuntimeUnsupportedError`
whose message names the way out (another mode, or another engine); it never fails with an
``AttributeError``. Every tensor crossing the protocol is ``[1, kv_heads, seq, head_dim]``
per layer (a :class:`KVCache`) or logits ``(vocab,)`` / ``(T, vocab)``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Protocol, Sequence, runtime_checkable

import torch

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

    def encode_with_offsets(self, text: str) -> tuple[list[int], list[tuple[int, int]]]:
        """Token ids of ``text`` and each token's character span ``[a, b)`` (the fuser aligns by them)."""

    def render_chat(self, messages: list[dict], add_generation_prompt: bool = False) -> str | None:
        """``messages`` rendered with the model's own chat template; ``None`` without one."""

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

    def generate(self, ids: Sequence[int], past: KVCache | None = None, *, max_new_tokens: int = 32,
                 min_new_tokens: int = 0, temperature: float = 0.0, top_p: float = 1.0,
                 generator: torch.Generator | None = None) -> Generation:
        """Feed ``ids`` after ``past``, then decode (greedy unless ``temperature > 0``)."""

    def reposition(self, cache: KVCache, new_start: int) -> KVCache:
        """``cache`` moved to positions ``new_start...``."""

    def logits(self, ids: Sequence[int], past: KVCache | None = None) -> torch.Tensor:
        """Next-token logits ``(T, vocab)`` at every position of ``ids`` (for scoring)."""

    def logits_batch(self, seqs: Sequence[Sequence[int]], past: KVCache | None = None) -> list[torch.Tensor]:
        """:meth:`logits` of several continuations of one ``past``."""

    # -------------------------------------------------------------- probes
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

    # ------------------------------------------------ adapters and gradients
    def attach_adapter(self, path: Path, name: str) -> None:
        """Load (once) and activate the LoRA adapter at ``path`` under ``name``."""

    def detach_adapter(self) -> None:
        """Run the plain base model again."""

    def train_adapter(self, texts: Sequence[str], out_dir: Path, *, steps: int, rank: int, lr: float,
                      max_tokens: int, seed: int, progress: bool, eval_texts: Sequence[str]) -> dict:
        """Train a LoRA adapter on ``texts`` and save it to ``out_dir``; the loss curve."""

    def logits_with_grad(self, ids: Sequence[int], past: KVCache | None = None) -> torch.Tensor:
        """:meth:`logits`, differentiable with respect to ``past``'s tensors (the weights stay frozen)."""

    def close(self) -> None:
        """Free what the engine holds outside Python's memory (a no-op where it holds nothing)."""
