"""Forward passes of a transformers model from and into :class:`~c2c.runtime.kvcache.KVCache` values.

A KVCache becomes transformers' ``DynamicCache`` here and comes back from it here, so a
change of transformers' cache classes (``past_key_values`` -> ``cache``, ``key_cache`` lists
-> ``layers``) is mended in one place. Tensor layout of every K/V tensor crossing this module:
``[1, kv_heads, seq, head_dim]``.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Sequence

import torch
from transformers import DynamicCache

from c2c.errors import ConfigError, RuntimeUnsupportedError
from c2c.runtime.kvcache import KVCache
from c2c.runtime.transformers.attention import Rows


def to_hf(model, kv: KVCache | None, batch: int = 1) -> DynamicCache:
    """``kv`` as a transformers cache; ``batch`` > 1 repeats it (as views) for that many sequences."""
    cache = DynamicCache(config=model.config)
    if kv is None or kv.seq_len == 0:
        return cache
    if kv.start != 0:
        raise RuntimeUnsupportedError(
            f"a model can only continue from a cache that starts at position 0, not {kv.start}; "
            "re-position the slice after a prefix first"
        )
    if len(cache.layers) != kv.num_layers:
        raise RuntimeUnsupportedError(f"cache has {kv.num_layers} layers, model has {len(cache.layers)}")
    for layer, k, v in zip(cache.layers, kv.keys, kv.values):
        layer.update(k.expand(batch, -1, -1, -1), v.expand(batch, -1, -1, -1))
        if hasattr(layer, "cumulative_length"):
            # sliding layers hold only the last W-1 tokens; the count of tokens seen is T
            layer.cumulative_length = kv.seq_len
    return cache


def from_hf(cache: DynamicCache, token_ids: tuple[int, ...], windows: tuple[int | None, ...]) -> KVCache:
    keys, values = [], []
    for layer, w in zip(cache.layers, windows):
        keep = KVCache.layer_length(len(token_ids), w)
        keys.append(layer.keys[:, :, -keep:] if keep else layer.keys[:, :, :0])
        values.append(layer.values[:, :, -keep:] if keep else layer.values[:, :, :0])
    return KVCache(keys=tuple(keys), values=tuple(values), token_ids=token_ids, windows=windows)


def _input_ids(model, ids: Sequence[int]) -> torch.Tensor:
    return torch.tensor([list(ids)], dtype=torch.long, device=next(model.parameters()).device)  # (1, T)


def positions_after(past: KVCache | None, n: int, batch: int = 1, device=None) -> dict:
    """``position_ids`` for ``n`` tokens fed after ``past`` when they are not its length onwards (a cache
    with dropped positions left open: :mod:`c2c.runtime.edit`); ``{}`` when transformers' default holds."""
    if past is None or not past.gaps:
        return {}
    return {"position_ids": torch.arange(past.end, past.end + n, device=device)[None, :].expand(batch, -1)}  # (B, n)


def _carry(kv: KVCache, past: KVCache | None) -> KVCache:
    """``kv`` (fresh from transformers) with ``past``'s position gaps and edit record."""
    if past is None or (not past.gaps and past.edits is None):
        return kv
    return replace(kv, gaps=past.gaps, edits=past.edits)


BROKEN = ("an earlier pass of this sequence failed part way, so its cache is not whole; start again from the last "
          "cache you hold")


