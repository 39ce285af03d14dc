"""`TransformersRuntime`: one model loaded in transformers, behind the :class:`~c2c.runtime.protocol.Runtime` protocol.

It owns the model and its tokenizer and speaks only token ids and
:class:`~c2c.runtime.kvcache.KVCache` values; the jobs live in the modules beside it
(loading, attention, packing, forward passes, partial forwards, RoPE, LoRA).
"""

from __future__ import annotations

import hashlib
import time
from functools import cached_property
from pathlib import Path
from typing import Sequence

import torch
import transformers

from c2c.canon import weights_digest
from c2c.errors import ConfigError, RuntimeUnsupportedError
from c2c.runtime import numerics
from c2c.runtime.adapters import adapter_digest
from c2c.runtime.dtype import resolve as resolve_dtype, torch_dtype
from c2c.runtime.facts import EngineId, ModelFacts
from c2c.runtime.kvcache import KVCache
from c2c.runtime.protocol import Generation
from c2c.runtime.sampling import check_sampling, sample_next
from c2c.runtime.transformers import forward as fw
from c2c.runtime.transformers import int8, lora, loading, packing, partial_forward, rope
from c2c.runtime.transformers import tokenizer as tk
from c2c.runtime.transformers.model_facts import context_tokens, model_facts
from c2c.runtime.turns import ChatTurns


