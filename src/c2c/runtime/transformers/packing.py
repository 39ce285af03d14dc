"""bf16 linear layers held packed in oneDNN's blocked layout, for faster decode on a CPU.

Decode is bound by reading weights. PyTorch's own bf16 ``linear`` reads a dense weight at
~17 GB/s on this project's CPU; the same weight reordered once
(``mkldnn._reorder_linear_weight``) is read at ~23 GB/s.

NOTE: packing is a different kernel, and whether its products equal ``F.linear``'s bit for bit
depends on the CPU: on the AMD EPYC (AVX512-BF16, no AMX) they do (``tests/runtime/test_dtype.py``
checks every shape of a model), on an Intel Xeon with AMX-BF16 they were measured not to (other
tokens; issue #31). So packing is part of the runtime's numerics (:func:`linear_kernel`), which
the fingerprint names: a packed runtime's cache never passes as exact for a dense one's.
"""

from __future__ import annotations

import torch

from c2c.runtime.dtype import cpu_can_pack_bf16


class PackedLinear(torch.nn.Module):
    """An ``nn.Linear`` whose weight is held in oneDNN's blocked layout (bf16 on CPU only).

    The dense weight is freed; :meth:`dense` rebuilds the ``nn.Linear`` (for LoRA adapters
    and gradients, which need it).
    """

    def __init__(self, linear: torch.nn.Linear):
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.packed = torch.ops.mkldnn._reorder_linear_weight(linear.weight.detach(), 1)  # (out, in), blocked
        self.bias = linear.bias

    def forward(self, x: torch.Tensor) -> torch.Tensor:   # (..., in) -> (..., out)
        return torch.ops.mkldnn._linear_pointwise(x, self.packed, self.bias, "none", [], "")

    def dense(self) -> torch.nn.Linear:
        lin = torch.nn.Linear(self.in_features, self.out_features, bias=self.bias is not None, device="meta")
        lin.weight = torch.nn.Parameter(self.packed.to_dense(), requires_grad=False)
        lin.bias = self.bias
        return lin


def can_pack(model) -> bool:
    """bf16 weights on a CPU that oneDNN can pack them for, in a PyTorch build with the packed-linear ops."""
    p = next(model.parameters())
    return (p.dtype == torch.bfloat16 and p.device.type == "cpu" and cpu_can_pack_bf16()
            and torch.backends.mkldnn.is_available()
            and hasattr(torch.ops.mkldnn, "_reorder_linear_weight")
            and hasattr(torch.ops.mkldnn, "_linear_pointwise"))


def replace_modules(model, pick, make) -> int:
    """Replace every submodule ``m`` of ``model`` for which ``pick(m)`` holds by ``make(m)``; returns how many."""
    n = 0
    with torch.no_grad():
        for parent in list(model.modules()):
            for name, child in list(parent.named_children()):
                if pick(child):
                    setattr(parent, name, make(child))
                    n += 1
    return n


def pack_linears(model) -> int:
    """Replace every ``nn.Linear`` of ``model`` (decoder and LM head) by a :class:`PackedLinear`.

    Returns how many were packed (0 when :func:`can_pack` says no). A tied LM head gets
    its own packed copy; the embedding keeps the dense table.
    """
    if not can_pack(model):
        return 0
    return replace_modules(model, lambda m: type(m) is torch.nn.Linear, PackedLinear)


def unpack_linears(model) -> int:
    """Undo :func:`pack_linears` (dense ``nn.Linear`` again, bit-identical weights). Returns how many."""
    return replace_modules(model, lambda m: isinstance(m, PackedLinear), lambda m: m.dense())


def linear_kernel(packed: int) -> str:
    """The linear layers' kernel, for the numerics: ``onednn-packed`` or ``dense`` (PyTorch's ``linear``)."""
    return "onednn-packed" if packed else "dense"
