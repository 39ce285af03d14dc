"""vLLM's paged KV memory on CPU, read and written as c2c's per-layer ``[1, kv_heads, T, head_dim]`` tensors.

vLLM's CPU attention (``CPU_ATTN``) keeps one tensor per layer of shape
``[num_blocks, kv_heads, block_size, 2 * head_dim]``. Each (block, head) region holds
``B * D`` keys, then ``B * D`` values (``B`` the block size, ``D`` the head dim), packed as
the kernel that vLLM picked for this instance wants them. One entry of :data:`PACKINGS` per
kernel: each half of the region is a view of the region, permuted into (position, dim) order
(:class:`Half`), so reads and writes move whole blocks (one gather or scatter of blocks per
layer, and one permuted copy per half; ``benchmarks/vllm_paged.py`` times them):

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


@dataclass(frozen=True)
class Half:
    """How one half of a (block, head) region (its ``B*D`` keys, or its ``B*D`` values) packs position ``p`` and
    dim ``d``: the region viewed as ``dims(B, D)`` and permuted by ``perm`` is ``(B, D)`` split into factors,
    major to minor, as ``(p factors..., d factors...)``, or ``(d factors..., p factors...)`` where ``dp``.

    Where the innermost factor is a pair the region keeps innermost too (``amx``: ``d % 2`` of keys,
    ``p % 2`` of values), 16-bit elements move as 32-bit pairs: the copy then runs on whole words."""

    dims: Callable[[int, int], tuple[int, ...]]
    perm: tuple[int, ...]
    dp: bool = False

    def _pairs(self, part: torch.Tensor, B: int, D: int) -> bool:
        dims = self.dims(B, D)
        return dims[-1] == 2 and self.perm[-1] == len(dims) - 1 and part.element_size() == 2

    def _region(self, part: torch.Tensor, B: int, D: int, pairs: bool) -> torch.Tensor:
        """``part`` ``(n, H, B*D)`` as a view ``(n, H, *factors)`` in natural order (its pairs as 32-bit words)."""
        dims, perm = self.dims(B, D), self.perm
        if pairs:
            part, dims, perm = part.view(torch.int32), dims[:-1], perm[:-1]
        return part.view(*part.shape[:2], *dims).permute(0, 1, *(2 + i for i in perm))

    def pack(self, part: torch.Tensor, nat: torch.Tensor, B: int, D: int) -> None:
        """Write K or V ``nat`` ``(H, n*B, D)`` into ``part`` ``(n, H, B*D)``."""
        H, n, pairs = nat.shape[0], part.shape[0], self._pairs(part, B, D)
        src = nat.reshape(H, n, B, D).to(part.dtype)
        if self.dp:
            src = src.transpose(2, 3)                                          # (H, n, D, B)
        dst = self._region(part, B, D, pairs)                                  # (n, H, *factors)
        if pairs:
            src = src.contiguous().view(torch.int32)
        dst.copy_(src.reshape(H, n, *dst.shape[2:]).transpose(0, 1))

    def unpack(self, part: torch.Tensor, B: int, D: int) -> torch.Tensor:
        """``part`` ``(n, H, B*D)`` as K or V ``(H, n*B, D)``, copied into a new tensor (never a view of ``part``:
        a write copies it back)."""
        n, H, pairs = part.shape[0], part.shape[1], self._pairs(part, B, D)
        src = self._region(part, B, D, pairs)                                  # (n, H, *factors)
        out = torch.empty((H, n, D, B) if self.dp else (H, n, B, D), dtype=part.dtype)
        (out.view(torch.int32) if pairs else out).view(H, n, *src.shape[2:]).copy_(src.transpose(0, 1))
        return (out.transpose(2, 3) if self.dp else out).reshape(H, n * B, D)


@dataclass(frozen=True)
class Packing:
    """One kernel's packing of a (block, head) region: its name in the fingerprint, its key and value halves,
    and what it needs of the block size, head dim and dtype."""

    name: str
    keys: Half
    values: Half
    multiple: int = 1                       # B and D must be multiples of it
    dtypes: tuple[torch.dtype, ...] = ()    # empty: any


# vec:  K[d, p], V[p, d];   amx:  K[p//16, d//2, p%16, d%2], V[d//16, p//2, d%16, p%2]
_VEC = Packing("k:DxB v:BxD", keys=Half(lambda B, D: (D, B), (1, 0)), values=Half(lambda B, D: (B, D), (0, 1)))
PACKINGS: dict[str, Packing] = {
    "vec": _VEC,
    "vec16": _VEC,
    "amx": Packing("k:B16xD2x16x2 v:D16xB2x16x2",
                   keys=Half(lambda B, D: (B // 16, D // 2, 16, 2), (0, 2, 1, 3)),      # (p1, d1, p0, d0)
                   values=Half(lambda B, D: (D // 16, B // 2, 16, 2), (0, 2, 1, 3), dp=True),  # (d1, p1, d0, p0)
                   multiple=32, dtypes=(torch.bfloat16,)),
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

    def require_layer(self, layer: torch.Tensor) -> None:
        """Refuse a layer tensor that is not ``[NB, H, B, 2D]``, contiguous, in a dtype the kernel packs."""
        want = (self.kv_heads, self.block_size, 2 * self.head_dim)
        if layer.dim() != 4 or tuple(layer.shape[1:]) != want or not layer.is_contiguous():
            raise RuntimeUnsupportedError(
                f"vLLM's KV layer is {tuple(layer.shape)} (contiguous: {layer.is_contiguous()}); the c2c connector "
                f"reads CPU_ATTN's [num_blocks, {want[0]}, {want[1]}, {want[2]}] layout only")
        if self.packing.dtypes and layer.dtype not in self.packing.dtypes:
            raise RuntimeUnsupportedError(f"vLLM's {self.isa!r} kernel packs {self.packing.dtypes}, not {layer.dtype}")

    def _blocks(self, block_ids: Sequence[int], start: int, end: int) -> tuple[int, torch.Tensor]:
        """(the first block's index in ``block_ids``, the ids of the blocks positions ``[start, end)`` touch).

        Raises:
            RuntimeUnsupportedError: ``block_ids`` hold fewer blocks than the positions need.
        """
        first, last = start // self.block_size, -(-end // self.block_size)
        if len(block_ids) < last:
            raise RuntimeUnsupportedError(f"positions {start}..{end} need {last} KV blocks of {self.block_size}; "
                                          f"vLLM gave the request {len(block_ids)}")
        return first, torch.as_tensor(list(block_ids[first:last]), dtype=torch.long)

    def _unpack(self, regions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Whole blocks ``(n, H, 2*B*D)`` as K and V ``(H, n*B, D)``, new tensors."""
        B, D = self.block_size, self.head_dim
        return (self.packing.keys.unpack(regions[:, :, :B * D], B, D),
                self.packing.values.unpack(regions[:, :, B * D:], B, D))

    def read(self, layer: torch.Tensor, block_ids: Sequence[int], start: int, end: int
             ) -> tuple[torch.Tensor, torch.Tensor]:
        """K and V of positions ``[start, end)``, each ``(1, H, T, D)``, copied out of the paged memory."""
        first, ids = self._blocks(block_ids, start, end)
        keys, values = self._unpack(self._flat(layer).index_select(0, ids))   # (H, n*B, D) each
        lo = start - first * self.block_size
        return keys[None, :, lo:lo + end - start].contiguous(), values[None, :, lo:lo + end - start].contiguous()

    def write(self, layer: torch.Tensor, block_ids: Sequence[int], start: int, keys: torch.Tensor,
              values: torch.Tensor) -> None:
        """Put ``keys``/``values`` ``(1, H, T, D)`` at positions ``[start, start + T)`` of the paged memory."""
        B, D, H, T = self.block_size, self.head_dim, self.kv_heads, keys.shape[2]
        if T == 0:
            return
        flat = self._flat(layer)
        first, ids = self._blocks(block_ids, start, start + T)
        n, lo = len(ids), start - first * B
        if lo == 0 and T == n * B:   # whole blocks: nothing of theirs to keep
            regions = torch.empty(n, H, 2 * B * D, dtype=layer.dtype)
            nat_k, nat_v = keys[0], values[0]                                  # (H, T, D)
        else:                        # a block begun or left part way: the positions outside [start, end) stay
            regions = flat.index_select(0, ids)                                # (n, H, 2BD)
            nat_k, nat_v = self._unpack(regions)
            nat_k[:, lo:lo + T], nat_v[:, lo:lo + T] = keys[0], values[0]
        self.packing.keys.pack(regions[:, :, :B * D], nat_k, B, D)
        self.packing.values.pack(regions[:, :, B * D:], nat_v, B, D)
        flat.index_copy_(0, ids, regions)

    def _flat(self, layer: torch.Tensor) -> torch.Tensor:
        return layer.view(layer.shape[0], self.kv_heads, 2 * self.block_size * self.head_dim)   # (NB, H, 2BD)


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
