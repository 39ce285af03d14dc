"""The one module of c2c that imports llama.cpp (``llama-cpp-python``): a runtime on a GGUF file as shipped.

The model runs quantized, as its GGUF says (no dequantization); its KV cache is
llama.cpp's own (f16). c2c reads and writes that cache through the sequence-state
calls (``llama_state_seq_get_data`` / ``llama_state_seq_set_data``, never
``Llama.save_state``, which also copies the logits buffers), converted to and from
per-layer tensors by :mod:`c2c.runtime.llama_state`. So its caches are ordinary
:class:`~c2c.runtime.kvcache.KVCache` values, and its artifacts the same signed,
versioned c2c artifacts: trust, store, invalidation and the server work unchanged.

Its fingerprint names the engine, the llama-cpp-python version, the GGUF's
quantization, the KV type and layout, the build's numerics (its ``EngineId``, the
fingerprint's ``backend``), and the GGUF file's sha256 (``weights_digest``): a
llama.cpp cache never passes for a transformers one, nor the reverse.

What it does not do: it has none of the capability protocols of :mod:`c2c.runtime.protocol`
(scoring every position for multiple choice, the probes of sampled verification and slice
repair, token offsets and gradients for the fuser, LoRA adapters, RoPE for cross-model maps);
their callers refuse through :func:`c2c.runtime.protocol.require`, naming the way out
(``strict`` verification re-prefills with llama.cpp itself and works). It refuses, with
:class:`~c2c.errors.RuntimeUnsupportedError`, re-positioning a slice and models with
sliding-window layers (Gemma 3).

Its numerics (in the fingerprint) are the CPU features this llama.cpp build was
compiled for (``llama_print_system_info``): a build for other SIMD levels sums in
another order. ``scripts/setup.sh`` never turns its AMX options on: an AMX build
died with an illegal instruction on a 512-token prefill on these machines.

One context holds one sequence (seq 0). The runtime remembers which of its own
caches the context holds, so a decode loop that feeds its last cache back costs
no restore.
"""

from __future__ import annotations

import ctypes
import hashlib
import time
import weakref
from functools import cached_property
from pathlib import Path
from typing import Sequence

import jinja2.sandbox
import llama_cpp
import numpy as np
import torch

from c2c.canon import canonical_json, files_digest
from c2c.errors import ModelError, RuntimeUnsupportedError
from c2c.runtime.facts import FULL_ATTENTION, EngineId, ModelFacts
from c2c.runtime.kvcache import KVCache
from c2c.runtime.llama_state import build_seq_state, parse_seq_state, unwrap, wrap
from c2c.runtime.protocol import Generation
from c2c.runtime.sampling import check_sampling, sample_next
from c2c.runtime.turns import ChatTurns

FTYPES = {0: "F32", 1: "F16", 2: "Q4_0", 3: "Q4_1", 7: "Q8_0", 8: "Q5_0", 9: "Q5_1", 10: "Q2_K", 11: "Q3_K_S",
          12: "Q3_K_M", 13: "Q3_K_L", 14: "Q4_K_S", 15: "Q4_K_M", 16: "Q5_K_S", 17: "Q5_K_M", 18: "Q6_K", 32: "BF16"}
DEFAULT_CONTEXT = 4096


def version() -> str:
    return llama_cpp.__version__


def build_features() -> tuple[str, ...]:
    """The CPU features this llama.cpp build was compiled with and uses, lower case (``avx2``, ``avx512``, ...)."""
    info = llama_cpp.llama_print_system_info().decode("utf-8", errors="replace")
    found = []
    for part in info.split("|"):
        name, eq, value = part.partition("=")
        name = name.split(":")[-1].strip().lower()
        if eq and value.strip() == "1" and name and name not in found:
            found.append(name)
    return tuple(found)


