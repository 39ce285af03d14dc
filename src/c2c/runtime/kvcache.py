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

An *edited* cache (:mod:`c2c.runtime.edit`: messages dropped from a conversation's
cache, without a prefill) says so: ``edits`` records what was done, and such a cache
is never called ``exact``. Dropped tokens whose positions were not closed leave
``gaps``: ``(index, width)`` means the positions skip ``width`` before token
``index``, so token ``i`` sits at :meth:`position_of` ``(i)`` and the next token at
``end``. Only caches without sliding-window layers have gaps.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import torch

from c2c.errors import IncompatibleCacheError, RuntimeUnsupportedError


MAX_EDIT_STEPS = 32  # steps an edit record keeps one by one (older ones fold into one: Edits.plus)


@dataclass(frozen=True, kw_only=True)
class EditStep:
    """One edit of a cache: token spans dropped, what followed them re-positioned or not, some recomputed.

    Attributes:
        dropped: the dropped spans, ``[a, b)`` in the positions they had when dropped.
        repositioned: tokens whose keys were re-rotated to close the gaps.
        recomputed: tokens whose K/V a repair recomputed (:mod:`c2c.runtime.repair`).
        repair: the repair level (``"none"``, ``"first:K"``, ``"ratio:R"``).
    """

    dropped: tuple[tuple[int, int], ...] = ()
    repositioned: int = 0
    recomputed: int = 0
    repair: str = "none"
    tokens: int | None = None   # tokens dropped (the spans' widths count a gap left open inside one too)

    @property
    def dropped_tokens(self) -> int:
        return self.tokens if self.tokens is not None else sum(b - a for a, b in self.dropped)

    def to_dict(self) -> dict:
        return {"dropped": [list(s) for s in self.dropped], "tokens": self.dropped_tokens,
                "repositioned": self.repositioned, "recomputed": self.recomputed, "repair": self.repair}


@dataclass(frozen=True, kw_only=True)
class Edits:
    """Every edit made to a cache since it was last what a prefill of its tokens gives, oldest first."""

    steps: tuple[EditStep, ...] = ()

    @property
    def dropped(self) -> int:
        return sum(s.dropped_tokens for s in self.steps)

    @property
    def repositioned(self) -> int:
        return sum(s.repositioned for s in self.steps)

    @property
    def recomputed(self) -> int:
        return sum(s.recomputed for s in self.steps)

    @property
    def exact_until(self) -> int | None:
        """The first position any edit touched: the K/V before it are still what a prefill gives (None: no
        span was dropped)."""
        starts = [a for s in self.steps for a, _ in s.dropped]
        return min(starts) if starts else None

    def moved(self, at: int, tokens: int = 0) -> "Edits":
        """This record after the tokens from position ``at`` on were moved to other positions than those its
        steps name (open gaps closed, or the cache re-positioned and placed after another): a step with the
        empty span ``[at, at)``, so that :meth:`before` keeps every step for a cut past ``at``, whatever
        positions they name. Conservative: a cut up to ``at`` may keep steps it need not."""
        return self.plus(Edits(steps=(EditStep(dropped=((at, at),), repositioned=tokens, repair="moved",
                                               tokens=0),)))

    def before(self, end: int) -> "Edits | None":
        """The record of a part of the cache that ends at position ``end`` (a cut keeps a prefix): the steps
        whose effect reaches a position below ``end``; None when none does (the part is exact).

        A step's effect starts at its first dropped position ``s``, in the positions of its time. A later
        step that drops before a token moves it down, but never below its own first dropped position. So
        every token a step ``k`` touched sits at or after ``min(s_k, s_k+1, ...)``, and the steps kept are
        those with that minimum below ``end``: always the oldest ones. That holds while the positions a step
        names are those its tokens still sit at, but for later drops: where tokens moved otherwise (open gaps
        closed, a cache re-positioned), :meth:`moved` adds a step at the first moved position, which bounds
        every step before it. A record with a step whose spans are unknown (a record this build does not
        read) is kept whole."""
        starts = [min((a for a, _ in s.dropped), default=None) for s in self.steps]
        if not starts or None in starts:
            return self
        keep, low = 0, None
        for k in range(len(starts) - 1, -1, -1):
            low = starts[k] if low is None else min(low, starts[k])
            if low < end:
                keep = k + 1
                break
        return Edits(steps=self.steps[:keep]) if keep else None

    def plus(self, other: "Edits | None") -> "Edits":
        """Both records, oldest first; past :data:`MAX_EDIT_STEPS` the oldest fold into one step (its counts
        summed, its first span kept: :attr:`exact_until` and the totals stay right, the record bounded)."""
        if other is None:
            return self
        steps = self.steps + other.steps
        if len(steps) > MAX_EDIT_STEPS:
            old, steps = steps[: len(steps) - MAX_EDIT_STEPS + 1], steps[len(steps) - MAX_EDIT_STEPS + 1:]
            spans = [sp for s in old for sp in s.dropped]
            whole = all(s.dropped for s in old)  # a step with no span (moved) keeps the record whole: so does this
            folded = EditStep(dropped=(min(spans),) if spans and whole else (),
                              tokens=sum(s.dropped_tokens for s in old),
                              repositioned=sum(s.repositioned for s in old),
                              recomputed=sum(s.recomputed for s in old),
                              repair=f"folded:{sum(_steps_in(s) for s in old)}")
            steps = (folded,) + steps
        return Edits(steps=steps)

    def to_dict(self) -> dict:
        return {"dropped_tokens": self.dropped, "repositioned_tokens": self.repositioned,
                "recomputed_tokens": self.recomputed, "steps": [s.to_dict() for s in self.steps]}

    @classmethod
    def from_dict(cls, d) -> "Edits":
        """The record :meth:`to_dict` wrote (a signed header's); IncompatibleCacheError for a malformed one."""
        try:
            steps = tuple(EditStep(dropped=tuple((int(a), int(b)) for a, b in s["dropped"]),
                                   repositioned=int(s["repositioned"]), recomputed=int(s["recomputed"]),
                                   repair=str(s["repair"])[:32],
                                   tokens=int(s["tokens"]) if "tokens" in s else None) for s in d["steps"])
        except (KeyError, TypeError, ValueError, AttributeError) as e:
            raise IncompatibleCacheError(f"malformed edit record: {type(e).__name__}") from None
        return cls(steps=steps)

    @classmethod
    def read(cls, record) -> "Edits":
        """A signed header's record as :class:`Edits`; one that does not parse reads as an empty record, which
        still marks its cache edited (it is never taken for exact)."""
        try:
            return cls.from_dict(record)
        except IncompatibleCacheError:
            return cls()

    def summary(self) -> str:
        if not self.steps:
            return "edited (a record this build does not read)"
        return (f"edited: {self.dropped} tokens dropped in {len(self.steps)} edit(s), {self.repositioned} "
                f"re-positioned, {self.recomputed} recomputed")