class Held:
    """One sequence grown pass by pass with its transformers cache held between passes
    (:class:`~c2c.runtime.protocol.Stepper`; a prefill is one pass of it): a decode step feeds the
    ``DynamicCache`` the last step grew instead of rebuilding it from a :class:`KVCache`, and the cache is
    exported once, when asked. The products are those of one-pass prefills chained, bit for bit (the same
    layers, the same concatenations).

    ``start`` places a fresh sequence (``past is None``) at positions ``start...``.
    """

    def __init__(self, model, past: KVCache | None, windows: tuple[int | None, ...], start: int = 0):
        self._model, self._past, self._windows, self._start = model, past, windows, start
        self._hf: DynamicCache | None = None                          # built on the first pass
        self._ids: list[int] = list(past.token_ids) if past is not None else []
        self._end = past.end if past is not None else start            # the next token's position
        self._positions = bool(past.gaps) if past is not None else start != 0   # not 0..T-1: pass them
        self._kv: KVCache | None = past                               # the last export, None once stale
        self._broken = False                                          # a pass raised part way

    @torch.inference_mode()
    def feed(self, ids: Sequence[int]) -> torch.Tensor:
        """Run ``ids`` after what the sequence holds; the last position's logits ``(vocab,)``."""
        if not ids:
            raise ConfigError("prefill needs at least one token")
        if self._broken:
            raise RuntimeUnsupportedError(BROKEN)
        if self._hf is None:
            self._hf = to_hf(self._model, self._past)
        input_ids = _input_ids(self._model, ids)                                          # (1, T)
        kwargs = ({"position_ids": torch.arange(self._end, self._end + len(ids), device=input_ids.device)[None, :]}
                  if self._positions else {})                                              # (1, T)
        new = [int(i) for i in ids]
        self._broken = True   # until the pass is through: a pass that raises may have grown some layers only
        out = self._model(input_ids=input_ids, cache=self._hf, use_cache=True, logits_to_keep=1, **kwargs)
        self._broken = False
        self._hf = out.cache
        self._ids += new
        self._end += len(ids)
        self._kv = None
        return out.logits[0, -1].float()

    def cache(self) -> KVCache:
        """What the sequence holds, exported once until the next pass."""
        if self._kv is None:
            if self._broken:
                raise RuntimeUnsupportedError(BROKEN)
            if self._hf is None:
                raise RuntimeUnsupportedError("nothing was fed: a stepper's cache needs at least one token")
            kv = _carry(from_hf(self._hf, tuple(self._ids), self._windows), self._past)
            self._kv = replace(kv, start=self._start) if self._start else kv
        return self._kv


class RaggedCache:
    """Several sequences' own transformers caches as one packed pass (segment ``b``: ``sizes[b]`` new tokens).

    A layer's ``update`` appends segment ``b``'s new K/V to sequence ``b``'s own cache layer, as that sequence's
    own pass would, and hands the attention each segment's whole K/V (:class:`~.attention.Rows`): no cache is
    copied into a padded batch, and each sequence's cache is, after the pass, what its own pass leaves."""

    def __init__(self, caches: list[DynamicCache], sizes: list[int], windows: tuple[int | None, ...]):
        self.caches, self.sizes, self.windows = caches, sizes, windows

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, layer_idx: int, *args, **kwargs):
        # key_states, value_states: (1, kv_heads, sum sizes, head_dim), segment b's tokens for caches[b]
        ks, vs, a = [], [], 0
        for cache, n in zip(self.caches, self.sizes):
            k, v = cache.layers[layer_idx].update(key_states[:, :, a:a + n], value_states[:, :, a:a + n])
            ks.append(k)   # (1, kv_heads, T_b, head_dim)
            vs.append(v)
            a += n
        w = self.windows[layer_idx]
        return Rows(ks, self.sizes, w), Rows(vs, self.sizes, w)


