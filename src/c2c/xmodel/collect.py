"""A cache's K/V as the map sees them: RoPE taken out of the keys, heads side by side.

Keys are stored rotated for their positions; a linear map between two models is fitted
and applied to the keys *before* rotation (each model's own RoPE, through
:meth:`c2c.runtime.protocol.RopeCodec.rope_remove` / ``rope_apply``), so that position is
put back exactly by the target's own rotary embedding.
"""

from __future__ import annotations

import torch

from c2c.errors import RuntimeUnsupportedError
from c2c.runtime.kvcache import KVCache
from c2c.runtime.protocol import RopeCodec, require


def require_mappable(runtime) -> RopeCodec:
    """``runtime`` as a :class:`~c2c.runtime.protocol.RopeCodec` (its keys can be un-rotated) with no sliding layer.

    Raises:
        RuntimeUnsupportedError: its engine has no RoPE codec, or the model has sliding-window layers.
    """
    codec = require(runtime, RopeCodec)
    if any(w is not None for w in runtime.facts.windows):
        raise RuntimeUnsupportedError(f"{runtime.name} has sliding-window layers; a cross-model map needs every "
                                      "token of every layer")
    return codec


def flat_plain(runtime: RopeCodec, cache: KVCache) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """Per layer, the un-rotated keys and the values of ``cache``, each ``(T, H*D)`` float32.

    Row ``i`` is the token at position ``cache.start + i``; columns are head 0's ``D``
    dimensions, then head 1's, ...
    """
    keys, values = [], []
    for layer, (k, v) in enumerate(zip(cache.keys, cache.values)):
        _, H, T, D = k.shape
        plain = runtime.rope_remove(layer, k, cache.layer_start(layer))      # (1, H, T, D)
        keys.append(plain[0].transpose(0, 1).reshape(T, H * D))              # (T, H*D)
        values.append(v[0].float().transpose(0, 1).reshape(T, H * D))
    return keys, values


def unflat(x: torch.Tensor, heads: int) -> torch.Tensor:
    """``(T, H*D)`` -> ``(1, H, T, D)`` (the inverse of :func:`flat_plain`'s layout)."""
    T, HD = x.shape
    return x.reshape(T, heads, HD // heads).transpose(0, 1).unsqueeze(0).contiguous()
