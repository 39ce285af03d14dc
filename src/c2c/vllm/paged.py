"""vLLM's paged KV memory on CPU, read and written as c2c's per-layer ``[1, kv_heads, T, head_dim]`` tensors.

vLLM's CPU attention (``CPU_ATTN``) keeps one tensor per layer of shape
``[num_blocks, kv_heads, block_size, 2 * head_dim]``. Each (block, head) region holds
``B * D`` keys, then ``B * D`` values (``B`` the block size, ``D`` the head dim), packed as
the kernel that vLLM picked for this instance wants them. One entry of :data:`PACKINGS` per
kernel, each an element's offset inside the region:

==========  =========================  ================================================  ==========================
kernel      keys                       values                                            when vLLM picks it
==========  =========================  ================================================  ==========================
``vec``     ``[D, B]``: ``d*B + p``    ``[B, D]``: ``p*D + d``                            float32 / float16; bf16
``vec16``   as ``vec``                 as ``vec``                                        where no AMX; D % 32 != 0
``amx``     ``[B/16, D/2, 16, 2]``:    ``[D/16, B/2, 16, 2]``:                           bf16 on a CPU with AMX,
            ``K[p//16, d//2, p%16,     ``V[d//16, p//2, d%16, p%2]``                     B and D multiples of 32
            d%2]``
==========  =========================  ================================================  ==========================

(``csrc/cpu/cpu_attn_vec.hpp`` and ``cpu_attn_amx.hpp``, ``reshape_and_cache``.) Reading the
table is not trusted: :func:`check_against_kernel` runs the installed wheel's own
``cpu_attn_reshape_and_cache`` on random K/V and requires bit-identical reads and writes, and
the connector runs it at start-up, so a vLLM build that packs otherwise stops the server with
the way out instead of corrupting caches. Other kernels (``neon``, ``vxe``, ``vsx``, ``rvv``)
are refused by name. Each packing has its own name in the fingerprint (the kernels also round
differently), so a cache never crosses between two packings.

A token at absolute position ``p`` of a request lives in block ``block_ids[p // B]`` at offset
``p % B``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

import torch

from c2c.errors import RuntimeUnsupportedError


def _vec(p: torch.Tensor, d: torch.Tensor, B: int, D: int) -> tuple[torch.Tensor, torch.Tensor]:
    return d * B + p, B * D + p * D + d


def _amx(p: torch.Tensor, d: torch.Tensor, B: int, D: int) -> tuple[torch.Tensor, torch.Tensor]:
    keys = ((p // 16) * (D // 2) + d // 2) * 32 + (p % 16) * 2 + d % 2
    values = B * D + ((d // 16) * (B // 2) + p // 2) * 32 + (d % 16) * 2 + p % 2
    return keys, values


@dataclass(frozen=True)
class Packing:
    """One kernel's packing of a (block, head) region: its name in the fingerprint, the offsets of key and value
    ``(p, d)``, and what it needs of the block size, head dim and dtype."""

    name: str
    offsets: Callable[[torch.Tensor, torch.Tensor, int, int], tuple[torch.Tensor, torch.Tensor]]
    multiple: int = 1                       # B and D must be multiples of it
    dtypes: tuple[torch.dtype, ...] = ()    # empty: any


PACKINGS: dict[str, Packing] = {
    "vec": Packing("k:DxB v:BxD", _vec),
    "vec16": Packing("k:DxB v:BxD", _vec),
    "amx": Packing("k:B16xD2x16x2 v:D16xB2x16x2", _amx, multiple=32, dtypes=(torch.bfloat16,)),
}
SUPPORTED_ISAS = tuple(PACKINGS)


@dataclass(frozen=True, kw_only=True)
class PagedLayout:
    """How one layer's paged tensor ``[NB, H, B, 2D]`` maps to K and V, for one kernel (:data:`PACKINGS`)."""

    isa: str
    block_size: int
    kv_heads: int
    head_dim: int

    @property
    def packing(self) -> Packing:
        return PACKINGS[self.isa]

    @property
    def name(self) -> str:
        """What the fingerprint records, e.g. ``cpu_attn:vec k:DxB v:BxD``."""
        return f"cpu_attn:{self.isa} {self.packing.name}"

    def check(self, layer: torch.Tensor) -> None:
        """Refuse a layer tensor that is not ``[NB, H, B, 2D]``, contiguous, in a dtype the kernel packs."""
        want = (self.kv_heads, self.block_size, 2 * self.head_dim)
        if layer.dim() != 4 or tuple(layer.shape[1:]) != want or not layer.is_contiguous():
            raise RuntimeUnsupportedError(
                f"vLLM's KV layer is {tuple(layer.shape)} (contiguous: {layer.is_contiguous()}); the c2c connector "
                f"reads CPU_ATTN's [num_blocks, {want[0]}, {want[1]}, {want[2]}] layout only")
        if self.packing.dtypes and layer.dtype not in self.packing.dtypes:
            raise RuntimeUnsupportedError(f"vLLM's {self.isa!r} kernel packs {self.packing.dtypes}, not {layer.dtype}")

    def _index(self, block_ids: Sequence[int], start: int, end: int, device):
        """(block (T, 1, 1), head (1, H, 1), key offset (T, 1, D), value offset (T, 1, D)) of positions
        ``[start, end)``, to index the layer viewed as ``(NB, H, 2*B*D)``."""
        B, D = self.block_size, self.head_dim
        pos = torch.arange(start, end, device=device)
        table = torch.as_tensor(list(block_ids), dtype=torch.long, device=device)
        block, p = table[pos // B], pos % B                                     # (T,), (T,)
        koff, voff = self.packing.offsets(p[:, None], torch.arange(D, device=device)[None, :], B, D)   # (T, D)
        head = torch.arange(self.kv_heads, device=device)[None, :, None]       # (1, H, 1)
        return block[:, None, None], head, koff[:, None, :], voff[:, None, :]

    def _flat(self, layer: torch.Tensor) -> torch.Tensor:
        return layer.view(layer.shape[0], self.kv_heads, 2 * self.block_size * self.head_dim)   # (NB, H, 2BD)

    def read(self, layer: torch.Tensor, block_ids: Sequence[int], start: int, end: int
             ) -> tuple[torch.Tensor, torch.Tensor]:
        """K and V of positions ``[start, end)``, each ``(1, H, T, D)``, copied out of the paged memory."""
        flat = self._flat(layer)
        b, h, ko, vo = self._index(block_ids, start, end, layer.device)
        keys, values = flat[b, h, ko], flat[b, h, vo]                          # (T, H, D) each
        return keys.permute(1, 0, 2).unsqueeze(0).contiguous(), values.permute(1, 0, 2).unsqueeze(0).contiguous()

    def write(self, layer: torch.Tensor, block_ids: Sequence[int], start: int, keys: torch.Tensor,
              values: torch.Tensor) -> None:
        """Put ``keys``/``values`` ``(1, H, T, D)`` at positions ``[start, start + T)`` of the paged memory."""
        flat = self._flat(layer)
        b, h, ko, vo = self._index(block_ids, start, start + keys.shape[2], layer.device)
        flat[b, h, ko] = keys[0].permute(1, 0, 2).to(layer.dtype)             # (T, H, D)
        flat[b, h, vo] = values[0].permute(1, 0, 2).to(layer.dtype)


def layout_for(isa: str, *, block_size: int, kv_heads: int, head_dim: int) -> PagedLayout:
    """The layout of CPU_ATTN kernel ``isa``, or :class:`RuntimeUnsupportedError` naming the way out."""
    packing = PACKINGS.get(isa)
    if packing is None:
        raise RuntimeUnsupportedError(
            f"vLLM's CPU attention runs the {isa!r} kernel here, whose block packing the c2c connector does not "
            f"read (it reads {', '.join(SUPPORTED_ISAS)}); the server cannot start with the connector. Serve "
            "without --kv-transfer-config, or on an x86 CPU")
    if block_size % packing.multiple or head_dim % packing.multiple:
        raise RuntimeUnsupportedError(f"vLLM's {isa!r} kernel needs a block size and head dim that are multiples "
                                      f"of {packing.multiple}, not {block_size} and {head_dim}")
    return PagedLayout(isa=isa, block_size=block_size, kv_heads=kv_heads, head_dim=head_dim)


Kernel = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, str], None]


