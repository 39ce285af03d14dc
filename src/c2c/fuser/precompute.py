"""Precompute the Sharer's aligned caches once, as fp16 safetensors shards on disk.

The Sharer is frozen, so its cache of a training context never changes: we run
it once per example, align it to the Receiver's tokens, keep only the layers
the fuser maps, and store it. Training then never loads the Sharer (for a 1.5B
Sharer that saves 3x the Receiver's forward per example, per epoch).

Layout of a store directory (its name is a digest of everything that decides
its contents, so a changed model, tokenizer, layer map or data set gets a new one)::

    meta.json                 {"key", "n", "shard_size", "layer_map", "sharer", "receiver_tokenizer"}
    shard_00000.safetensors   "{i}.ids" int64 (T_r,), "{i}.k{j}" / "{i}.v{j}" fp16 [H_s, T_r, D_s]

Shards are written atomically and skipped when present, so an interrupted
precompute resumes where it stopped.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Sequence

import torch
from safetensors import safe_open
from safetensors.torch import save as save_bytes
from tqdm import tqdm

from c2c._io import write_atomic
from c2c.canon import canonical_json, sha256_hex
from c2c.errors import FuserCheckpointError, FuserDataError
from c2c.fuser.align import LayerMap, align_tokens, render
from c2c.fuser.data import Example
from c2c.fuser.infer import aligned_sharer

ALIGN_VERSION = 2  # bump when alignment changes what is stored


def store_key(*, sharer, receiver, layer_map: LayerMap, examples: Sequence[Example]) -> str:
    ex = sha256_hex(canonical_json([[list(map(list, e.messages)), e.response] for e in examples]))
    return sha256_hex(canonical_json({
        "align": ALIGN_VERSION, "sharer": sharer.name, "sharer_weights": sharer.weights_digest,
        "sharer_tokenizer": sharer.tokenizer_digest, "receiver_tokenizer": receiver.tokenizer_digest,
        "receiver_windows": list(map(str, receiver.facts.windows)), "layer_map": [list(p) for p in layer_map],
        "examples": ex}))[:20]


class SharerStore:
    """Read access to a precomputed store: ``get(i)`` -> (receiver ids, keys, values)."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        try:
            self.meta = json.loads((self.path / "meta.json").read_text())
        except (OSError, ValueError) as e:
            raise FuserCheckpointError(f"{self.path} is not a complete sharer-cache store: {e}") from None
        self.n, self.shard_size = int(self.meta["n"]), int(self.meta["shard_size"])
        self.layers = len(self.meta["layer_map"])
        self._open: tuple[int, object] | None = None

    def _shard(self, s: int):
        if self._open is None or self._open[0] != s:
            self._open = (s, safe_open(str(self.path / f"shard_{s:05d}.safetensors"), framework="pt"))
        return self._open[1]

    def get(self, i: int, device: str | torch.device = "cpu", dtype: torch.dtype = torch.float32
            ) -> tuple[list[int], list[torch.Tensor], list[torch.Tensor]]:
        """Example ``i``: its Receiver token ids and the aligned Sharer K/V, ``[1, H_s, T_r, D_s]`` each."""
        if not 0 <= i < self.n:
            raise IndexError(i)
        f = self._shard(i // self.shard_size)
        ids = f.get_tensor(f"{i}.ids").tolist()
        keys = [f.get_tensor(f"{i}.k{j}").to(device=device, dtype=dtype)[None] for j in range(self.layers)]
        values = [f.get_tensor(f"{i}.v{j}").to(device=device, dtype=dtype)[None] for j in range(self.layers)]
        return ids, keys, values


def precompute(examples: Sequence[Example], *, sharer, receiver, layer_map: LayerMap, root: str | Path,
               shard_size: int = 64, progress: bool = True) -> SharerStore:
    """Build (or finish) the store for ``examples`` under ``root`` and return it."""
    key = store_key(sharer=sharer, receiver=receiver, layer_map=layer_map, examples=examples)
    path = Path(root) / key
    path.mkdir(parents=True, exist_ok=True)
    if (path / "meta.json").is_file():
        return SharerStore(path)
    n_shards = (len(examples) + shard_size - 1) // shard_size
    todo = [s for s in range(n_shards) if not (path / f"shard_{s:05d}.safetensors").is_file()]
    with torch.inference_mode(), tqdm(total=len(examples), initial=len(examples) - sum(
            min(shard_size, len(examples) - s * shard_size) for s in todo), desc=f"precompute {sharer.name}",
            unit="ex", disable=not progress) as bar:
        for s in todo:
            tensors: dict[str, torch.Tensor] = {}
            for i in range(s * shard_size, min((s + 1) * shard_size, len(examples))):
                msgs = examples[i].message_dicts()
                r, sh = render(receiver, msgs), render(sharer, msgs)
                _, cache = sharer.prefill(list(sh.ids))
                keys, values = aligned_sharer(cache, align_tokens(r, sh), layer_map, receiver.facts.windows)
                tensors[f"{i}.ids"] = torch.tensor(r.ids, dtype=torch.int64)
                for j, (k, v) in enumerate(zip(keys, values)):
                    tensors[f"{i}.k{j}"] = k[0].to("cpu", torch.float16).contiguous()  # [H_s, T_r, D_s]
                    tensors[f"{i}.v{j}"] = v[0].to("cpu", torch.float16).contiguous()
                bar.update(1)
            write_atomic(path / f"shard_{s:05d}.safetensors", save_bytes(tensors), error=FuserDataError)
    meta = {"key": key, "n": len(examples), "shard_size": shard_size, "layer_map": [list(p) for p in layer_map],
            "sharer": sharer.name, "receiver_tokenizer": receiver.tokenizer_digest}
    write_atomic(path / "meta.json", json.dumps(meta, indent=2).encode(), error=FuserDataError)
    return SharerStore(path)
