"""Roles as LoRA adapters on one base model: the adapter files, and the calls every engine answers.

A team keeps one base model and gives each role a small LoRA adapter that can be
attached and detached. The adapter changes the K/V the model computes, so the
runtime's fingerprint records the active adapter by name and content digest: a
cache made under adapter X never passes silently for one made under Y.

Adapters are stored as PEFT directories (``adapter_config.json`` +
``adapter_model.safetensors``); :func:`adapter_digest` refuses pickled ``.bin`` adapters.
The engine does the work (:meth:`~c2c.runtime.protocol.Adapters.attach_adapter` and its
siblings): the transformers engine through PEFT; an engine without adapters raises
:class:`~c2c.errors.RuntimeUnsupportedError`.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Sequence

from c2c.errors import ModelError
from c2c.runtime.protocol import Adapters, Runtime, require


def adapter_digest(path: Path) -> str:
    """sha256 over the adapter's config and safetensors weights.

    Raises:
        ModelError: not a safetensors LoRA adapter directory.
    """
    path = Path(path)
    weights = path / "adapter_model.safetensors"
    config = path / "adapter_config.json"
    if not weights.is_file() or not config.is_file():
        if (path / "adapter_model.bin").exists():
            raise ModelError(f"{path} holds a pickled adapter (.bin); c2c loads only safetensors adapters")
        raise ModelError(f"{path} is not a LoRA adapter directory (adapter_config.json + adapter_model.safetensors)")
    h = hashlib.sha256(config.read_bytes())
    h.update(weights.read_bytes())
    return h.hexdigest()


def attach(runtime: Runtime, path: str | Path, name: str) -> None:
    """Load (once) and activate the adapter at ``path`` under ``name``."""
    require(runtime, Adapters).attach_adapter(Path(path), name)


def detach(runtime: Runtime) -> None:
    """Run the plain base model again; loaded adapters stay in memory for a cheap re-attach. An engine without
    adapters always runs its base model: nothing to do."""
    if isinstance(runtime, Adapters):
        runtime.detach_adapter()


def train(runtime: Runtime, texts: Sequence[str], out_dir: str | Path, *, steps: int = 60, rank: int = 8,
          lr: float = 3e-4, max_tokens: int = 128, seed: int = 0, progress: bool = True,
          eval_texts: Sequence[str] = ()) -> dict:
    """Train a small LoRA role adapter on ``texts`` (next-token loss), save it, and return the loss curve.

    Only the adapter trains; the base stays frozen, and the runtime is left as the plain base
    model. With ``eval_texts`` (texts it does not train on) the curve also holds their mean loss
    before and after training (``eval_before``, ``eval_after``). The curve is saved beside the
    adapter as ``c2c-training.json``.
    """
    out_dir = Path(out_dir)
    curve = require(runtime, Adapters).train_adapter(texts, out_dir, steps=steps, rank=rank, lr=lr, max_tokens=max_tokens, seed=seed,
                                  progress=progress, eval_texts=eval_texts)
    (out_dir / "c2c-training.json").write_text(json.dumps(curve))
    return curve
