"""Recompute K/V at chosen positions with the receiver's own model.

Two probes, both used by :mod:`c2c.trust.verify`:

- :func:`kv_at_positions`: the K/V of *every layer* at positions ``p_1..p_k`` of
  a full cache, each token attending only to the cache's own entries before it
  (and itself). It is the batched form of ``runtime.prefill([t_p],
  past=cache.slice(0, p))``: one forward of ``k`` tokens with a 4-D attention
  mask and explicit position ids, instead of ``k`` one-token forwards.
- :func:`layer0_kv`: the K/V of *layer 0* at every position. Layer 0 depends
  only on the token and its position, so it is checked everywhere, also for a
  slice whose earlier context the receiver does not have. The forward stops
  right after the first attention block, so it costs about ``1/num_layers`` of
  a prefill.

Both forwards end right after the attention block of the last layer they need
(a module hook raises a private exception): every K/V is in the cache by then,
and the MLP, final norm and LM head would be wasted work.

NOTE: this is the only module of ``c2c.trust`` that drives the transformers
model object directly (through :mod:`c2c.runtime.hf` helpers and the model's
``forward``/module hooks). It belongs in ``c2c.runtime.hf``; it lives here
until the runtime owner moves it (see the trust report).
"""

from __future__ import annotations

import contextlib
from typing import Sequence

import torch

from c2c.errors import RuntimeUnsupportedError
from c2c.runtime import hf
from c2c.runtime.kvcache import KVCache

#: probe at most this many positions per forward (bounds the (k, T + k) mask)
PROBE_CHUNK = 256


class _Stop(Exception):
    """Raised from a module hook to end a forward after the layer we need."""


def kv_at_positions(runtime, cache: KVCache, positions: Sequence[int]) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """Recompute every layer's K/V at ``positions`` of ``cache`` from the cache's own context.

    Args:
        runtime: the receiver's :class:`~c2c.runtime.engine.Runtime`.
        cache: a full cache (``start == 0``) whose layers all hold every position.
        positions: distinct absolute positions in ``[0, cache.end)``.

    Returns:
        ``(keys, values)``: per layer, a tensor ``(1, kv_heads, k, head_dim)`` in the
        order of ``positions``.

    Raises:
        RuntimeUnsupportedError: the cache is a slice, or a sliding-window layer
            no longer holds the context of some position.
    """
    if cache.start != 0:
        raise RuntimeUnsupportedError(
            f"deep probes need a full cache starting at position 0, not {cache.start}; "
            "check layer 0 only, or pass the prefix cache")
    T, pos = cache.seq_len, list(positions)
    # a sliding layer holds only W - 1 tokens: the context and the appended probes must all fit
    if any(w is not None and T + min(len(pos), PROBE_CHUNK) > w - 1 for w in cache.windows):
        raise RuntimeUnsupportedError(
            "a sliding-window layer keeps only the last W-1 tokens, so earlier positions cannot be "
            "recomputed from this cache; use strict verification (a full re-prefill)")
    runtime._check_cache(cache)
    keys: list[list[torch.Tensor]] = [[] for _ in range(cache.num_layers)]
    values: list[list[torch.Tensor]] = [[] for _ in range(cache.num_layers)]
    for i in range(0, len(pos), PROBE_CHUNK):
        k, v = _probe_chunk(runtime, cache, pos[i: i + PROBE_CHUNK])
        for layer in range(cache.num_layers):
            keys[layer].append(k[layer])
            values[layer].append(v[layer])
    return [torch.cat(k, dim=2) for k in keys], [torch.cat(v, dim=2) for v in values]


@torch.inference_mode()
def _probe_chunk(runtime, cache: KVCache, pos: list[int]) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    model, T, k = runtime.model, cache.seq_len, len(pos)
    device, dtype = runtime.device, runtime.dtype
    hf_cache = hf._to_hf(model, cache)
    p = torch.tensor(pos, dtype=torch.long, device=device)                       # (k,)
    ids = torch.tensor([[cache.token_ids[i] for i in pos]], dtype=torch.long, device=device)  # (1, k)
    # Row i may see cache columns [0, p_i) and its own new column T + i, nothing else.
    cols = torch.arange(T + k, device=device)                                   # (T + k,)
    allowed = cols[None, :] < p[:, None]                                         # (k, T + k)
    allowed[torch.arange(k, device=device), T + torch.arange(k, device=device)] = True
    mask = torch.zeros(k, T + k, dtype=dtype, device=device)
    mask.masked_fill_(~allowed, torch.finfo(dtype).min)
    with _stop_after_attention(model, -1):  # every K/V is cached by then; skip the rest of the model
        model(input_ids=ids, position_ids=p[None, :], attention_mask=mask[None, None], cache=hf_cache,
              use_cache=True, logits_to_keep=1)
    # the k probe tokens were appended after the T cached ones: (1, H, T + k, D) -> (1, H, k, D)
    return ([layer.keys[:, :, T:T + k] for layer in hf_cache.layers],
            [layer.values[:, :, T:T + k] for layer in hf_cache.layers])


@torch.inference_mode()
def layer0_kv(runtime, token_ids: Sequence[int], start: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Layer-0 K/V of ``token_ids`` at positions ``start, start + 1, ...``.

    Returns ``(keys, values)``, each ``(1, kv_heads, T_0, head_dim)`` where ``T_0``
    is what layer 0 keeps (all ``T``, or the last ``W - 1`` for a sliding window).
    """
    model, device = runtime.model, runtime.device
    hf_cache = hf._to_hf(model, None)
    ids = torch.tensor([list(token_ids)], dtype=torch.long, device=device)             # (1, T)
    positions = torch.arange(start, start + len(token_ids), device=device)[None, :]    # (1, T)
    with _stop_after_attention(model, 0):
        model(input_ids=ids, position_ids=positions, cache=hf_cache, use_cache=True, logits_to_keep=1)
    layer = hf_cache.layers[0]
    return layer.keys, layer.values


@contextlib.contextmanager
def _stop_after_attention(model, layer: int):
    """End the forward right after ``layer``'s attention block (its K/V are cached then)."""
    def stop(*_):
        raise _Stop

    handle = _decoder_layers(model)[layer].self_attn.register_forward_hook(stop)
    try:
        yield
    except _Stop:
        pass
    finally:
        handle.remove()


def _decoder_layers(model):
    base = model.get_base_model() if hasattr(model, "get_base_model") else model  # unwrap PEFT
    inner = getattr(base, "model", base)
    layers = getattr(inner, "layers", None)
    if layers is None:
        raise RuntimeUnsupportedError(f"cannot find the decoder layers of {type(model).__name__}")
    return layers
