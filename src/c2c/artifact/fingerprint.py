"""Model fingerprint: everything that decides whether a cache is valid for another agent.

Two agents can share a KV-cache only when their models produce the same K/V for
the same tokens: same architecture and layer layout, same KV heads and head
dimension, same sliding windows, same RoPE, same dtype, the same tokenizer, the
same weights and the same adapters, the same engine and cache format, and the same
numerics (kernels, CPU class: :mod:`c2c.runtime.numerics`). A mismatch in RoPE or
tokenizer breaks silently, so every one of these is compared and every difference
is named. A check that compares K/V within a tolerance (:mod:`c2c.trust.verify`)
compares everything but the numerics (``require_same(..., exact=False)``).

The inputs come from the runtime's typed :class:`~c2c.runtime.facts.ModelFacts` and
:class:`~c2c.runtime.facts.EngineId`; ``backend`` is the engine id, written on disk as
the one string it always was (``"transformers"`` by default, left out of the header).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from typing import TYPE_CHECKING, Any

from c2c.canon import canonical_json, sha256_hex
from c2c.errors import FingerprintMismatchError
from c2c.runtime.facts import EngineId

if TYPE_CHECKING:  # pragma: no cover
    from c2c.runtime.protocol import Runtime

CACHE_FORMAT_VERSION = 1
DEFAULT_BACKEND = "transformers"
_MAX_FIELD_CHARS = 4096  # bound on each string field a (possibly hostile) header may carry


@dataclass(frozen=True, kw_only=True)
class Fingerprint:
    """The identity of the model that made a cache."""

    architecture: str
    num_layers: int
    layer_types: tuple[str, ...]
    kv_heads: int
    head_dim: int
    sliding_window: int | None
    rope: str                     # canonical JSON of the RoPE parameters
    dtype: str
    tokenizer_digest: str
    weights_digest: str
    adapters: tuple[str, ...] = ()
    cache_format: int = CACHE_FORMAT_VERSION
    model_name: str = ""          # informational: never compared
    # the engine, its build, cache format and numerics, written as one string, e.g. "llama.cpp 0.3.36
    # gguf:Q4_K_M kv:f16 v_trans:1 numerics:cpu/avx2+..."; the default ("transformers", as caches made
    # before this field were) is left out of the header, so those stay canonical
    backend: EngineId = EngineId(kind=DEFAULT_BACKEND)

    # -------------------------------------------------------------- building
    @classmethod
    def of(cls, runtime: "Runtime") -> "Fingerprint":
        return cls.of_facts(runtime.facts, tokenizer_digest=runtime.tokenizer_digest,
                            weights_digest=runtime.weights_digest, adapters=tuple(runtime.adapters),
                            model_name=runtime.name, backend=runtime.engine_id)

    @classmethod
    def of_facts(cls, f, *, tokenizer_digest: str, weights_digest: str, model_name: str, backend,
                 adapters: tuple[str, ...] = ()) -> "Fingerprint":
        """The fingerprint of caches with layout ``f`` (a :class:`~c2c.runtime.facts.ModelFacts`) made by
        ``backend`` (an :class:`~c2c.runtime.facts.EngineId`): for an engine that is no in-process runtime."""
        return cls(
            architecture=f.architecture, num_layers=f.num_layers, layer_types=f.layer_types,
            kv_heads=f.kv_heads, head_dim=f.head_dim, sliding_window=f.sliding_window, rope=f.rope,
            dtype=f.dtype, tokenizer_digest=tokenizer_digest, weights_digest=weights_digest,
            adapters=tuple(adapters), model_name=model_name, backend=backend,
        )

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["layer_types"] = list(self.layer_types)
        d["adapters"] = list(self.adapters)
        d["backend"] = str(self.backend)
        if d["backend"] == DEFAULT_BACKEND:
            del d["backend"]
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "Fingerprint":
        names = {f.name for f in fields(cls)}
        unknown = set(d) - names
        if unknown:
            raise ValueError(f"unknown fingerprint fields {sorted(unknown)}")
        d = dict(d)
        for name in ("num_layers", "kv_heads", "head_dim", "cache_format"):
            v = d.get(name)
            if not isinstance(v, int) or isinstance(v, bool) or not 0 < v <= 1 << 16:
                raise ValueError(f"fingerprint {name} must be a positive integer, got {v!r}")
        sw = d.get("sliding_window")
        if sw is not None and (not isinstance(sw, int) or isinstance(sw, bool) or sw < 1):
            raise ValueError(f"fingerprint sliding_window must be null or a positive integer, got {sw!r}")
        for name in ("architecture", "rope", "dtype", "tokenizer_digest", "weights_digest", "model_name", "backend"):
            v = d.get(name, "")
            if not isinstance(v, str) or len(v) > _MAX_FIELD_CHARS:
                raise ValueError(f"fingerprint {name} must be a string of at most {_MAX_FIELD_CHARS} characters")
        for name in ("layer_types", "adapters"):
            v = d.get(name, [])
            if (not isinstance(v, list) or len(v) > 1 << 16
                    or not all(isinstance(x, str) and len(x) <= 256 for x in v)):
                raise ValueError(f"fingerprint {name} must be a list of strings (at most 256 characters each)")
        d["layer_types"] = tuple(d.get("layer_types", ()))
        d["adapters"] = tuple(d.get("adapters", ()))
        d["backend"] = EngineId.parse(d.get("backend", DEFAULT_BACKEND))
        if len(d["layer_types"]) != d["num_layers"]:
            raise ValueError("fingerprint layer_types must list every layer")
        return cls(**d)

    @property
    def digest(self) -> str:
        """sha256 over every compared field (not the informational model name)."""
        d = self.to_dict()
        d.pop("model_name")
        return sha256_hex(canonical_json(d))

    # ------------------------------------------------------------- comparing
    def diff(self, other: "Fingerprint", *, exact: bool = True, engine: bool = True) -> dict[str, tuple[Any, Any]]:
        """Every compared field that differs, as ``{field: (ours, theirs)}`` (the backend as its string).

        ``exact=False`` leaves the engines' numerics out: for checks within a tolerance.
        ``engine=False`` leaves the whole engine (``backend``) out: for a cache of another engine
        that a decision allowed (:mod:`c2c.handoff.cross_engine`), checked within a tolerance.
        """
        out = {}
        for f in fields(self):
            if f.name == "model_name" or (f.name == "backend" and not engine):
                continue
            a, b = getattr(self, f.name), getattr(other, f.name)
            if f.name == "backend" and not exact:
                a, b = a.without_numerics(), b.without_numerics()
            if a != b:
                out[f.name] = (str(a), str(b)) if f.name == "backend" else (a, b)
        return out

    def require_same(self, other: "Fingerprint", *, exact: bool = True, engine: bool = True) -> None:
        """Raise :class:`FingerprintMismatchError` naming every differing field (see :meth:`diff`)."""
        d = self.diff(other, exact=exact, engine=engine)
        if d:
            parts = [f"{k}: {_short(a)} != {_short(b)}" for k, (a, b) in sorted(d.items()) if k != "backend"]
            if "backend" in d:  # the engines' strings share a long head: name the part that differs
                ours, theirs = self.backend, other.backend
                if ours.without_numerics() == theirs.without_numerics():
                    parts.append(f"numerics: {_short(ours.numerics, 80)} != {_short(theirs.numerics, 80)}")
                else:
                    parts.append(f"backend: {_short(str(ours.without_numerics()), 80)} != "
                                 f"{_short(str(theirs.without_numerics()), 80)}")
            parts = ", ".join(parts)
            raise FingerprintMismatchError(
                f"cache was made by {other.model_name or 'another model'}, not {self.model_name or 'this model'} "
                f"({parts}); hand off by text, or use a trained fuser for this pair", d)


def _short(v: Any, limit: int = 24) -> str:
    s = str(v)
    return s if len(s) <= limit else s[:limit - 3] + "..."