def _steps_in(step: EditStep) -> int:
    """How many edits ``step`` stands for (a folded one: those it folded)."""
    kind, _, n = step.repair.partition(":")
    return int(n) if kind == "folded" and n.isdigit() else 1


def _placed(e: Edits | None, at: int) -> Edits | None:
    """The record of an edited cache placed at position ``at`` after another: the positions its steps name were
    where it was made (:meth:`Edits.moved`)."""
    return None if e is None else e.moved(at)


def _merge(a: Edits | None, b: Edits | None) -> Edits | None:
    return b if a is None else a.plus(b)


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
        gaps: ``(index, width)`` pairs, indices increasing: positions skip ``width`` before token ``index``.
        edits: what was done to this cache since a prefill gave it (None: nothing; it is exact).
    """

    keys: tuple[torch.Tensor, ...]
    values: tuple[torch.Tensor, ...]
    token_ids: tuple[int, ...]
    start: int = 0
    windows: tuple[int | None, ...] = field(default=())
    gaps: tuple[tuple[int, int], ...] = ()
    edits: Edits | None = None

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
        if self.gaps:
            if any(w is not None for w in self.windows):
                raise IncompatibleCacheError("a cache with sliding-window layers cannot have position gaps")
            idx = [i for i, _ in self.gaps]
            if idx != sorted(set(idx)) or idx[0] <= 0 or idx[-1] >= T or any(w <= 0 for _, w in self.gaps):
                raise IncompatibleCacheError(f"malformed position gaps {self.gaps[:4]} for {T} tokens")

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
        """One past the absolute position of the last token (where the next token goes)."""
        return self.start + self.seq_len + sum(w for _, w in self.gaps)

    @property
    def exact(self) -> bool:
        """True unless the cache was edited: then it is not what a prefill of ``token_ids`` gives."""
        return self.edits is None

    def position_of(self, index: int) -> int:
        """Absolute position of ``token_ids[index]``."""
        return self.start + index + sum(w for i, w in self.gaps if i <= index)

    def positions(self) -> list[int]:
        """Absolute positions of every token, in order."""
        out, shift, gaps = [], self.start, dict(self.gaps)
        for i in range(self.seq_len):
            shift += gaps.get(i, 0)
            out.append(shift + i)
        return out

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
        if self.gaps:  # no sliding layers: every layer holds every token
            return self.start
        return self.end - self.keys[layer].shape[2]

    # ------------------------------------------------------------- operations
    def slice(self, start: int, end: int) -> "KVCache":
        """The tokens at absolute positions ``[start, end)``, keeping their positions.

        Raises:
            RuntimeUnsupportedError: a sliding-window layer no longer holds part
                of the range, so the slice cannot be exact; or the cache has position
                gaps (cut it by index with :meth:`take`).
        """
        if self.gaps:
            raise RuntimeUnsupportedError(
                "this cache has dropped positions that were not closed; cut it by token index (take), "
                "or re-position it first (c2c.runtime.edit.close_gaps)")
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
        return replace(self, keys=tuple(keys), values=tuple(values), token_ids=ids, start=start,
                       edits=self._edits_before(end))

    def _edits_before(self, end: int) -> "Edits | None":
        """The edit record a part of this cache ending at position ``end`` keeps: the edits that reach it."""
        return self.edits.before(end) if self.edits is not None else None

    def take(self, a: int, b: int) -> "KVCache":
        """Tokens ``a..b-1`` by index, at the positions they have (gaps inside the range are kept).

        Only for caches without sliding-window layers (every layer holds every token).
        """
        if any(w is not None for w in self.windows):
            if not self.gaps:
                return self.slice(self.position_of(a), self.position_of(b - 1) + 1)
            raise RuntimeUnsupportedError("cutting by index needs full attention on every layer")
        if not 0 <= a < b <= self.seq_len:
            raise IncompatibleCacheError(f"tokens [{a}:{b}) are outside the cache's {self.seq_len}")
        return replace(self, keys=tuple(k[:, :, a:b] for k in self.keys),
                       values=tuple(v[:, :, a:b] for v in self.values), token_ids=self.token_ids[a:b],
                       start=self.position_of(a), gaps=tuple((i - a, w) for i, w in self.gaps if a < i < b),
                       edits=self._edits_before(self.position_of(b - 1) + 1))

    def head(self, n: int) -> "KVCache":
        """The first ``n`` tokens (by index)."""
        if n >= self.seq_len:
            return self
        return self.take(0, n) if self.gaps else self.slice(self.start, self.start + n)

    def append(self, other: "KVCache", *, gap_ok: bool = False) -> "KVCache":
        """This cache followed by ``other``, whose positions must continue ours.

        With ``gap_ok``, ``other`` may start past our end: the positions between stay empty
        (a gap, as after a drop without re-positioning).
        """
        if other.start != self.end and not (gap_ok and other.start > self.end):
            raise IncompatibleCacheError(
                f"cannot append a cache starting at position {other.start} to one ending at "
                f"{self.end}; re-position it first"
            )
        if other.windows != self.windows:
            raise IncompatibleCacheError("caches come from models with different layer layouts")
        T = self.seq_len + other.seq_len
        if self.gaps or other.gaps or other.start != self.end:
            n = self.seq_len
            gaps = self.gaps + (((n, other.start - self.end),) if other.start != self.end else ()) \
                + tuple((i + n, w) for i, w in other.gaps)
            return replace(self, keys=tuple(torch.cat([a, b], dim=2) for a, b in zip(self.keys, other.keys)),
                           values=tuple(torch.cat([a, b], dim=2) for a, b in zip(self.values, other.values)),
                           token_ids=self.token_ids + other.token_ids, gaps=gaps,
                           edits=_merge(self.edits, _placed(other.edits, other.start)))
        keys, values = [], []
        for k1, v1, k2, v2, w in zip(self.keys, self.values, other.keys, other.values, self.windows):
            keep = self.layer_length(T, w)
            keys.append(torch.cat([k1, k2], dim=2)[:, :, -keep:] if keep else k2[:, :, :0])
            values.append(torch.cat([v1, v2], dim=2)[:, :, -keep:] if keep else v2[:, :, :0])
        return replace(
            self, keys=tuple(keys), values=tuple(values), token_ids=self.token_ids + other.token_ids,
            edits=_merge(self.edits, _placed(other.edits, other.start)),
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
