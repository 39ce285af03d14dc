"""What an engine states about its model and about itself: the inputs of a fingerprint.

- :class:`ModelFacts`: the model's cache layout and vocabulary (layers, layer types and
  sliding window, KV heads, head dim, RoPE, dtype, ...), typed, the same for every engine.
  A layer's sliding window is derived from its type and the model's one window, so the
  two can never disagree.
- :class:`EngineId`: which engine computed a cache and how (its build, its cache format,
  its numerics). It is the typed form of :attr:`c2c.artifact.fingerprint.Fingerprint.backend`,
  which stays one string on disk: :meth:`EngineId.parse` and ``str()`` are exact inverses,
  and this module is the only place that string is read.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from c2c.errors import IncompatibleCacheError

if TYPE_CHECKING:  # pragma: no cover
    from c2c.runtime.kvcache import KVCache

FULL_ATTENTION = "full_attention"
SLIDING_ATTENTION = "sliding_attention"
LAYER_TYPES = (FULL_ATTENTION, SLIDING_ATTENTION)


@dataclass(frozen=True, kw_only=True)
class ModelFacts:
    """Everything about a model's cache layout that decides whether a cache fits it.

    Attributes:
        architecture: the model type, as transformers names it (``"qwen2"``, ``"gemma3_text"``).
        num_layers: decoder layers, each with its own K/V.
        layer_types: per layer, ``"full_attention"`` or ``"sliding_attention"``.
        sliding_window: the window ``W`` of every sliding layer; ``None`` when no layer slides.
        kv_heads: K/V heads per layer (the ``H`` of ``(1, H, T, D)``).
        head_dim: the ``D`` of ``(1, H, T, D)``.
        rope: canonical JSON of the RoPE parameters.
        dtype: the K/V dtype (``"float32"``, ``"bfloat16"``, ``"float16"``).
        vocab_size: logits per position.
        eos_token_ids: the ids that end a turn, sorted.
        quantization: the weights' quantization where the engine runs one as shipped (``"Q4_K_M"``), else ``""``.
        kv_type: the engine's own K/V cache type where it has one (``"f16"``), else ``""``.
    """

    architecture: str
    num_layers: int
    layer_types: tuple[str, ...]
    sliding_window: int | None
    kv_heads: int
    head_dim: int
    rope: str
    dtype: str
    vocab_size: int
    eos_token_ids: tuple[int, ...]
    quantization: str = ""
    kv_type: str = ""

    def __post_init__(self) -> None:
        if len(self.layer_types) != self.num_layers or any(t not in LAYER_TYPES for t in self.layer_types):
            raise ValueError(f"layer_types must name {self.num_layers} layers, each one of {LAYER_TYPES}: "
                             f"{self.layer_types}")
        slides = SLIDING_ATTENTION in self.layer_types
        if slides != (self.sliding_window is not None) or (slides and self.sliding_window < 2):
            raise ValueError(f"sliding_window={self.sliding_window} with layer types {set(self.layer_types)}: a "
                             "window (>= 2) exactly when some layer slides")

    @property
    def windows(self) -> tuple[int | None, ...]:
        """Per layer, its sliding window ``W``, or ``None`` for full attention (as :class:`KVCache` holds them)."""
        return tuple(self.sliding_window if t == SLIDING_ATTENTION else None for t in self.layer_types)

    def require_fits(self, cache: "KVCache | None", *, model: str) -> None:
        """Raise :class:`IncompatibleCacheError` unless ``cache`` (if any) has this model's layout and dtype.

        ``model`` names the model in the message.
        """
        if cache is None:
            return
        if cache.num_layers != self.num_layers or cache.windows != self.windows:
            raise IncompatibleCacheError(
                f"cache has {cache.num_layers} layers with windows {cache.windows}, but "
                f"{model} has {self.num_layers} with {self.windows}")
        if cache.num_layers and (cache.keys[0].shape[1] != self.kv_heads or cache.keys[0].shape[3] != self.head_dim):
            raise IncompatibleCacheError(
                f"cache has {cache.keys[0].shape[1]} KV heads of dim {cache.keys[0].shape[3]}, "
                f"{model} has {self.kv_heads} of dim {self.head_dim}")
        if cache.num_layers and str(cache.dtype).removeprefix("torch.") != self.dtype:
            raise IncompatibleCacheError(f"cache dtype {cache.dtype} differs from the model's {self.dtype}")


@dataclass(frozen=True, kw_only=True)
class EngineId:
    """Which engine computed a cache, and how. Written as one string (``str()``), read by :meth:`parse`.

    ``"llama.cpp 0.3.36 gguf:Q4_K_M kv:f16 v_trans:1 numerics:cpu/avx2+avx512+..."`` is
    ``kind`` ``"llama.cpp"``, ``version`` ``"0.3.36"``, ``options`` ``(("gguf", "Q4_K_M"), ("kv",
    "f16"), ("v_trans", "1"))`` and ``numerics`` ``"cpu/avx2+avx512+..."``.

    Attributes:
        kind: the engine: ``"transformers"``, ``"llama.cpp"``, ``"vllm"``.
        version: the engine's release, ``""`` where the string names none.
        options: ``(key, value)`` pairs of the engine's cache format, in order.
        numerics: whatever changes the bits of a forward pass (the library versions, the device,
            the CPU's vendor and ISA class, the kernels), ``""`` where it is not named (caches made
            before c2c named it). Two runtimes whose numerics differ compute different bits for
            the same tokens: their caches are close, not exact.
    """

    kind: str
    version: str = ""
    options: tuple[tuple[str, str], ...] = ()
    numerics: str = ""

    def __post_init__(self) -> None:
        words = [self.kind, self.version] + [v for kv in self.options for v in kv] + [self.numerics]
        if not self.kind or ":" in self.kind or ":" in self.version or any(" " in w for w in words):
            raise ValueError(f"an engine id's kind and version carry no ':' and no word carries a space: {self!r}")
        if any(not k or ":" in k or k == "numerics" for k, _ in self.options):
            raise ValueError(f"engine option keys are non-empty, carry no ':' and are not 'numerics': {self.options}")

    def __str__(self) -> str:
        words = [self.kind] + ([self.version] if self.version else [])
        words += [f"{k}:{v}" for k, v in self.options]
        return " ".join(words + ([f"numerics:{self.numerics}"] if self.numerics else []))

    @classmethod
    def parse(cls, text: str) -> "EngineId":
        """The engine id written as ``text``.

        Raises:
            ValueError: ``text`` is not exactly how an engine id is written (so a header that
                carries it is not canonical).
        """
        words = text.split(" ")
        kind, rest = words[0], words[1:]
        version = rest.pop(0) if rest and ":" not in rest[0] else ""
        pairs = [w.partition(":") for w in rest]
        if any(not sep for _, sep, _ in pairs):
            raise ValueError(f"engine id {text[:80]!r}: every word after the kind and version is key:value")
        numerics = pairs.pop()[2] if pairs and pairs[-1][0] == "numerics" else ""
        engine = cls(kind=kind, version=version, options=tuple((k, v) for k, _, v in pairs), numerics=numerics)
        if str(engine) != text:
            raise ValueError(f"engine id {text[:80]!r} is not written canonically (as {str(engine)[:80]!r})")
        return engine

    def option(self, key: str) -> str | None:
        """The value of option ``key``, or ``None`` when the engine names none."""
        return next((v for k, v in self.options if k == key), None)

    def without_numerics(self) -> "EngineId":
        """This engine and cache format, numerics unnamed: what a tolerance-based check compares."""
        return EngineId(kind=self.kind, version=self.version, options=self.options)