class LlamaCppRuntime(ChatTurns):
    """One GGUF model in llama.cpp. Build with :meth:`load` or ``zoo.load(name, backend="llama.cpp")``."""

    def __init__(self, llm: "llama_cpp.Llama", *, name: str, path: Path, threads: int):
        self.llm = llm
        self.name = name
        self.path = Path(path)
        self.threads = threads
        self.adapters: tuple[str, ...] = ()
        self._ctx = llm._ctx.ctx
        self._vocab = llama_cpp.llama_model_get_vocab(llm._model.model)
        self._resident: tuple[int, ...] = ()      # the tokens the context holds, at positions 0...
        self._ours: list[weakref.ref] = []        # caches this runtime exported (held by the context as a prefix)
        self._holder: _Stepper | None = None      # the stepper whose sequence the context holds, unexported
        self.facts: ModelFacts = self._facts()
        self.eos_ids = frozenset(self.facts.eos_token_ids)
        self.v_trans = self._probe_v_trans()
        self.engine_id = EngineId(
            kind="llama.cpp", version=version(),
            options=(("gguf", self.facts.quantization), ("kv", self.facts.kv_type),
                     ("v_trans", str(int(self.v_trans)))),
            numerics="cpu/" + "+".join(build_features()))

    @classmethod
    def load(cls, gguf: str | Path, *, name: str | None = None, threads: int | None = None,
             n_ctx: int = DEFAULT_CONTEXT) -> "LlamaCppRuntime":
        """Load a GGUF file (quantized as shipped) with an f16 KV cache.

        Raises:
            ModelError: not a readable GGUF file.
            RuntimeUnsupportedError: a model with sliding-window layers.
        """
        path = Path(gguf)
        if not path.is_file():
            raise ModelError(f"{path} is not a GGUF file; pull the model (`c2c models pull NAME`) or give its .gguf")
        threads = threads or torch.get_num_threads()
        try:
            llm = llama_cpp.Llama(model_path=str(path), n_ctx=n_ctx, n_batch=512, n_threads=threads,
                                  n_threads_batch=threads, logits_all=False, verbose=False)
        except (ValueError, RuntimeError) as e:
            raise ModelError(f"llama.cpp could not load {path}: {e}") from e
        arch = llm.metadata.get("general.architecture", "")
        if llm.metadata.get(f"{arch}.attention.sliding_window"):
            llm.close()
            raise RuntimeUnsupportedError(
                f"{path.name} ({arch}) has sliding-window layers, whose llama.cpp cache c2c does not convert yet; "
                "use the transformers backend (--backend transformers)")
        return cls(llm, name=name or path.stem, path=path, threads=threads)

    def close(self) -> None:
        self.llm.close()

    chars_per_token: float | None = None  # no bound read from a GGUF vocabulary (the server then checks a
    # prompt's length after tokenizing it only)

    @property
    def context_tokens(self) -> int:
        """The most tokens this context holds (``n_ctx``)."""
        return self.llm.n_ctx()

    # ------------------------------------------------------------ identity
    def _facts(self) -> ModelFacts:
        m = self.llm.metadata
        arch = m.get("general.architecture", "")

        def num(key: str, default=None):
            v = m.get(f"{arch}.{key}")
            return default if v is None else int(float(v))

        n_layer, n_head = num("block_count"), num("attention.head_count")
        n_kv = num("attention.head_count_kv", n_head)
        head_dim = num("attention.key_length", num("embedding_length") // n_head)
        rope = {"rope_theta": float(m.get(f"{arch}.rope.freq_base", 10000.0)),
                "rope_type": m.get(f"{arch}.rope.scaling.type", "default")}
        n_vocab = self.llm.n_vocab()
        eog = [t for t in range(n_vocab) if llama_cpp.llama_vocab_is_eog(self._vocab, t)]
        ftype = m.get("general.file_type")
        return ModelFacts(
            architecture={"gemma3": "gemma3_text"}.get(arch, arch), num_layers=n_layer,
            layer_types=(FULL_ATTENTION,) * n_layer, sliding_window=None, kv_heads=n_kv, head_dim=head_dim,
            rope=canonical_json(rope).decode(), dtype="float16", vocab_size=n_vocab, eos_token_ids=tuple(eog),
            kv_type="f16",
            quantization=FTYPES.get(int(ftype), f"file_type{ftype}") if ftype is not None else "unknown")

    def _probe_v_trans(self) -> bool:
        """Whether this context keeps V transposed (its state must be written back the same way)."""
        self.llm.reset()
        self.llm.eval([self.bos_ids[0] if self.bos_ids else 0])
        blob = self._state_bytes()
        self.llm.reset()
        # u32 n_stream, u32 cells, one cell (i32 pos, u32 n_seq, i32 seq), then u32 v_trans
        return bool(int.from_bytes(unwrap(blob)[20:24], "little"))

    @property
    def device(self) -> torch.device:
        return torch.device("cpu")

    @property
    def dtype(self) -> torch.dtype:
        return torch.float16

    @cached_property
    def weights_digest(self) -> str:
        """sha256 of the GGUF file (computed once, remembered beside it by size and mtime)."""
        return files_digest([self.path], self.path.with_name(self.path.name + ".sha256.json"), named=False)

    @cached_property
    def tokenizer_digest(self) -> str:
        """The GGUF's tokenizer: its vocabulary's pieces and the chat template."""
        h = hashlib.sha256((self.llm.metadata.get("tokenizer.chat_template") or "").encode())
        for t in range(self.facts.vocab_size):
            h.update(llama_cpp.llama_vocab_get_text(self._vocab, t) or b"")
            h.update(b"\0")
        return h.hexdigest()

    # ---------------------------------------------------------- tokenizer
    def encode(self, text: str) -> list[int]:
        return list(self.llm.tokenize(text.encode("utf-8"), add_bos=False, special=True))

    def decode(self, ids: Sequence[int]) -> str:
        return self.llm.detokenize(list(ids), special=False).decode("utf-8", errors="replace")

    @cached_property
    def bos_ids(self) -> tuple[int, ...]:
        with_bos = self.llm.tokenize(b"x", add_bos=True, special=True)
        bare = self.llm.tokenize(b"x", add_bos=False, special=True)
        return tuple(with_bos[: len(with_bos) - len(bare)])

    @cached_property
    def _template(self):
        source = self.llm.metadata.get("tokenizer.chat_template")
        if not source:
            return None
        env = jinja2.sandbox.ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)

        def raise_exception(message):
            raise jinja2.exceptions.TemplateError(message)

        env.globals["raise_exception"] = raise_exception
        return env.from_string(source)

    def render_chat(self, messages: list[dict], add_generation_prompt: bool = False, *,
                    tools: list[dict] | None = None) -> str | None:
        """``messages`` (and ``tools``) rendered with the GGUF's own chat template (as transformers renders it)."""
        if self._template is None:
            return None
        piece = lambda t: self.llm.detokenize([t], special=True).decode("utf-8", errors="replace")  # noqa: E731
        return self._template.render(messages=messages, add_generation_prompt=add_generation_prompt,
                                     tools=tools or None, bos_token=piece(self.llm.token_bos()),
                                     eos_token=piece(self.llm.token_eos()))

    # ------------------------------------------------------------- state
    def _state_bytes(self) -> bytes:
        size = llama_cpp.llama_state_seq_get_size(self._ctx, 0)
        buf = (ctypes.c_uint8 * size)()
        got = llama_cpp.llama_state_seq_get_data(self._ctx, buf, size, 0)
        return bytes(memoryview(buf)[:got])

    def _export(self) -> KVCache:
        """The context's sequence as a KVCache (one copy out of llama.cpp)."""
        f = self.facts
        state = parse_seq_state(unwrap(self._state_bytes()), kv_heads=f.kv_heads, head_dim=f.head_dim,
                                num_layers=f.num_layers)
        if state.positions != tuple(range(len(self._resident))):
            raise RuntimeUnsupportedError("the llama.cpp context holds positions c2c did not put there")
        cache = KVCache(keys=state.keys, values=state.values, token_ids=self._resident, windows=f.windows)
        self._ours = [r for r in self._ours if r() is not None][-15:] + [weakref.ref(cache)]
        return cache

    def _hold(self, past: KVCache | None) -> None:
        """Make the context hold exactly ``past`` (nothing for None) at positions 0... A stepper whose
        sequence the context holds unexported exports it first (the context is about to change hands)."""
        if self._holder is not None:
            holder, self._holder = self._holder, None
            holder.save()
        if past is None or past.seq_len == 0:
            self.llm.reset()
            self._resident = ()
            return
        if past.start != 0:
            raise RuntimeUnsupportedError(f"a model continues from a cache that starts at position 0, not "
                                          f"{past.start}; the llama.cpp backend does not re-position slices yet")
        n = past.seq_len
        if any(r() is past for r in self._ours) and self._resident[:n] == past.token_ids:
            self.llm.n_tokens = n  # our own cache, still in the context: eval drops what follows
            self._resident = past.token_ids
            return
        blob = wrap(build_seq_state(past.keys, past.values, range(n), v_trans=self.v_trans))
        self.llm.reset()
        llama_cpp.llama_memory_clear(llama_cpp.llama_get_memory(self._ctx), True)
        buf = (ctypes.c_uint8 * len(blob)).from_buffer_copy(blob)
        if llama_cpp.llama_state_seq_set_data(self._ctx, buf, len(blob), 0) != len(blob):
            raise RuntimeUnsupportedError("llama.cpp refused the cache (its layout does not match this context)")
        self.llm.n_tokens = n
        self.llm.input_ids[:n] = np.asarray(past.token_ids, dtype=np.intc)
        self._resident = past.token_ids

    def _eval(self, ids: Sequence[int], *, copy: bool = True) -> torch.Tensor:
        """Feed ``ids``; the last position's logits ``(vocab,)``. ``copy=False``: a view of llama.cpp's
        buffer, valid until the next eval (the decode loop samples from it first)."""
        if len(self._resident) + len(ids) > self.llm.n_ctx():
            raise RuntimeUnsupportedError(f"{len(self._resident) + len(ids)} tokens exceed this llama.cpp "
                                          f"context of {self.llm.n_ctx()}")
        self.llm.eval(list(ids))
        self._resident = self._resident + tuple(int(i) for i in ids)
        ptr = llama_cpp.llama_get_logits_ith(self._ctx, -1)
        view = np.ctypeslib.as_array(ptr, shape=(self.facts.vocab_size,))
        return torch.from_numpy(view.copy() if copy else view)  # (vocab,)

    # ------------------------------------------------------------- compute
    def prefill(self, ids: Sequence[int], past: KVCache | None = None, *,
                start: int = 0) -> tuple[torch.Tensor, KVCache]:
        """Run ``ids`` after ``past``: (next-token logits ``(vocab,)``, the grown cache). One pass of a
        :meth:`stepper`, exported at once."""
        if start:
            raise RuntimeUnsupportedError("the llama.cpp backend places a fresh sequence at position 0 only")
        s = self.stepper(past)
        logits = s.feed(ids)
        return logits, s.cache()

    def stepper(self, past: KVCache | None) -> "_Stepper":
        """Grow ``past`` pass by pass inside llama.cpp, exported once when asked (``Runtime.stepper``): a served
        turn's chunks and decode steps copy the sequence's state out once, not per pass."""
        self.check_cache(past)
        return _Stepper(self, past)

    def generate(self, ids: Sequence[int], past: KVCache | None = None, *, max_new_tokens: int = 32,
                 min_new_tokens: int = 0, temperature: float = 0.0, top_p: float = 1.0,
                 generator: torch.Generator | None = None) -> Generation:
        """As the transformers runtime's: decode natively, export the cache once at the end."""
        check_sampling(temperature, top_p)
        self.check_cache(past)
        t0 = time.perf_counter()
        self._hold(past)
        logits = self._eval(ids)
        t1 = time.perf_counter()
        out: list[int] = []
        eos = list(self.eos_ids)
        for step in range(max_new_tokens):
            if step < min_new_tokens and eos:
                logits[eos] = float("-inf")
            tok = sample_next(logits, temperature=temperature, top_p=top_p, generator=generator)
            out.append(tok)
            if tok in self.eos_ids or step == max_new_tokens - 1:
                break
            logits = self._eval([tok], copy=False)
        t2 = time.perf_counter()
        return Generation(token_ids=tuple(out), cache=self._export(), prefill_s=t1 - t0, decode_s=t2 - t1,
                          text=self.decode(out))

    def reposition(self, cache: KVCache, new_start: int) -> KVCache:
        if new_start == cache.start:
            return cache
        raise RuntimeUnsupportedError("the llama.cpp backend does not re-position slices yet; hand off a full "
                                      "cache (mode full), or use the transformers backend for slices")

    # NOTE: none of the capability protocols (c2c.runtime.protocol: Scoring, Probes, Offsets, Gradients,
    # Adapters, RopeCodec); their callers refuse through protocol.require(), naming the way out.

    def check_cache(self, cache: KVCache | None) -> None:
        self.facts.require_fits(cache, model=self.name)
        if cache is not None and not cache.exact:
            raise RuntimeUnsupportedError("the llama.cpp backend continues only from exact caches; an edited one "
                                          "(messages dropped: c2c.runtime.edit) needs the transformers backend")


