"""int8 decode: the ``int8`` dtype, whose decode steps read the linear layers' weights as int8.

Decode of a small model is bound by reading its weights once per token. In ``int8`` every
linear layer (decoder and LM head) keeps two copies:

- the bf16 (or fp32) weight, packed for oneDNN as in :mod:`c2c.runtime.transformers.packing`,
  for every forward of more than one token (prefill, a turn's extension): the K/V a prefill
  writes are the bf16 runtime's, bit for bit;
- an int8 copy, one scale per output channel, prepacked for PyTorch's x86 quantized engine
  (fbgemm under ``torch.ops.quantized.linear_dynamic``), for a one-token step: the token's
  activations are quantized to int8 on the fly (one scale for the row), and the product runs
  on the CPU's int8 dot products. With VNNI (``avx512_vnni`` or ``avx_vnni``: both CPU kinds of
  this project) activations keep all 8 bits; without it fbgemm's int16 sums could saturate,
  so they are quantized to 7 (``reduce_range``) and the numerics say ``int8-decode-7bit``.

The LM head picks the token, and its int8 logits alone cost the most agreement with bf16 for the
least time (measured on prompts of another seed than the one ``benchmarks/int8_quality.py``
reports). So a one-token step's head runs in two stages (:class:`Int8DecodeHead`): the int8 copy
scores the whole vocabulary, then the ``TOP_K`` best of those are scored again from the full
weights, which the head keeps (the tied embedding's, where the model ties them). The token is
picked among exact logits; only the logits outside the top ``TOP_K``, which greedy decoding never
picks, stay int8's. A prefill's last row (the one whose logits pick its first token) goes through
the same two stages. Sibling layers that read the same row (q, k and v; gate and up) make one int8
product between them (:class:`Shared`), bit for bit what they would make apart, in one call instead of
three (or two). A one-token step reads about half of bf16's bytes. On the 2-core AMD EPYC the two-stage
head took a 0.5B model's step from 39 to 35 ms, and the shared products to 32.5 (bf16: 52).
One row is quantized on its own, so a token's result never depends on another token's. The
cache it makes is not the bf16 runtime's: the numerics say ``linear-onednn-packed+int8-decode``
(the fingerprint names it), so an int8 cache never passes as exact for a bf16 one.

NOTE: ``torch.ops.quantized`` is PyTorch's own, in the pinned build; PyTorch marks the
quantized tensor constructors deprecated (torchao is its successor). The kernels were picked
by measurement: on the 2-core AMD EPYC the stack of a 0.5B model's linears ran 2.6x faster
than bf16 packed, where ``aten._weight_int8pack_mm`` (int8 weights, bf16 products) ran 1.15x
faster.
"""

from __future__ import annotations

import threading
import warnings

import torch

from c2c.errors import RuntimeUnsupportedError
from c2c.runtime.dtype import cpu_flags
from c2c.runtime.transformers import packing

ENGINES = ("x86", "fbgemm")   # PyTorch's quantized engines with a fast int8 dynamic linear on x86
VNNI_FLAGS = ("avx512_vnni", "avx_vnni")
HEAD = "lm_head"              # the model's attribute holding its LM head
TOP_K = 8                     # the head's candidates re-scored from the full weights in a one-token step
SIBLINGS = (("q_proj", "k_proj", "v_proj"), ("gate_proj", "up_proj"))   # layers of one module that read one row


def reduce_range() -> bool:
    """Whether activations must be quantized to 7 bits here (no VNNI: fbgemm's int16 sums could saturate)."""
    return not any(f in cpu_flags() for f in VNNI_FLAGS)


def kernel_name() -> str:
    """What the numerics add for int8 decode on this CPU."""
    return "int8-decode-7bit" if reduce_range() else "int8-decode"


