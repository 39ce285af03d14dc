"""Synthetic artifacts: random K/V of a made-up two-layer model, for tests and benchmarks (no model)."""

from __future__ import annotations

from dataclasses import replace

import torch

from c2c.artifact.codec import Artifact
from c2c.artifact.fingerprint import Fingerprint
from c2c.artifact.prefix import PrefixRef
from c2c.runtime.kvcache import KVCache


def synthetic_fingerprint(layers: int = 2, sliding: bool = False) -> Fingerprint:
    types = ("sliding_attention", "full_attention")[: layers] if sliding else ("full_attention",) * layers
    return Fingerprint(architecture="synthetic", num_layers=layers, layer_types=types, kv_heads=2, head_dim=8,
                       sliding_window=4 if sliding else None, rope='{"rope_theta":10000.0}', dtype="float32",
                       tokenizer_digest="1" * 64, weights_digest="2" * 64, model_name="synthetic")


def synthetic_cache(T: int = 6, *, start: int = 0, layers: int = 2, dtype=torch.float32, seed: int = 0,
                    sliding: bool = False) -> KVCache:
    g = torch.Generator().manual_seed(seed)
    windows = tuple(4 if (sliding and i == 0) else None for i in range(layers))
    shapes = [(1, 2, KVCache.layer_length(T, w), 8) for w in windows]
    keys = tuple(torch.randn(s, generator=g).to(dtype) for s in shapes)
    values = tuple(torch.randn(s, generator=g).to(dtype) for s in shapes)
    ids = tuple(range(100 + seed, 100 + seed + T))
    return KVCache(keys=keys, values=values, token_ids=ids, start=start, windows=windows)


def synthetic_artifact(T: int = 6, *, start: int = 0, dtype=torch.float32, seed: int = 0,
                       withhold: bool = False, sliding: bool = False) -> Artifact:
    cache = synthetic_cache(T, start=start, dtype=dtype, seed=seed, sliding=sliding)
    fp = replace(synthetic_fingerprint(sliding=sliding), dtype=str(dtype).replace("torch.", ""))
    plen = min(3, cache.end)
    prefix = PrefixRef.of(cache.token_ids[:plen]) if start == 0 else PrefixRef.of(list(range(plen)))
    return Artifact.build(cache, fingerprint=fp, prefix=prefix, withhold_tokens=withhold,
                          producer={"agent": "fuzz"}, labels={"span": "conclusion"})


def as_version_1(artifact: Artifact) -> bytes:
    """``artifact`` encoded in artifact format version 1 (one tensor digest, no chunks), as c2c wrote
    it before version 2; unsigned. For tests of what older stores and files hold."""
    from c2c.artifact.codec import _bytes, _digest_tensors, _ordered, _tensor_table  # lazy: the old format, for tests only

    names, tensors = _ordered(artifact.cache)
    table = _tensor_table(names, artifact.header.dtype, [t.shape for t in tensors])
    data = b"".join(_bytes(t) for t in tensors)
    header = replace(artifact.header, version=1, chunks=None, tensor_digest=_digest_tensors(table, data))
    return replace(artifact, header=header, signature=None).encode()
