"""Our attention for transformers models: SDPA, except one bf16/fp16 query on a CPU, computed in fp32, and a
ragged batch of decode steps (:class:`Rows`), each row against its own sequence's K/V.

Registered in transformers' registries under :data:`ATTENTION` when a model is loaded
(:func:`register_attention`), never at import.
"""

from __future__ import annotations

import torch
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, sdpa_mask

ATTENTION = "c2c_sdpa"   # our attention implementation's name in transformers' registry


class Rows:
    """The K (or V) of a packed pass of several sequences: segment ``b``'s own tensor ``(1, kv_heads, T_b,
    head_dim)``, the whole of what its sequence's cache layer holds after the new tokens, and ``sizes[b]``, how many
    of the pass's query tokens are segment ``b``'s (its last ``sizes[b]`` keys are theirs).

    What :class:`~c2c.runtime.transformers.forward.RaggedCache` hands the attention in place of one padded
    tensor, so that sequences of different lengths run in one forward pass without copying their caches into a
    batch."""

    __slots__ = ("rows", "sizes", "window")

    def __init__(self, rows: list[torch.Tensor], sizes: list[int], window: int | None):
        self.rows, self.sizes, self.window = rows, sizes, window


def _segment_mask(n: int, kv: int, window: int | None, device) -> torch.Tensor:
    """Which of a segment's ``kv`` keys each of its ``n`` queries sees ``(1, 1, n, kv)``: causal (its last ``n``
    keys are its own queries'), and within ``window`` keys back on a sliding layer."""
    q = torch.arange(kv - n, kv, device=device)[:, None]          # (n, 1): each query's own key index
    k = torch.arange(kv, device=device)[None, :]                   # (1, kv)
    seen = k <= q
    if window is not None:
        seen &= k > q - window
    return seen[None, None]


def decode_attention(module, query, key, value, attention_mask, dropout: float = 0.0, scaling=None,
                     is_causal=None, **kwargs):
    """transformers' SDPA, except for one query token in a half-precision dtype on CPU.

    PyTorch's CPU flash-attention kernel takes ~0.4 ms per call for one bf16 query against
    512 keys (7x its fp32 time): a tenth of a 0.5B model's decode step. For that case the
    attention is computed here in fp32, grouped by K/V head (no repeat of K/V):
    ``query (1, H, 1, D)`` viewed as ``(1, Hkv, H/Hkv, D)`` against ``key (1, Hkv, T, D)``.
    The result is cast back to the query's dtype. Everything else goes to ``sdpa``.

    ``key`` and ``value`` given as :class:`Rows` are a packed pass ``query (1, H, sum n, D)``: each segment's
    queries attend to its own sequence's K/V only, causally (a one-token segment sees all of it: a sliding
    layer holds only its window), as that segment's own pass would.
    """
    if isinstance(key, Rows):
        outs, a = [], 0
        for k, v, n in zip(key.rows, value.rows, key.sizes):
            q = query[:, :, a:a + n]                                                   # (1, H, n, D)
            mask = None if n == 1 else _segment_mask(n, k.shape[2], key.window, q.device)
            outs.append(decode_attention(module, q, k, v, mask, dropout=dropout, scaling=scaling, **kwargs)[0])
            a += n
        return torch.cat(outs, dim=1), None                                            # (1, sum n, H, D)
    B, H, q_len, D = query.shape
    if (q_len != 1 or query.dtype not in (torch.bfloat16, torch.float16) or query.device.type != "cpu"
            or dropout or kwargs.get("softcap") is not None or kwargs.get("position_bias") is not None):
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout,
                                      scaling=scaling, is_causal=is_causal, **kwargs)
    Hkv, T = key.shape[1], key.shape[2]
    scale = scaling if scaling is not None else D ** -0.5
    q = query.reshape(B, Hkv, H // Hkv, D).float()                            # (B, Hkv, G, D)
    scores = torch.matmul(q, key.float().transpose(-1, -2)) * scale             # (B, Hkv, G, T)
    if attention_mask is not None:
        mask = attention_mask[..., -1:, -T:]                                    # (B|1, 1|H, 1, T)
        if mask.shape[1] not in (1, Hkv):
            mask = mask.reshape(mask.shape[0], Hkv, H // Hkv, T)
        if mask.dtype == torch.bool:
            scores = scores.masked_fill(~mask, float("-inf"))
        else:
            scores = scores + mask.float()
    out = torch.matmul(scores.softmax(-1), value.float())                       # (B, Hkv, G, D)
    return out.reshape(B, H, 1, D).transpose(1, 2).to(query.dtype).contiguous(), None  # (B, 1, H, D)


def register_attention() -> None:
    """Add :func:`decode_attention` to transformers' registries under :data:`ATTENTION` (idempotent).

    Called when a model is loaded, never at import: it adds a name, and changes no other.
    """
    if ATTENTION not in AttentionInterface._global_mapping:
        AttentionInterface.register(ATTENTION, decode_attention)
        ALL_MASK_ATTENTION_FUNCTIONS.register(ATTENTION, sdpa_mask)
