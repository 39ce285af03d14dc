"""Re-positioning a cache: undo RoPE at the old positions and apply it at the new ones.

Keys are stored after RoPE: ``k_p = k·cos(p) + rot(k)·sin(p)``. Both rotations use the
model's own rotary embedding (per layer type, for Gemma 3's two RoPE bases), so moved
keys match keys computed at the new positions up to float rounding. Values carry no
position and are unchanged.
"""

from __future__ import annotations

from dataclasses import replace

import torch

from c2c.errors import RuntimeUnsupportedError
from c2c.runtime.kvcache import KVCache

EXACT_ROPE_TYPES = ("default", "linear", "llama3")


def rotary_cos_sin(model, layer: int, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """The model's own RoPE ``cos, sin`` for ``positions`` at ``layer``: each ``(T, head_dim)``.

    Raises:
        RuntimeUnsupportedError: the RoPE type scales cos/sin or depends on the
            sequence length, so a re-rotation would not be exact.
    """
    cfg = model.config.get_text_config(decoder=True)
    base = model.get_base_model() if hasattr(model, "get_base_model") else model  # unwrap PEFT
    rotary = base.model.rotary_emb
    layer_types = getattr(cfg, "layer_types", None)
    params = cfg.rope_parameters or {}
    kwargs = {}
    if layer_types and isinstance(rotary.rope_type, dict):
        kwargs["layer_type"] = layer_types[layer]
        params = params[layer_types[layer]]
        scaling = getattr(rotary, f"{layer_types[layer]}_attention_scaling")
    else:
        scaling = rotary.attention_scaling
    rope_type = params.get("rope_type", "default")
    if rope_type not in EXACT_ROPE_TYPES or scaling != 1.0:
        raise RuntimeUnsupportedError(
            f"RoPE type {rope_type!r} (attention scaling {scaling}) cannot be re-rotated exactly; "
            "hand off a full cache instead of a re-positioned slice"
        )
    device = next(model.parameters()).device
    dummy = torch.empty(1, dtype=dtype, device=device)
    cos, sin = rotary(dummy, positions.to(device)[None, :], **kwargs)  # (1, T, D)
    return cos[0], sin[0]


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def remove(model, layer: int, keys: torch.Tensor, start: int) -> torch.Tensor:
    """``keys`` ``(1, H, T, D)`` rotated at positions ``start...`` -> the same keys before RoPE (fp32).

    The inverse rotation ``k·cos(p) - rot(k)·sin(p)`` is exact since ``cos² + sin² = 1``.
    """
    c, s = _cos_sin(model, layer, start, keys.shape[2])  # (T, D)
    kf = keys.float()
    return kf * c - _rotate_half(kf) * s


def apply(model, layer: int, plain: torch.Tensor, start: int) -> torch.Tensor:
    """Un-rotated keys ``(1, H, T, D)`` rotated for positions ``start...`` with ``layer``'s RoPE (fp32)."""
    c, s = _cos_sin(model, layer, start, plain.shape[2])  # (T, D)
    pf = plain.float()
    return pf * c + _rotate_half(pf) * s


def _cos_sin(model, layer: int, start: int, T: int) -> tuple[torch.Tensor, torch.Tensor]:
    positions = torch.arange(start, start + T, dtype=torch.long)  # (T,)
    c, s = rotary_cos_sin(model, layer, positions, torch.float32)
    return c.float(), s.float()


def reposition(model, cache: KVCache, new_start: int) -> KVCache:
    """``cache`` moved to positions ``new_start...`` by re-rotating its keys (see the module docstring)."""
    keys = []
    for layer, k in enumerate(cache.keys):
        if not k.shape[2]:
            keys.append(k)
            continue
        first = cache.layer_start(layer)
        plain = remove(model, layer, k, first)                                # (1, H, T_l, D)
        keys.append(apply(model, layer, plain, first - cache.start + new_start).to(k.dtype))
    return replace(cache, keys=tuple(keys), start=new_start)
