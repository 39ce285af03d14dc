"""`KVCache`: the value c2c moves between agents.

A KVCache is an immutable list of per-layer key/value tensors plus the token ids
and absolute positions they encode. It knows nothing about transformers; the
runtime converts it to and from the model's own cache objects.

Layout of every tensor: ``[batch=1, kv_heads, seq, head_dim]``.

A layer with a sliding window ``W`` keeps, like transformers does, only the
last ``min(T, W - 1)`` tokens; every other layer keeps all ``T``. Positions of
the tokens are ``start, start + 1, ..., start + T - 1``: a cache a model can
continue from has ``start == 0``; a *slice* exported from the middle of a
context has ``start > 0`` and must be re-positioned before it is attached.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import torch

from c2c.errors import IncompatibleCacheError, RuntimeUnsupportedError


@dataclass(frozen=True, kw_only=True)
class KVCache:
    """Per-layer keys and values of a run of tokens.

    Attributes:
        keys: one tensor per layer, ``(1, kv_heads, T_l, head_dim)``; ``T_l == T``
            for full-attention layers and ``min(T, W - 1)`` for sliding ones.
        values: same shapes as ``keys``.
        token_ids: the ``T`` token ids the cache encodes, in order.
        start: absolute position of ``token_ids[0]``.
        windows: per-layer sliding window ``W``, or ``None`` for full attention.
    """

    keys: tuple[torch.Tensor, ...]
    values: tuple[torch.Tensor, ...]
    token_ids: tuple[int, ...]
    start: int = 0
    windows: tuple[int | None, ...] = field(default=())

    def __post_init__(self) -> None:
        if len(self.keys) != len(self.values):
            raise IncompatibleCacheError(
                f"keys has {len(self.keys)} layers but values has {len(self.values)}"
            )
        if not self.windows:
            object.__setattr__(self, "windows", (None,) * len(self.keys))
        if len(self.windows) != len(self.keys):
            raise IncompatibleCacheError("windows must give one entry per layer")
        T = len(self.token_ids)
        for i, (k, v, w) in enumerate(zip(self.keys, self.values, self.windows)):
            if k.dim() != 4 or k.shape != v.shape or k.shape[0] != 1:
                raise IncompatibleCacheError(
                    f"layer {i}: keys {tuple(k.shape)} / values {tuple(v.shape)} are not "
                    "matching (1, kv_heads, seq, head_dim) tensors"
                )
            if k.shape[2] != self.layer_length(T, w):
                raise IncompatibleCacheError(
                    f"layer {i} holds {k.shape[2]} tokens, expected {self.layer_length(T, w)} "
                    f"for {T} tokens and window {w}"
                )

    # ------------------------------------------------------------------ facts
    @staticmethod
    def layer_length(seq_len: int, window: int | None) -> int:
        """Tokens a layer keeps for ``seq_len`` tokens under ``window``."""
        return seq_len if window is None else min(seq_len, window - 1)

    @property
    def seq_len(self) -> int:
        return len(self.token_ids)

    @property
    def end(self) -> int:
        """One past the absolute position of the last token."""
        return self.start + self.seq_len

    @property
    def num_layers(self) -> int:
        return len(self.keys)

    @property
    def dtype(self) -> torch.dtype:
        return self.keys[0].dtype

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.keys + self.values)

    def layer_start(self, layer: int) -> int:
        """Absolute position of the first token that ``layer`` still holds."""
        return self.end - self.keys[layer].shape[2]

    # ------------------------------------------------------------- operations
    def slice(self, start: int, end: int) -> "KVCache":
        """The tokens at absolute positions ``[start, end)``, keeping their positions.

        Raises:
            RuntimeUnsupportedError: a sliding-window layer no longer holds part
                of the range, so the slice cannot be exact.
        """
        if not (self.start <= start < end <= self.end):
            raise IncompatibleCacheError(
                f"slice [{start}:{end}) is outside the cache's positions [{self.start}:{self.end})"
            )
        keys, values = [], []
        for i, (k, v) in enumerate(zip(self.keys, self.values)):
            first = self.layer_start(i)
            # A sliding layer only needs the last W-1 tokens of the slice.
            keep = self.layer_length(end - start, self.windows[i])
            if end - keep < first:
                raise RuntimeUnsupportedError(
                    f"layer {i} (sliding window {self.windows[i]}) no longer holds positions "
                    f"{end - keep}..{first - 1}; export a slice nearer the end, or a full cache"
                )
            # (1, H, T_l, D) -> (1, H, keep, D): the last `keep` tokens before `end`
            stop = end - first
            keys.append(k[:, :, stop - keep : stop])
            values.append(v[:, :, stop - keep : stop])
        ids = self.token_ids[start - self.start : end - self.start]
        return replace(self, keys=tuple(keys), values=tuple(values), token_ids=ids, start=start)

    def append(self, other: "KVCache") -> "KVCache":
        """This cache followed by ``other``, whose positions must continue ours."""
        if other.start != self.end:
            raise IncompatibleCacheError(
                f"cannot append a cache starting at position {other.start} to one ending at "
                f"{self.end}; re-position it first"
            )
        if other.windows != self.windows:
            raise IncompatibleCacheError("caches come from models with different layer layouts")
        T = self.seq_len + other.seq_len
        keys, values = [], []
        for k1, v1, k2, v2, w in zip(self.keys, self.values, other.keys, other.values, self.windows):
            keep = self.layer_length(T, w)
            keys.append(torch.cat([k1, k2], dim=2)[:, :, -keep:] if keep else k2[:, :, :0])
            values.append(torch.cat([v1, v2], dim=2)[:, :, -keep:] if keep else v2[:, :, :0])
        return replace(
            self, keys=tuple(keys), values=tuple(values), token_ids=self.token_ids + other.token_ids
        )

    def to(self, device: str | torch.device | None = None, dtype: torch.dtype | None = None) -> "KVCache":
        return replace(
            self,
            keys=tuple(k.to(device=device, dtype=dtype) for k in self.keys),
            values=tuple(v.to(device=device, dtype=dtype) for v in self.values),
        )

    def max_abs_diff(self, other: "KVCache") -> float:
        """Largest absolute difference over all layers (shapes must match)."""
        worst = 0.0
        for a, b in zip(self.keys + self.values, other.keys + other.values):
            if a.shape != b.shape:
                raise IncompatibleCacheError(f"shapes differ: {tuple(a.shape)} vs {tuple(b.shape)}")
            if a.numel():
                worst = max(worst, (a.float() - b.float()).abs().max().item())
        return worst