class _Stepper:
    """A sequence in a :class:`LlamaCppRuntime`'s context (:meth:`LlamaCppRuntime.stepper`). ``_saved`` is the
    cache of what it held when last exported; ``_ahead`` says the context has grown it since. Whoever takes the
    context next makes it :meth:`save` first (``LlamaCppRuntime._hold``), so no pass is lost when turns
    interleave."""

    def __init__(self, rt: LlamaCppRuntime, past: KVCache | None):
        self._rt, self._saved, self._ahead = rt, past, False

    def feed(self, ids: Sequence[int]) -> torch.Tensor:
        if not ids:
            raise RuntimeUnsupportedError("prefill needs at least one token")
        rt = self._rt
        if rt._holder is not self:
            rt._hold(self._saved)
            rt._holder = self
        logits = rt._eval(ids)  # (vocab,)
        self._ahead = True
        return logits

    def save(self) -> None:
        """Export what the context holds for this sequence (before the context changes hands)."""
        if self._ahead:
            self._saved, self._ahead = self._rt._export(), False

    def cache(self) -> KVCache:
        self.save()  # ahead means the context is still this sequence's: _hold saves a holder before it changes
        if self._saved is None:
            raise RuntimeUnsupportedError("nothing was fed: a stepper's cache needs at least one token")
        return self._saved
