"""A verified commit's K/V, handed from the scheduler to the worker without hashing on the forward path.

The scheduler side verifies a commit (signature, every chunk's digest, the gate's rulings)
on its own thread. It then stages only the K/V the request may load, as plain tensors in a
safetensors file (no pickle), 0600 in the instance's private run directory. The worker reads
them just before the forward pass that needs them, with a consistency check (the commit id,
the layer count, the shapes) and no second hash of the commit: the bytes were checked once,
off the engine loop, by the process that wrote the file, and only the instance's own user
can write there.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load as load_bytes
from safetensors.torch import save as save_bytes

from c2c._io import write_atomic
from c2c.errors import ConfigError, StoreError
from c2c.runtime.kvcache import KVCache


def stage(path: str | Path, commit: str, cache: KVCache, tokens: int) -> None:
    """Write the first ``tokens`` positions of ``cache`` (verified, of ``commit``) for the worker."""
    tensors = {}
    for i, (k, v) in enumerate(zip(cache.keys, cache.values)):
        tensors[f"k.{i}"] = k[:, :, :tokens].contiguous()   # (1, H, tokens, D)
        tensors[f"v.{i}"] = v[:, :, :tokens].contiguous()
    data = save_bytes(tensors, metadata={"commit": commit, "layers": str(len(cache.keys)), "tokens": str(tokens)})
    write_atomic(path, data, durable=False, error=StoreError)


def unstage(path: str | Path, commit: str, *, layers: int, end: int) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """(keys, values) per layer, each ``(1, H, T, D)`` with ``T >= end``, of the file :func:`stage` wrote for
    ``commit``; the file is removed.

    Raises:
        ConfigError: it is not that commit's, or its layers or lengths are not what the worker loads.
    """
    path = Path(path)
    try:
        data = path.read_bytes()
    except OSError as e:
        raise ConfigError(f"the staged K/V of {commit[:12]} are gone: {e}") from e
    finally:
        path.unlink(missing_ok=True)
    try:
        n = struct.unpack("<Q", data[:8])[0]                       # safetensors: 8-byte header length, then JSON
        meta = json.loads(data[8:8 + n]).get("__metadata__") or {}
        tensors = load_bytes(data)
    except (SafetensorError, ValueError, struct.error) as e:
        raise ConfigError(f"the staged K/V of {commit[:12]} are unreadable: {e}") from e
    if meta.get("commit") != commit or meta.get("layers") != str(layers):
        raise ConfigError("the staged K/V are not the commit the scheduler verified")
    keys = [tensors.get(f"k.{i}") for i in range(layers)]
    values = [tensors.get(f"v.{i}") for i in range(layers)]
    if any(t is None or t.dim() != 4 or t.shape[2] < end for t in keys + values):
        raise ConfigError(f"the staged K/V of {commit[:12]} do not hold positions up to {end}")
    return keys, values
