"""`CrossModelMap`: the fitted map from one model's cache to another's, as a file. Never pickle.

One safetensors file (readable by the ``safetensors`` library too)::

    metadata   {"c2c.map": <canonical JSON header>, "c2c.map_id": sha256 of that header}
    k.TTT.weight  (G * d_in, d_out) fp32   target layer TTT's un-rotated keys from the un-rotated
    k.TTT.bias    (d_out,)          fp32   keys of its G source layers, side by side
    v.TTT.weight, v.TTT.bias               the same for values

with ``d_in = kv_heads * head_dim`` of the source and ``d_out`` of the target. The header
names both models' fingerprints (weights digests included), the vocabulary they share, per
target layer the source layer (the layer mapping), the source layers read, ``alpha`` and R²
(held-out tokens) of keys and of values,
how the map was fitted, and ``tensor_digest``: sha256 over the tensor table and every tensor
byte. The map's id is the sha256 of the canonical header, so it covers every byte.

Reading checks everything (:func:`load`): a header that is not canonical, an id or a tensor
digest that does not match (a flipped byte anywhere), a missing, extra or misshapen tensor, a
non-finite weight. Applying a map checks the pair (:meth:`CrossModelMap.check_pair`): a map
never applies to models it was not fitted for. The digests give integrity, not authorship:
pin a map by its id (a calibration record does), or sign the file, to know who made it.
"""

from __future__ import annotations

import hashlib
import json
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load as load_bytes
from safetensors.torch import save as save_bytes

from c2c._io import read_bounded, write_atomic
from c2c.artifact.fingerprint import Fingerprint
from c2c.canon import canonical_json, check_format, sha256_hex
from c2c.errors import CorruptArtifactError, MapMismatchError, UnsupportedVersionError

FORMAT = "c2c-xmodel-map"
VERSION = 1
MAX_MAP_BYTES = 1 << 30       # a map is megabytes; a gigabyte bounds a hostile file
MAX_HEADER_BYTES = 4 << 20
KINDS = ("k", "v")
# Fingerprint fields a map does not depend on: the dtype the models run in (a map is fp32 and
# applies in any), and the engine's build and numerics (a map is a property of the weights; only
# the engine's kind is compared).
_IGNORED = ("dtype", "backend")


@dataclass(frozen=True, kw_only=True)
class LayerFit:
    """How one target layer's keys (``kind == "k"``) or values are predicted.

    ``source``: the source layer mapped to this one; ``sources``: the layers read, side by side
    (``source`` and its neighbours). ``r2``: of the map as stored, on held-out test tokens
    (never used to choose anything); ``r2_ridge``: the same before the spread was matched to the
    target's (equal without ``match_variance``); ``r2_calib``: the ridge's on the calibration
    tokens that chose ``source`` and ``alpha``.
    """

    source: int
    sources: tuple[int, ...]
    alpha: float
    r2: float
    r2_ridge: float
    r2_calib: float

    def to_dict(self) -> dict[str, Any]:
        return {"source": self.source, "sources": list(self.sources), "alpha": self.alpha, "r2": _round(self.r2),
                "r2_ridge": _round(self.r2_ridge), "r2_calib": _round(self.r2_calib)}