def check_against_kernel(layout: PagedLayout, kernel: Kernel, dtype: torch.dtype, *, seed: int = 0) -> None:
    """Run vLLM's own ``cpu_attn_reshape_and_cache`` (``kernel``, called as vLLM's CPU backend calls it) on random
    K/V over three blocks, and require that :meth:`PagedLayout.read` finds exactly what it wrote and that
    :meth:`PagedLayout.write` writes exactly the same bytes.

    Raises:
        RuntimeUnsupportedError: they differ: this vLLM build packs ``layout.isa`` otherwise than c2c reads it.
    """
    g = torch.Generator().manual_seed(seed)
    H, B, D = layout.kv_heads, layout.block_size, layout.head_dim
    blocks, T = [2, 0, 3], 2 * B + B // 2 + 1             # two whole blocks and part of a third
    keys = torch.randn(T, H, D, generator=g).to(dtype)    # (T, H, D): the kernel's input layout
    values = torch.randn(T, H, D, generator=g).to(dtype)
    slots = torch.tensor([blocks[p // B] * B + p % B for p in range(T)], dtype=torch.long)
    theirs = torch.zeros(4, H, B, 2 * D, dtype=dtype)
    halves = theirs.view(4, H, 2 * B, D).chunk(2, dim=2)   # as vLLM's CPU backend hands the kernel its cache
    kernel(keys, values, halves[0], halves[1], slots, layout.isa)
    k, v = layout.read(theirs, blocks, 0, T)               # (1, H, T, D)
    ours = torch.zeros_like(theirs)
    layout.write(ours, blocks, 0, keys.permute(1, 0, 2).unsqueeze(0), values.permute(1, 0, 2).unsqueeze(0))
    exact = (torch.equal(k[0].permute(1, 0, 2), keys) and torch.equal(v[0].permute(1, 0, 2), values)
             and torch.equal(ours.view(torch.int16 if dtype.itemsize == 2 else torch.int32),
                             theirs.view(torch.int16 if dtype.itemsize == 2 else torch.int32)))
    if not exact:
        raise RuntimeUnsupportedError(
            f"this vLLM build packs its {layout.isa!r} KV blocks otherwise than the c2c connector reads them (checked "
            f"against its own cpu_attn_reshape_and_cache at start-up); the connector would corrupt caches, so it "
            f"refuses to start. Serve with --dtype float32 (the 'vec' kernel), or report the vLLM version")