class TransformersRuntime(ChatTurns):
    """One model loaded in transformers. Build with :meth:`load` (a directory) or :func:`c2c.runtime.zoo.load`."""

    def __init__(self, model, tokenizer, *, name: str, path: Path | None = None):
        # NOTE: no process-wide side effect here (allocator, environment): the CLI tunes
        # malloc at its entry point (c2c.runtime.alloc); a library user opts in the same way.
        self.model = model
        self.tokenizer = tokenizer
        self.name = name
        self.path = Path(path) if path is not None else None
        self.facts: ModelFacts = model_facts(model)
        self.eos_ids = frozenset(self.facts.eos_token_ids)
        self.adapters: tuple[str, ...] = ()
        self.packed = 0  # linear layers held packed (see load)
        self.int8 = 0    # linear layers with an int8 copy for decode steps (dtype int8)

    @classmethod
    def load(cls, path: str | Path, *, name: str | None = None, dtype: str | None = None,
             device: str = "cpu") -> "TransformersRuntime":
        """Load a model directory; ``dtype`` as :func:`c2c.runtime.dtype.resolve` (default ``C2C_DTYPE``, auto).

        In bf16 on a CPU the linear layers are packed for oneDNN (faster reads; a kernel the
        fingerprint names: :mod:`c2c.runtime.transformers.packing`). In ``int8`` they get an int8
        copy for one-token decode steps as well (:mod:`c2c.runtime.transformers.int8`).
        """
        resolved = resolve_dtype(dtype, device)
        if resolved == "int8" and str(device) != "cpu":
            raise RuntimeUnsupportedError("dtype int8 runs on a CPU only; use bfloat16 on a GPU")
        model, tok = loading.load(path, dtype=torch_dtype(resolved), device=device)
        runtime = cls(model, tok, name=name or Path(path).name, path=Path(path))
        _ = runtime.weights_digest  # computed (or read from its memo) at load, never inside a first export
        runtime.packed = packing.pack_linears(model)
        if resolved == "int8":
            runtime.int8 = int8.quantize_linears(model)
        return runtime

    def ensure_dense(self) -> None:
        """Dense ``nn.Linear`` weights again, for LoRA adapters and gradients (a no-op unless packed or int8).

        The numerics change with it (:attr:`engine_id`), so caches made packed no longer match.
        """
        if self.int8:
            int8.dequantize_linears(self.model)
            self.int8 = 0
        if self.packed:
            packing.unpack_linears(self.model)
            self.packed = 0

    def close(self) -> None:
        """Nothing to free outside Python's memory."""

    # ------------------------------------------------------------ identity
    @property
    def engine_id(self) -> EngineId:
        """``transformers <version> numerics:torch-<version>/<device class>/linear-<kernel>``."""
        if self.device.type == "cuda":
            major, minor = torch.cuda.get_device_capability(self.device)
            where = f"cuda-sm{major}{minor}"
        else:
            where = numerics.cpu_numerics(self.facts.dtype)
        kernel = packing.linear_kernel(self.packed) + (f"+{int8.kernel_name()}" if self.int8 else "")
        return EngineId(kind="transformers", version=transformers.__version__,
                        numerics=f"torch-{torch.__version__}/{where}/linear-{kernel}")

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    @property
    def dtype(self) -> torch.dtype:
        return next(self.model.parameters()).dtype

    @cached_property
    def tokenizer_digest(self) -> str:
        return hashlib.sha256(tk.tokenizer_material(self.tokenizer)).hexdigest()

    @cached_property
    def vocab_digest(self) -> str:
        """sha256 of what token ids mean (vocabulary, specials), without the chat template.

        Two models with the same vocabulary digest read the same ids the same way (the
        Qwen2.5-Coder sizes differ only in their templates' tool section), which is what a
        cross-model map (:mod:`c2c.xmodel`) needs."""
        return hashlib.sha256(tk.tokenizer_material(self.tokenizer, template=False)).hexdigest()

    @cached_property
    def weights_digest(self) -> str:
        """sha256 over the weight files, computed once per model and cached beside them."""
        return weights_digest(self.path, self.model)

    @cached_property
    def context_tokens(self) -> int:
        """The model's context window (its config's ``max_position_embeddings``)."""
        return context_tokens(self.model)

    # ---------------------------------------------------------- tokenizer
    def encode(self, text: str) -> list[int]:
        return tk.encode(self.tokenizer, text)

    def decode(self, ids: Sequence[int]) -> str:
        return tk.decode(self.tokenizer, ids)

    def encode_with_offsets(self, text: str) -> tuple[list[int], list[tuple[int, int]]]:
        """Token ids of ``text`` and each token's character span ``[a, b)`` (for the fuser)."""
        return tk.encode_with_offsets(self.tokenizer, text)

    def render_chat(self, messages: list[dict], add_generation_prompt: bool = False, *,
                    tools: list[dict] | None = None) -> str | None:
        """``messages`` (and ``tools``) rendered with the model's own chat template; ``None`` without one."""
        return tk.render_chat(self.tokenizer, messages, add_generation_prompt, tools=tools)

    @cached_property
    def _grammar_tokenizer(self):
        return tk.grammar_tokenizer(self.tokenizer)

    def grammar_tokenizer(self):
        """The vocabulary as llguidance reads it (:class:`~c2c.runtime.protocol.Grammars`), built once."""
        return self._grammar_tokenizer

    @cached_property
    def bos_ids(self) -> tuple[int, ...]:
        return tuple(tk.bos_ids(self.tokenizer))

    @cached_property
    def chars_per_token(self) -> float | None:
        """The most characters one token stands for (``None``: unbounded); see :func:`.tokenizer.chars_per_token`."""
        return tk.chars_per_token(self.tokenizer)

    # ------------------------------------------------------------- compute
    def check_cache(self, cache: KVCache | None) -> None:
        self.facts.require_fits(cache, model=self.name)

    def prefill(self, ids: Sequence[int], past: KVCache | None = None, *,
                start: int = 0) -> tuple[torch.Tensor, KVCache]:
        """Run ``ids`` after ``past``. Returns (next-token logits ``(vocab,)``, the grown cache).

        Without ``past``, ``start`` places the tokens at positions ``start...``
        (attention only sees relative positions, so the K/V equal a re-positioned
        cache; used to check re-positioning on every layer).
        """
        if start and past is not None:
            raise ConfigError("start= only places a fresh sequence; a continuation starts where past ends")
        self.check_cache(past)
        seq = fw.Held(self.model, past, self.facts.windows, start)
        return seq.feed(ids), seq.cache()

    def stepper(self, past: KVCache | None) -> fw.Held:
        """Grow ``past`` pass by pass with transformers' cache held between passes, exported once when asked
        (``Runtime.stepper``): a decode step skips rebuilding and re-exporting the cache."""
        self.check_cache(past)
        return fw.Held(self.model, past, self.facts.windows)

    def feed_together(self, seqs: Sequence[fw.Held], ids: Sequence[Sequence[int]]) -> list[torch.Tensor]:
        """Several sequences in one forward pass (``Batching``): ``ids[b]`` after ``seqs[b]``; each one's last
        logits ``(vocab,)``."""
        if any(not isinstance(s, fw.Held) or s._model is not self.model for s in seqs):
            raise ConfigError("a packed pass takes this runtime's own sequences (its stepper())")
        return fw.feed_together(self.model, seqs, ids)

    def logits(self, ids: Sequence[int], past: KVCache | None = None) -> torch.Tensor:
        """Next-token logits ``(T, vocab)`` at every position of ``ids`` (for scoring)."""
        self.check_cache(past)
        return fw.forward_all_logits(self.model, ids, past)

    def logits_batch(self, seqs: Sequence[Sequence[int]], past: KVCache | None = None) -> list[torch.Tensor]:
        """:meth:`logits` of several continuations of the same ``past``, in one batched forward."""
        if not seqs or any(len(s) == 0 for s in seqs):
            raise ConfigError("logits_batch needs at least one non-empty sequence")
        self.check_cache(past)
        return fw.forward_batch_logits(self.model, seqs, past)

    def logits_with_grad(self, ids: Sequence[int], past: KVCache | None = None) -> torch.Tensor:
        """Like :meth:`logits` but differentiable w.r.t. ``past``'s tensors (fuser training)."""
        self.check_cache(past)
        self.ensure_dense()
        return fw.forward_logits_grad(self.model, ids, past)

    def generate(self, ids: Sequence[int], past: KVCache | None = None, *, max_new_tokens: int = 32,
                 min_new_tokens: int = 0, temperature: float = 0.0, top_p: float = 1.0,
                 generator: torch.Generator | None = None) -> Generation:
        """Decoding after feeding ``ids``; stops at EOS once ``min_new_tokens`` are out.

        Greedy by default (``temperature=0``); otherwise each token is drawn by
        :func:`~c2c.runtime.sampling.sample_next` with ``temperature``, ``top_p`` and
        ``generator`` (seed it for a reproducible draw).
        """
        check_sampling(temperature, top_p)
        t0 = time.perf_counter()
        seq = self.stepper(past)
        logits = seq.feed(ids)
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
            logits = seq.feed([tok])
        t2 = time.perf_counter()
        return Generation(token_ids=tuple(out), cache=seq.cache(), prefill_s=t1 - t0, decode_s=t2 - t1,
                          text=self.decode(out))

    def reposition(self, cache: KVCache, new_start: int) -> KVCache:
        """Move ``cache`` to positions ``new_start...`` by re-rotating its keys (see :mod:`.rope`)."""
        if new_start == cache.start:
            return cache
        self.check_cache(cache)
        if cache.gaps:
            raise RuntimeUnsupportedError("re-position a cache with open position gaps run by run "
                                          "(c2c.runtime.edit.close_gaps)")
        return rope.reposition(self.model, cache, new_start)

    def rope_remove(self, layer: int, keys: torch.Tensor, start: int) -> torch.Tensor:
        """``keys`` ``(1, H, T, D)`` of ``layer`` at positions ``start...`` with RoPE taken out (fp32).

        The :class:`~c2c.runtime.protocol.RopeCodec` capability: cross-model maps (:mod:`c2c.xmodel`) use it,
        and refuse an engine without it.
        """
        return rope.remove(self.model, layer, keys, start)

    def rope_apply(self, layer: int, plain: torch.Tensor, start: int) -> torch.Tensor:
        """Un-rotated keys ``(1, H, T, D)`` rotated for ``layer`` at positions ``start...`` (fp32)."""
        return rope.apply(self.model, layer, plain, start)

    # -------------------------------------------------------------- probes
    def probe_kv(self, ids: Sequence[int], positions: Sequence[int], past: KVCache,
                 allowed: torch.Tensor) -> list[tuple[torch.Tensor, torch.Tensor]]:
        self.check_cache(past)
        return partial_forward.forward_masked(self.model, ids, positions, past, allowed)

    def probe_first_layers(self, ids: Sequence[int], past: KVCache,
                           n_layers: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
        self.check_cache(past)
        return partial_forward.forward_first_layers(self.model, ids, past, n_layers)

    def probe_layer0(self, ids: Sequence[int], start: int) -> tuple[torch.Tensor, torch.Tensor]:
        return partial_forward.forward_layer0(self.model, ids, start)

    # ------------------------------------------------------------ adapters
    def attach_adapter(self, path: Path, name: str) -> None:
        digest = adapter_digest(path)
        self.ensure_dense()  # PEFT wraps nn.Linear layers
        self.model = lora.attach(self.model, Path(path), name)
        self.adapters = (f"{name}@{digest[:16]}",)

    def detach_adapter(self) -> None:
        self.model = lora.detach(self.model)
        self.adapters = ()

    def train_adapter(self, texts: Sequence[str], out_dir: Path, *, steps: int = 60, rank: int = 8,
                      lr: float = 3e-4, max_tokens: int = 128, seed: int = 0, progress: bool = True,
                      eval_texts: Sequence[str] = ()) -> dict:
        self.ensure_dense()  # PEFT wraps nn.Linear layers, and training needs their gradients
        self.model, curve = lora.train(self.model, self.encode, texts, Path(out_dir), steps=steps, rank=rank,
                                       lr=lr, max_tokens=max_tokens, seed=seed, progress=progress,
                                       eval_texts=eval_texts)
        return curve
