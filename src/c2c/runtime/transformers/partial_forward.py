"""Forwards that stop early: the probes behind verification (:mod:`c2c.trust.probe`) and slice repair.

Each ends right after the attention block of the last layer it needs (its K/V are cached
by then): the MLP, the later layers, the norm and the LM head would be wasted.
"""

from __future__ import annotations

import contextlib
from typing import Sequence

import torch

from c2c.errors import RuntimeUnsupportedError
from c2c.runtime.kvcache import KVCache
from c2c.runtime.transformers.forward import positions_after, to_hf


@torch.inference_mode()
def forward_first_layers(model, ids: Sequence[int], past: KVCache,
                         n_layers: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """K/V of ``ids`` after ``past`` for the first ``n_layers`` layers only (cheap probe).

    Returns ``n_layers`` pairs of ``(1, kv_heads, len(ids), head_dim)`` tensors.
    """
    device = next(model.parameters()).device
    cache = to_hf(model, past)
    with _stop_after_attention(model, n_layers - 1):  # the later layers never run
        model(input_ids=torch.tensor([list(ids)], dtype=torch.long, device=device), cache=cache,
              use_cache=True, logits_to_keep=1, **positions_after(past, len(ids), device=device))
    T = len(ids)
    return [(cache.layers[i].keys[:, :, -T:], cache.layers[i].values[:, :, -T:]) for i in range(n_layers)]


@torch.inference_mode()
def forward_masked(model, ids: Sequence[int], positions: Sequence[int], past: KVCache,
                   allowed: torch.Tensor) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Run ``ids`` at explicit ``positions`` after ``past`` under a custom attention mask.

    ``allowed`` is a bool ``(len(ids), past.seq_len + len(ids))`` matrix: which cache
    entries (then which of the new tokens) each new token may attend to. Returns the
    new tokens' K/V per layer, ``(1, kv_heads, len(ids), head_dim)`` each. Only for
    models without sliding windows (the same mask serves every layer).
    """
    device = next(model.parameters()).device
    cache = to_hf(model, past)
    input_ids = torch.tensor([list(ids)], dtype=torch.long, device=device)            # (1, q)
    position_ids = torch.tensor([list(positions)], dtype=torch.long, device=device)   # (1, q)
    mask = allowed.to(device)[None, None]                                              # (1, 1, q, kv)
    with _stop_after_attention(model, -1):
        model(input_ids=input_ids, position_ids=position_ids, attention_mask=mask, cache=cache, use_cache=True,
              logits_to_keep=1)
    q = len(ids)
    return [(layer.keys[:, :, -q:], layer.values[:, :, -q:]) for layer in cache.layers]


@torch.inference_mode()
def forward_layer0(model, ids: Sequence[int], start: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Layer-0 K/V of ``ids`` at positions ``start, start + 1, ...`` (about 1/num_layers of a prefill).

    Returns ``(keys, values)``, each ``(1, kv_heads, T_0, head_dim)`` where ``T_0`` is
    what layer 0 keeps (all ``T``, or the last ``W - 1`` for a sliding window).
    """
    device = next(model.parameters()).device
    cache = to_hf(model, None)
    input_ids = torch.tensor([list(ids)], dtype=torch.long, device=device)              # (1, T)
    positions = torch.arange(start, start + len(ids), device=device)[None, :]          # (1, T)
    with _stop_after_attention(model, 0):
        model(input_ids=input_ids, position_ids=positions, cache=cache, use_cache=True, logits_to_keep=1)
    layer = cache.layers[0]
    return layer.keys, layer.values


class _Stop(Exception):
    """Raised from a module hook to end a forward after the layer we need."""


@contextlib.contextmanager
def _stop_after_attention(model, layer: int):
    """End the forward right after ``layer``'s attention block (its K/V are cached by then)."""
    def stop(*_):
        raise _Stop

    handle = decoder_layers(model)[layer].self_attn.register_forward_hook(stop)
    try:
        yield
    except _Stop:
        pass
    finally:
        handle.remove()


def decoder_layers(model):
    """The model's decoder layers (under a PEFT wrapper too)."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model  # unwrap PEFT
    inner = getattr(base, "model", base)
    layers = getattr(inner, "layers", None)
    if layers is None:
        raise RuntimeUnsupportedError(f"cannot find the decoder layers of {type(model).__name__}")
    return layers