def available() -> str | None:
    """Why ``int8`` cannot run here, or None when it can."""
    if "quantized" not in dir(torch.ops) or not hasattr(torch.ops.quantized, "linear_dynamic"):
        return "this PyTorch build has no quantized linear kernels"
    if torch.backends.quantized.engine not in ENGINES:
        return (f"PyTorch's quantized engine is {torch.backends.quantized.engine!r}; int8 needs one of {ENGINES} "
                "(an x86 CPU)")
    return None


def _quantized(weight: torch.Tensor, bias: torch.Tensor | None):
    """``weight`` (out, in) as int8 with one scale per output channel, prepacked with ``bias``."""
    w = weight.detach().float()                                   # (out, in)
    scale = (w.abs().amax(dim=1) / 127).clamp(min=1e-12)          # (out,)
    with warnings.catch_warnings():  # the quantized tensor constructors are marked deprecated (see NOTE)
        warnings.simplefilter("ignore")
        q = torch.quantize_per_channel(w, scale.double(), torch.zeros_like(scale, dtype=torch.long), 0, torch.qint8)
    return torch.ops.quantized.linear_prepack(q, None if bias is None else bias.detach().float())


class Int8DecodeLinear(torch.nn.Module):
    """A linear layer that runs a one-row input on int8 weights and anything larger on its full weights.

    Sibling layers that read the same row (:data:`SIBLINGS`) share one int8 product (:class:`Shared`).
    """

    def __init__(self, linear: torch.nn.Module):
        super().__init__()
        dense = linear.dense() if isinstance(linear, packing.PackedLinear) else linear
        self.in_features, self.out_features = dense.in_features, dense.out_features
        self.int8 = _quantized(dense.weight, dense.bias)   # None once it shares a product (Shared)
        self.full = linear   # PackedLinear or nn.Linear: prefill's kernel
        self.reduce_range = reduce_range()
        self.shared: Shared | None = None   # with its siblings: the product, this layer's columns and place
        self.columns = slice(0, self.out_features)
        self.sibling = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:   # (..., in) -> (..., out)
        if x.numel() != self.in_features:
            return self.full(x)
        if self.shared is not None:
            y = self.shared.product(x, self.sibling)[:, self.columns]                           # (1, out), x's dtype
        else:
            y = torch.ops.quantized.linear_dynamic(x.reshape(1, -1).float(), self.int8,
                                                   self.reduce_range).to(x.dtype)               # (1, out)
        return y.reshape(*x.shape[:-1], self.out_features)

    def dense(self) -> torch.nn.Linear:
        return self.full.dense() if isinstance(self.full, packing.PackedLinear) else self.full


class Shared:
    """One int8 product for sibling layers that read the same row: a decode step's q, k and v projections, or
    its gate and up projections. Their weights are stacked into one int8 matrix, so a step makes one call
    where it made three (or two); each layer takes its columns. The products are the separate layers'
    bit for bit: the row is quantized once either way, each output channel keeps its own scale and sums
    in integers (``tests/runtime/test_int8.py`` checks it).

    The first sibling to see a row computes the product; the others, called with that very tensor (not a
    copy) before the round is over, take their columns of it. A round ends once every sibling has taken its
    columns, and the row is let go; a sibling called with another row, or twice in a round, computes again.
    """

    def __init__(self, members: list[Int8DecodeLinear]):
        dense = [m.dense() for m in members]
        bias = [d.bias.detach() if d.bias is not None else torch.zeros(d.out_features) for d in dense]
        self.int8 = _quantized(torch.cat([d.weight.detach().float() for d in dense]),
                               torch.cat([b.float() for b in bias]) if any(d.bias is not None for d in dense) else None)
        self.reduce_range = members[0].reduce_range
        self.members = len(members)
        self._row: torch.Tensor | None = None
        self._y: torch.Tensor | None = None
        self._waiting: set[int] = set()   # siblings of this round that have not taken their columns yet
        self._lock = threading.Lock()
        at = 0
        for i, m in enumerate(members):
            m.shared, m.columns, m.int8, m.sibling = self, slice(at, at + m.out_features), None, i
            at += m.out_features

    def product(self, x: torch.Tensor, sibling: int) -> torch.Tensor:   # (..., in), one row -> (1, outs), x's dtype
        with self._lock:   # two threads on one model never take each other's rows
            if x is self._row and sibling in self._waiting:
                self._waiting.discard(sibling)
            else:   # a new round; rounded to x's dtype once for every sibling (elementwise: as each would round)
                self._y = torch.ops.quantized.linear_dynamic(x.reshape(1, -1).float(), self.int8,
                                                             self.reduce_range).to(x.dtype)
                self._row, self._waiting = x, set(range(self.members)) - {sibling}
            y = self._y
            if not self._waiting:
                self._row = self._y = None
            return y


