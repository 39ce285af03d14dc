"""vLLM's paged KV memory on CPU, read and written as c2c's per-layer ``[1, kv_heads, T, head_dim]`` tensors.

vLLM's CPU attention (``CPU_ATTN``) keeps one tensor per layer of shape
``[num_blocks, kv_heads, block_size, 2 * head_dim]``. Inside one (block, head) the
``2 * block_size * head_dim`` elements hold, for the ``vec`` and ``vec16`` kernels,
the keys column-major, ``[head_dim, block_size]``, then the values row-major,
``[block_size, head_dim]`` (``csrc/cpu/cpu_attn_vec.hpp``, ``reshape_and_cache``).
Other kernels (``amx``, ``neon``, ...) pack blocks differently; :func:`layout_for`
refuses them, and the layout's name is part of the model fingerprint, so a cache
never crosses between two packings.

A token at absolute position ``p`` of a request lives in block ``block_ids[p // B]``
at offset ``p % B``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch

from c2c.errors import RuntimeUnsupportedError

SUPPORTED_ISAS = ("vec", "vec16")


@dataclass(frozen=True, kw_only=True)
class PagedLayout:
    """How one layer's paged tensor maps to K and V: ``[NB, H, B, 2D]`` with K as ``[D, B]`` per block."""

    isa: str
    block_size: int
    kv_heads: int
    head_dim: int

    @property
    def name(self) -> str:
        """What the fingerprint records, e.g. ``cpu_attn:vec k:DxB v:BxD``."""
        return f"cpu_attn:{self.isa} k:DxB v:BxD"

    def check(self, layer: torch.Tensor) -> None:
        """Refuse a layer tensor that is not ``[NB, H, B, 2D]`` and contiguous."""
        want = (self.kv_heads, self.block_size, 2 * self.head_dim)
        if layer.dim() != 4 or tuple(layer.shape[1:]) != want or not layer.is_contiguous():
            raise RuntimeUnsupportedError(
                f"vLLM's KV layer is {tuple(layer.shape)} (contiguous: {layer.is_contiguous()}); the c2c connector "
                f"reads CPU_ATTN's [num_blocks, {want[0]}, {want[1]}, {want[2]}] layout only")

    def _views(self, layer: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        NB, H, B, D = layer.shape[0], self.kv_heads, self.block_size, self.head_dim
        k = layer.view(NB, H, 2, D, B)[:, :, 0]   # (NB, H, D, B): keys column-major
        v = layer.view(NB, H, 2, B, D)[:, :, 1]   # (NB, H, B, D): values row-major
        return k, v

    def _where(self, block_ids: Sequence[int], start: int, end: int, device) -> tuple[torch.Tensor, torch.Tensor]:
        pos = torch.arange(start, end, device=device)
        table = torch.as_tensor(list(block_ids), dtype=torch.long, device=device)
        return table[pos // self.block_size], pos % self.block_size   # (T,), (T,)

    def read(self, layer: torch.Tensor, block_ids: Sequence[int], start: int, end: int
             ) -> tuple[torch.Tensor, torch.Tensor]:
        """K and V of positions ``[start, end)``, each ``(1, H, T, D)``, copied out of the paged memory."""
        k, v = self._views(layer)
        b, o = self._where(block_ids, start, end, layer.device)
        keys = k[b, :, :, o]      # (T, H, D): advanced indices on dims 0 and 3 go first
        values = v[b, :, o, :]    # (T, H, D)
        return keys.permute(1, 0, 2).unsqueeze(0).contiguous(), values.permute(1, 0, 2).unsqueeze(0).contiguous()

    def write(self, layer: torch.Tensor, block_ids: Sequence[int], start: int, keys: torch.Tensor,
              values: torch.Tensor) -> None:
        """Put ``keys``/``values`` ``(1, H, T, D)`` at positions ``[start, start + T)`` of the paged memory."""
        T = keys.shape[2]
        k, v = self._views(layer)
        b, o = self._where(block_ids, start, start + T, layer.device)
        k[b, :, :, o] = keys[0].permute(1, 0, 2).to(layer.dtype)     # (T, H, D)
        v[b, :, o, :] = values[0].permute(1, 0, 2).to(layer.dtype)


def layout_for(isa: str, *, block_size: int, kv_heads: int, head_dim: int) -> PagedLayout:
    """The layout of CPU_ATTN kernel ``isa``, or :class:`RuntimeUnsupportedError` for one c2c cannot read."""
    if isa not in SUPPORTED_ISAS:
        raise RuntimeUnsupportedError(
            f"vLLM's CPU attention runs the {isa!r} kernel here, whose block packing the c2c connector does not "
            f"read (it reads {', '.join(SUPPORTED_ISAS)}); publish and attach are off on this instance")
    return PagedLayout(isa=isa, block_size=block_size, kv_heads=kv_heads, head_dim=head_dim)
