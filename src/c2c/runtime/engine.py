"""`Runtime`: prefill, continue, generate and re-position KV-caches for one model.

The runtime owns a loaded model and its tokenizer and speaks only in token ids
and :class:`~c2c.runtime.kvcache.KVCache` values. All transformers calls go
through :mod:`c2c.runtime.hf`.
"""

from __future__ import annotations

import hashlib
import time
from dataclasses import replace
from functools import cached_property
from pathlib import Path
from typing import Sequence

import torch

from c2c.canon import weights_digest
from c2c.errors import ConfigError
from c2c.runtime import hf
from c2c.runtime.base import Generation, RuntimeBase, check_sampling, sample_next  # noqa: F401 (re-exported)
from c2c.runtime.dtype import resolve as resolve_dtype
from c2c.runtime.kvcache import KVCache


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


class Runtime(RuntimeBase):
    """One model loaded in transformers. Build with :meth:`load` (a directory) or :func:`c2c.runtime.zoo.load`."""

    backend = "transformers"

    def __init__(self, model, tokenizer, *, name: str, path: Path | None = None):
        # NOTE: no process-wide side effect here (allocator, environment): the CLI tunes
        # malloc at its entry point (c2c.runtime.alloc); a library user opts in the same way.
        self.model = model
        self.tokenizer = tokenizer
        self.name = name
        self.path = Path(path) if path is not None else None
        self.facts = hf.model_facts(model)
        self.windows: tuple[int | None, ...] = tuple(self.facts["windows"])
        self.eos_ids = frozenset(self.facts["eos_token_ids"])
        self.adapters: tuple[str, ...] = ()
        self.packed = 0  # linear layers held packed (see load)

    @classmethod
    def load(cls, path: str | Path, *, name: str | None = None, dtype: str | None = None,
             device: str = "cpu") -> "Runtime":
        """Load a model directory; ``dtype`` as :func:`c2c.runtime.dtype.resolve` (default ``C2C_DTYPE``, auto).

        In bf16 on a CPU the linear layers are packed for oneDNN (bit-identical products, faster
        reads; :class:`~c2c.runtime.hf.PackedLinear`).
        """
        model, tok = hf.load(path, dtype=getattr(torch, resolve_dtype(dtype, device)), device=device)
        runtime = cls(model, tok, name=name or Path(path).name, path=Path(path))
        _ = runtime.weights_digest  # computed (or read from its memo) at load, never inside a first export
        runtime.packed = hf.pack_linears(model)
        return runtime

    def ensure_dense(self) -> None:
        """Dense ``nn.Linear`` weights again, for LoRA adapters and gradients (a no-op unless packed)."""
        if self.packed:
            hf.unpack_linears(self.model)
            self.packed = 0

    # ------------------------------------------------------------ identity
    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    @property
    def dtype(self) -> torch.dtype:
        return next(self.model.parameters()).dtype

    @cached_property
    def tokenizer_digest(self) -> str:
        return hashlib.sha256(hf.tokenizer_material(self.tokenizer)).hexdigest()

    @cached_property
    def weights_digest(self) -> str:
        """sha256 over the weight files, computed once per model and cached beside them."""

        return weights_digest(self.path, self.model)

    # ---------------------------------------------------------- tokenizer
    def encode(self, text: str) -> list[int]:
        return hf.encode(self.tokenizer, text)

    def decode(self, ids: Sequence[int]) -> str:
        return hf.decode(self.tokenizer, ids)

    def encode_with_offsets(self, text: str) -> tuple[list[int], list[tuple[int, int]]]:
        """Token ids of ``text`` and each token's character span ``[a, b)`` (for the fuser)."""
        return hf.encode_with_offsets(self.tokenizer, text)

    def render_chat(self, messages: list[dict], add_generation_prompt: bool = False) -> str | None:
        """``messages`` rendered with the model's own chat template; ``None`` without one."""
        return hf.render_chat(self.tokenizer, messages, add_generation_prompt)

    @cached_property
    def bos_ids(self) -> tuple[int, ...]:
        return tuple(hf.bos_ids(self.tokenizer, self.model))

    @cached_property
    def chars_per_token(self) -> float | None:
        """The most characters one token stands for (``None``: unbounded); see :func:`hf.chars_per_token`."""
        return hf.chars_per_token(self.tokenizer)

    # ------------------------------------------------------------- compute
    def prefill(self, ids: Sequence[int], past: KVCache | None = None, *,
                start: int = 0) -> tuple[torch.Tensor, KVCache]:
        """Run ``ids`` after ``past``. Returns (next-token logits ``(vocab,)``, the grown cache).

        Without ``past``, ``start`` places the tokens at positions ``start...``
        (attention only sees relative positions, so the K/V equal a re-positioned
        cache; used to check re-positioning on every layer).
        """
        if not ids:
            raise ConfigError("prefill needs at least one token")
        if start and past is not None:
            raise ConfigError("start= only places a fresh sequence; a continuation starts where past ends")
        self._check_cache(past)
        return hf.forward(self.model, ids, past, self.windows, start)

    def logits(self, ids: Sequence[int], past: KVCache | None = None) -> torch.Tensor:
        """Next-token logits ``(T, vocab)`` at every position of ``ids`` (for scoring)."""
        self._check_cache(past)
        return hf.forward_all_logits(self.model, ids, past)

    def logits_batch(self, seqs: Sequence[Sequence[int]], past: KVCache | None = None) -> list[torch.Tensor]:
        """:meth:`logits` of several continuations of the same ``past``, in one batched forward."""
        if not seqs or any(len(s) == 0 for s in seqs):
            raise ConfigError("logits_batch needs at least one non-empty sequence")
        self._check_cache(past)
        return hf.forward_batch_logits(self.model, seqs, past)

    def logits_with_grad(self, ids: Sequence[int], past: KVCache | None = None) -> torch.Tensor:
        """Like :meth:`logits` but differentiable w.r.t. ``past``'s tensors (fuser training)."""
        self._check_cache(past)
        self.ensure_dense()
        return hf.forward_logits_grad(self.model, ids, past)

    def generate(self, ids: Sequence[int], past: KVCache | None = None, *, max_new_tokens: int = 32,
                 min_new_tokens: int = 0, temperature: float = 0.0, top_p: float = 1.0,
                 generator: torch.Generator | None = None) -> Generation:
        """Decoding after feeding ``ids``; stops at EOS once ``min_new_tokens`` are out.

        Greedy by default (``temperature=0``); otherwise each token is drawn by
        :func:`sample_next` with ``temperature``, ``top_p`` and ``generator`` (seed it for
        a reproducible draw).
        """
        check_sampling(temperature, top_p)
        t0 = time.perf_counter()
        logits, cache = self.prefill(ids, past)
        t1 = time.perf_counter()
        out: list[int] = []
        for step in range(max_new_tokens):
            if step < min_new_tokens and self.eos_ids:
                logits = logits.clone()
                logits[list(self.eos_ids)] = float("-inf")
            tok = sample_next(logits, temperature=temperature, top_p=top_p, generator=generator)
            out.append(tok)
            if tok in self.eos_ids or step == max_new_tokens - 1:
                break
            logits, cache = hf.forward(self.model, [tok], cache, self.windows)
        t2 = time.perf_counter()
        return Generation(token_ids=tuple(out), cache=cache, prefill_s=t1 - t0, decode_s=t2 - t1,
                          text=self.decode(out))

    def reposition(self, cache: KVCache, new_start: int) -> KVCache:
        """Move ``cache`` to positions ``new_start...`` by re-rotating its keys.

        Keys are stored after RoPE: ``k_p = k·cos(p) + rot(k)·sin(p)``. We undo the
        rotation at the old positions and apply it at the new ones, both with the
        model's own rotary embedding, so the result matches keys computed at the new
        positions up to float rounding. Values carry no position and are unchanged.
        """
        if new_start == cache.start:
            return cache
        self._check_cache(cache)
        keys = []
        for layer, k in enumerate(cache.keys):
            T_l = k.shape[2]
            old = torch.arange(cache.layer_start(layer), cache.end, dtype=torch.long)  # (T_l,)
            new = old - cache.start + new_start
            c0, s0 = hf.rotary_cos_sin(self.model, layer, old, torch.float32)  # (T_l, D)
            c1, s1 = hf.rotary_cos_sin(self.model, layer, new, torch.float32)
            kf = k.float()  # (1, H, T_l, D)
            plain = kf * c0 - _rotate_half(kf) * s0  # inverse rotation, exact since cos²+sin²=1
            moved = plain * c1 + _rotate_half(plain) * s1
            keys.append(moved.to(k.dtype) if T_l else k)

        return replace(cache, keys=tuple(keys), start=new_start)