def share_siblings(model) -> int:
    """Join the int8 layers named together in :data:`SIBLINGS` under each module into one product; returns how
    many groups."""
    n = 0
    for module in model.modules():
        for names in SIBLINGS:
            members = [getattr(module, name, None) for name in names]
            if all(type(m) is Int8DecodeLinear for m in members) and len({m.in_features for m in members}) == 1:
                Shared(members)
                n += 1
    return n


class Int8DecodeHead(Int8DecodeLinear):
    """The LM head: a one-row input is scored on int8 weights, then its ``TOP_K`` best again on the full ones."""

    def __init__(self, linear: torch.nn.Module, weight: torch.Tensor):
        super().__init__(linear)
        self.weight = weight   # (vocab, in): the full weights, dense (the tied embedding's where tied)

    def forward(self, x: torch.Tensor) -> torch.Tensor:   # (..., in) -> (..., vocab)
        if x.numel() != self.in_features:
            return self.full(x)
        row = x.reshape(1, -1)
        y = torch.ops.quantized.linear_dynamic(row.float(), self.int8, self.reduce_range)   # (1, vocab), fp32
        best = y[0].topk(TOP_K).indices                                                       # (TOP_K,)
        bias = self.full.bias
        exact = torch.nn.functional.linear(row.float(), self.weight[best].float(),
                                           None if bias is None else bias[best].float())     # (1, TOP_K)
        y[0, best] = exact[0]
        return y.to(x.dtype).reshape(*x.shape[:-1], self.out_features)


def quantize_linears(model) -> int:
    """Give every linear layer of ``model`` (plain or packed) an int8 copy for one-token steps.

    The LM head keeps its full weights dense beside (:class:`Int8DecodeHead`): the tied input
    embedding's, where the model ties them, else a copy. Returns how many layers. Raises
    :class:`RuntimeUnsupportedError` naming the way out where the CPU or the build cannot run it.
    """
    why = available()
    if why is not None:
        raise RuntimeUnsupportedError(f"dtype int8 cannot run here: {why}; use --dtype bfloat16 or float32")
    head = getattr(model, HEAD, None)
    n = packing.replace_modules(   # the body first: the head's wrapper below holds its layer as a child
        model, lambda m: m is not head and (type(m) is torch.nn.Linear or isinstance(m, packing.PackedLinear)),
        Int8DecodeLinear)
    share_siblings(model)
    if isinstance(head, (torch.nn.Linear, packing.PackedLinear)):
        embed = model.get_input_embeddings()
        tied = getattr(model.config, "tie_word_embeddings", False) and embed is not None \
            and tuple(embed.weight.shape) == (head.out_features, head.in_features)
        dense = embed.weight if tied else (head.dense() if isinstance(head, packing.PackedLinear) else head).weight
        setattr(model, HEAD, Int8DecodeHead(head, dense.detach()))
        n += 1
    return n


def dequantize_linears(model) -> int:
    """Drop the int8 copies (the full weights stay as they were). Returns how many."""
    return packing.replace_modules(model, lambda m: isinstance(m, Int8DecodeLinear), lambda m: m.full)