@dataclass(frozen=True, kw_only=True, eq=False)
class CrossModelMap:
    """A map from ``source``'s KV-cache to ``target``'s (see the module docstring for the file).

    ``layers[t]`` gives target layer ``t``'s fits as ``{"k": LayerFit, "v": LayerFit}``;
    ``weights`` holds the tensors by file name (``"k.003.weight"``...).
    """

    source: Fingerprint
    target: Fingerprint
    vocab_digest: str
    layers: tuple[dict[str, LayerFit], ...]
    weights: dict[str, torch.Tensor]
    fit: dict[str, Any] = field(default_factory=dict)
    created: str = ""

    # ---------------------------------------------------------------- identity
    def header(self) -> dict[str, Any]:
        return {"format": FORMAT, "version": VERSION, "source": self.source.to_dict(),
                "target": self.target.to_dict(), "vocab_digest": self.vocab_digest,
                "layers": [{kind: f.to_dict() for kind, f in lf.items()} for lf in self.layers],
                "fit": self.fit, "created": self.created, "tensor_digest": tensor_digest(self.weights)}

    @property
    def id(self) -> str:
        """sha256 of the canonical header (which covers every tensor byte through ``tensor_digest``)."""
        return sha256_hex(canonical_json(self.header()))

    def layer_sources(self, kind: str = "k") -> list[int]:
        """The source layer of each target layer (the layer mapping) for keys or values."""
        return [lf[kind].source for lf in self.layers]

    def r2(self, kind: str = "k") -> list[float]:
        """Held-out R² of each target layer's keys or values."""
        return [lf[kind].r2 for lf in self.layers]

    def weight(self, kind: str, t: int) -> tuple[torch.Tensor, torch.Tensor]:
        """``(weight (d_in, d_out), bias (d_out,))`` of target layer ``t``'s keys or values."""
        return self.weights[f"{kind}.{t:03d}.weight"], self.weights[f"{kind}.{t:03d}.bias"]

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.weights.values())

    # ------------------------------------------------------------------- pairs
    def check_pair(self, source: Fingerprint, target: Fingerprint) -> None:
        """Raise :class:`MapMismatchError` unless ``source`` -> ``target`` is the pair this map was fitted for
        (see :func:`require_pair`)."""
        require_pair(self.source, self.target, source, target)

    # --------------------------------------------------------------------- file
    def save(self, path: str | Path) -> str:
        """Write the map to ``path`` (atomically, mode 0600). Returns its id."""
        header = canonical_json(self.header()).decode()
        mid = sha256_hex(header.encode())
        state = {k: v.detach().to(torch.float32).contiguous() for k, v in self.weights.items()}
        write_atomic(path, save_bytes(state, metadata={"c2c.map": header, "c2c.map_id": mid}))
        return mid


def require_pair(fitted_source: Fingerprint, fitted_target: Fingerprint, source: Fingerprint,
                 target: Fingerprint) -> None:
    """Raise :class:`MapMismatchError` unless ``source`` -> ``target`` is the pair a map fitted for
    ``fitted_source`` -> ``fitted_target`` applies to.

    Every fingerprint field is compared (architecture, layers, heads, RoPE, tokenizer, weights
    digest, adapters, the engine's kind) except the dtype the models run in and the engine's build
    and numerics.
    """
    diffs = {}
    for side, ours, theirs in (("source", fitted_source, source), ("target", fitted_target, target)):
        for name, (a, b) in ours.diff(theirs, exact=False).items():
            if name not in _IGNORED:
                diffs[f"{side}.{name}"] = (a, b)
        if ours.backend.kind != theirs.backend.kind:
            diffs[f"{side}.backend"] = (ours.backend.kind, theirs.backend.kind)
    if diffs:
        parts = ", ".join(f"{k}: {_short(a)} != {_short(b)}" for k, (a, b) in sorted(diffs.items()))
        raise MapMismatchError(
            f"this map was fitted for {fitted_source.model_name or '?'} -> {fitted_target.model_name or '?'}, "
            f"not {source.model_name or '?'} -> {target.model_name or '?'} ({parts}); fit one for this pair "
            "with `c2c map fit`, or hand off by text", diffs)