@torch.inference_mode()
def feed_together(model, seqs: Sequence["Held"], ids: Sequence[Sequence[int]]) -> list[torch.Tensor]:
    """``ids[b]`` fed after what ``seqs[b]`` holds, for every ``b``, in one forward pass (the tokens packed into one
    row, each segment at its own positions); the last position's logits ``(vocab,)`` of each.

    The weights are read once for the whole pass, which is where a CPU's decode time goes: decode steps (one token
    each) ride along with one another and with a prefill chunk. Attention runs segment by segment against each
    sequence's own cache (:class:`RaggedCache`). Each sequence ends as its own :meth:`Held.feed` of its tokens
    leaves it, within rounding (a matrix product of more rows blocks otherwise).
    """
    if len(seqs) != len(ids) or not seqs or any(len(x) == 0 for x in ids):
        raise ConfigError("a packed pass needs one non-empty token list per sequence, and at least one sequence")
    if len({id(s) for s in seqs}) != len(seqs):
        raise ConfigError("a sequence may appear once in a packed pass")
    for s in seqs:
        if s._broken:
            raise RuntimeUnsupportedError(BROKEN)
    for s in seqs:   # a sequence that has run no pass yet holds no transformers cache: build it (once)
        if s._hf is None:
            s._hf = to_hf(s._model, s._past)
    device = next(model.parameters()).device
    sizes = [len(x) for x in ids]
    flat = [int(t) for x in ids for t in x]
    input_ids = torch.tensor([flat], dtype=torch.long, device=device)                                 # (1, T)
    position_ids = torch.cat([torch.arange(s._end, s._end + n) for s, n in zip(seqs, sizes)])[None].to(device)  # (1, T)
    last = torch.tensor(sizes).cumsum(0) - 1                                                          # (B,)
    ragged = RaggedCache([s._hf for s in seqs], sizes, seqs[0]._windows)
    # a 4D mask is taken as given (none is built for the packed pass); the attention masks each segment itself
    mask = torch.ones(1, 1, 1, 1, dtype=torch.bool, device=device)                                  # (1, 1, 1, 1)
    for s in seqs:
        s._broken = True   # until the pass is through
    out = model(input_ids=input_ids, cache=ragged, use_cache=True, logits_to_keep=last.to(device),
                position_ids=position_ids, attention_mask=mask)
    logits = out.logits[0].float()                                                                    # (B, vocab)
    for s, x in zip(seqs, ids):
        s._broken = False
        s._ids += [int(t) for t in x]
        s._end += len(x)
        s._kv = None
    return list(logits)


@torch.inference_mode()
def forward_all_logits(model, ids: Sequence[int], past: KVCache | None) -> torch.Tensor:
    """Logits ``(T, vocab)`` for every position of ``ids`` after ``past`` (for scoring)."""
    return model(input_ids=_input_ids(model, ids), cache=to_hf(model, past), use_cache=True,
                 **positions_after(past, len(ids))).logits[0].float()


@torch.inference_mode()
def forward_batch_logits(model, seqs: Sequence[Sequence[int]], past: KVCache | None) -> list[torch.Tensor]:
    """Logits ``(len(s), vocab)`` for each sequence ``s`` fed after ``past``, in one forward.

    The sequences are right-padded into one batch: under causal attention a real
    token never sees the padding after it, so no mask is needed. (Scoring the
    options of a question this way costs one forward instead of one per option.)
    """
    device = next(model.parameters()).device
    B, L = len(seqs), max(len(s) for s in seqs)
    cache = to_hf(model, past, batch=B)
    input_ids = torch.zeros(B, L, dtype=torch.long, device=device)                    # (B, L), right-padded
    for b, s in enumerate(seqs):
        input_ids[b, :len(s)] = torch.tensor(list(s), dtype=torch.long)
    logits = model(input_ids=input_ids, cache=cache, use_cache=True,
                   **positions_after(past, L, B, device)).logits.float()  # (B, L, V)
    return [logits[b, :len(s)] for b, s in enumerate(seqs)]


def forward_logits_grad(model, ids: Sequence[int], past: KVCache | None) -> torch.Tensor:
    """Like :func:`forward_all_logits`, but under the caller's grad mode: ``(T, vocab)``.

    The tensors of ``past`` (``[1, kv_heads, seq, head_dim]`` per layer) may require
    grad; the loss then back-propagates through the frozen model into them. This is
    how a cache fuser is trained.
    """
    return model(input_ids=_input_ids(model, ids), cache=to_hf(model, past), use_cache=True,
                 **positions_after(past, len(ids))).logits[0].float()
