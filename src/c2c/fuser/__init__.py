"""Heterogeneous C2C: a trained cache fuser from a Sharer model into a Receiver model.

Modules, one idea each:

- :mod:`~c2c.fuser.align`: token alignment (Receiver tokens are the base; chat
  templates aligned section by section) and layer maps (terminal by default).
- :mod:`~c2c.fuser.model`: the per-layer K/V projectors, head weights and gates.
- :mod:`~c2c.fuser.checkpoint`: safetensors + JSON checkpoints, never pickle.
- :mod:`~c2c.fuser.data`: training sources, multiple-choice loaders, prompts.
- :mod:`~c2c.fuser.precompute`: the Sharer's aligned caches, once, fp16 on disk.
- :mod:`~c2c.fuser.train`: the resumable training loop.
- :mod:`~c2c.fuser.infer`: fuse one or more Sharers, generate, export an artifact.

A fuser is evaluated by :mod:`c2c.bench.harness` (``c2c fuser eval``), which scores every
condition as lm-evaluation-harness scores, with causal controls and per-question records.
"""

from c2c.fuser.align import align_tokens, layer_map, render
from c2c.fuser.checkpoint import FuserMeta
from c2c.fuser.checkpoint import load as load_fuser
from c2c.fuser.checkpoint import save as save_fuser
from c2c.fuser.infer import FusedReceiver
from c2c.fuser.model import CacheFuser, FuserConfig
from c2c.fuser.train import TrainConfig, Trainer

__all__ = [
    "CacheFuser", "FusedReceiver", "FuserConfig", "FuserMeta",
    "TrainConfig", "Trainer", "align_tokens", "layer_map", "load_fuser", "render", "save_fuser",
]
