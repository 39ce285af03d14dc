"""Cheap test artifacts: random KV tensors and a hand-made fingerprint, no model."""

from __future__ import annotations

from typing import Sequence

import torch

from c2c.artifact import Artifact
from c2c.fingerprint import Fingerprint
from c2c.prefix import PrefixRef
from c2c.runtime.kvcache import KVCache

LAYERS, KV_HEADS, HEAD_DIM = 2, 2, 8


def fingerprint(num_layers: int = LAYERS, kv_heads: int = KV_HEADS, head_dim: int = HEAD_DIM) -> Fingerprint:
    return Fingerprint(architecture="llama", num_layers=num_layers, layer_types=("full_attention",) * num_layers,
                       kv_heads=kv_heads, head_dim=head_dim, sliding_window=None, rope='{"theta":10000}',
                       dtype="float32", tokenizer_digest="a" * 64, weights_digest="b" * 64, model_name="tiny-test")


def make_artifact(seed: int, *, seq: int = 8, parents: Sequence[str] = (), agent: str = "tester",
                  num_layers: int = LAYERS, kv_heads: int = KV_HEADS, head_dim: int = HEAD_DIM) -> Artifact:
    """A valid artifact whose bytes (and so id) differ for every ``seed``."""
    g = torch.Generator().manual_seed(seed)
    tokens = [int(t) for t in torch.randint(0, 32000, (seq,), generator=g)]
    # each layer: keys and values (1, kv_heads, seq, head_dim)
    keys = tuple(torch.randn(1, kv_heads, seq, head_dim, generator=g) for _ in range(num_layers))
    values = tuple(torch.randn(1, kv_heads, seq, head_dim, generator=g) for _ in range(num_layers))
    cache = KVCache(keys=keys, values=values, token_ids=tuple(tokens))
    return Artifact.build(cache, fingerprint=fingerprint(num_layers, kv_heads, head_dim),
                          prefix=PrefixRef.of(tokens[: min(4, seq)]), producer={"agent": agent},
                          parents=tuple(parents), labels={"seed": str(seed)})


def artifact_bytes(seed: int, **kw) -> bytes:
    return make_artifact(seed, **kw).encode()


def sized_artifact_bytes(seed: int, nbytes: int) -> bytes:
    """An artifact of about ``nbytes`` (float32, 2 layers x 4 heads x 64 dims)."""
    seq = max(1, nbytes // (2 * 2 * 4 * 64 * 4))
    return artifact_bytes(seed, seq=seq, kv_heads=4, head_dim=64)