def tensor_digest(weights: dict[str, torch.Tensor]) -> str:
    """sha256 over the canonical table ``[[name, "F32", shape], ...]`` (names sorted) and the tensors' bytes."""
    names = sorted(weights)
    h = hashlib.sha256(canonical_json([[n, "F32", list(weights[n].shape)] for n in names]))
    for n in names:
        h.update(weights[n].detach().to(torch.float32).contiguous().view(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def expected_shapes(source: Fingerprint, target: Fingerprint,
                    layers: tuple[dict[str, LayerFit], ...]) -> dict[str, tuple[int, ...]]:
    d_in, d_out = source.kv_heads * source.head_dim, target.kv_heads * target.head_dim
    out = {}
    for t, lf in enumerate(layers):
        for kind in KINDS:
            out[f"{kind}.{t:03d}.weight"] = (len(lf[kind].sources) * d_in, d_out)
            out[f"{kind}.{t:03d}.bias"] = (d_out,)
    return out


def load(path: str | Path, *, expect_id: str | None = None) -> CrossModelMap:
    """Read and check a map file (see the module docstring for every check).

    Args:
        expect_id: refuse the file unless its id is this one (a map pinned by a record).

    Raises:
        CorruptArtifactError: unreadable, not canonical, a digest or the id that does not match,
            tensors that do not fit the header, NaN or Inf.
        UnsupportedVersionError: a format version this build does not read.
    """
    data = bytes(read_bounded(path, MAX_MAP_BYTES))
    if len(data) < 8:
        raise CorruptArtifactError(f"{path} is not a map file (too short)")
    (n,) = struct.unpack("<Q", data[:8])
    if not 2 <= n <= min(MAX_HEADER_BYTES, len(data) - 8):
        raise CorruptArtifactError(f"{path}: header length {n} is out of range")
    try:
        meta = json.loads(data[8:8 + n]).get("__metadata__") or {}
        text, mid = meta["c2c.map"], meta["c2c.map_id"]
        doc = json.loads(text)
    except (ValueError, KeyError, AttributeError, TypeError):
        raise CorruptArtifactError(f"{path} is not a c2c map (no readable c2c.map header)") from None
    check_format(doc, FORMAT, VERSION, where=str(path), what="c2c map", not_it=CorruptArtifactError,
                 too_new=UnsupportedVersionError)
    try:
        canonical = canonical_json(doc).decode()
    except ValueError:
        raise CorruptArtifactError(f"{path}: the map header holds a non-finite number") from None
    if canonical != text:
        raise CorruptArtifactError(f"{path}: the map header is not canonical JSON (edited by hand?)")
    if sha256_hex(text.encode()) != mid or (expect_id is not None and mid != expect_id):
        raise CorruptArtifactError(f"{path}: the map header does not hash to its id"
                                   + ("" if expect_id is None else f" {expect_id[:12]}...") + " (modified or another map)")
    try:
        weights = load_bytes(data)
    except (SafetensorError, ValueError, RuntimeError) as e:
        raise CorruptArtifactError(f"{path}: the tensors cannot be read: {e}") from None
    try:
        source, target = Fingerprint.from_dict(doc["source"]), Fingerprint.from_dict(doc["target"])
        layers = tuple({kind: LayerFit(source=int(lf[kind]["source"]),
                                       sources=tuple(int(s) for s in lf[kind]["sources"]),
                                       alpha=float(lf[kind]["alpha"]),
                                       r2=_num(lf[kind]["r2"]), r2_ridge=_num(lf[kind]["r2_ridge"]),
                                       r2_calib=_num(lf[kind]["r2_calib"]))
                        for kind in KINDS} for lf in doc["layers"])
        xmap = CrossModelMap(source=source, target=target, vocab_digest=str(doc["vocab_digest"]), layers=layers,
                             weights=weights, fit=dict(doc["fit"]), created=str(doc["created"]))
        declared = str(doc["tensor_digest"])
    except (KeyError, TypeError, ValueError) as e:
        raise CorruptArtifactError(f"{path}: malformed map header field: {e}") from None
    if len(layers) != target.num_layers or any(
            not lf[k].sources or lf[k].source not in lf[k].sources
            or any(not 0 <= s < source.num_layers for s in lf[k].sources) for lf in layers for k in KINDS):
        raise CorruptArtifactError(f"{path}: the layer mapping does not fit the two models' depths")
    want = expected_shapes(source, target, layers)
    if set(weights) != set(want):
        raise CorruptArtifactError(f"{path}: tensors differ from the header's models: unexpected "
                                   f"{sorted(set(weights) - set(want))[:3]}, missing {sorted(set(want) - set(weights))[:3]}")
    for name, t in weights.items():
        if tuple(t.shape) != want[name] or t.dtype != torch.float32:
            raise CorruptArtifactError(f"{path}: tensor {name} is {t.dtype} {tuple(t.shape)}, expected fp32 {want[name]}")
        if not bool(torch.isfinite(t).all()):
            raise CorruptArtifactError(f"{path}: tensor {name} holds NaN or Inf")
    if tensor_digest(weights) != declared:
        raise CorruptArtifactError(f"{path}: the tensors do not hash to the header's tensor_digest (modified)")
    return xmap


def _round(x: float) -> float | None:
    return None if x != x else round(float(x), 6)  # NaN (not measured) is written as null


def _num(x: Any) -> float:
    return float("nan") if x is None else float(x)


def _short(v: Any) -> str:
    s = str(v)
    return s if len(s) <= 24 else s[:21] + "..."
