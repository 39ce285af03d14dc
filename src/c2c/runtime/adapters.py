"""Roles as LoRA adapters (PEFT) on one base model.

A team keeps one base model and gives each role a small LoRA adapter that can be
attached and detached. The adapter changes the K/V the model computes, so the
runtime's fingerprint records the active adapter by name and content digest: a
cache made under adapter X never passes silently for one made under Y.

Adapters are stored as PEFT directories (``adapter_config.json`` +
``adapter_model.safetensors``); this module refuses pickled ``.bin`` adapters.
"""

from __future__ import annotations

import hashlib
import json
import math
import random
from pathlib import Path
from typing import Sequence

import torch
from tqdm import tqdm

from c2c.errors import ConfigError, ModelError


def adapter_digest(path: Path) -> str:
    """sha256 over the adapter's config and safetensors weights."""
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


def attach(runtime, path: str | Path, name: str) -> None:
    """Load (once) and activate the adapter at ``path`` under ``name``."""
    from peft import PeftModel  # lazy: peft is the optional `lora` extra

    path = Path(path)
    digest = adapter_digest(path)
    runtime.ensure_dense()  # PEFT wraps nn.Linear layers
    if not hasattr(runtime.model, "peft_config"):
        runtime.model = PeftModel.from_pretrained(runtime.model, str(path), adapter_name=name, is_trainable=False)
    elif name not in runtime.model.peft_config:
        runtime.model.load_adapter(str(path), adapter_name=name, is_trainable=False)
    runtime.model.base_model.enable_adapter_layers()
    runtime.model.set_adapter(name)
    runtime.model.eval()
    runtime.adapters = (f"{name}@{digest[:16]}",)


def detach(runtime) -> None:
    """Run the plain base model again; loaded adapters stay in memory for a cheap re-attach."""
    if hasattr(runtime.model, "peft_config"):
        runtime.model.base_model.disable_adapter_layers()
    runtime.adapters = ()


def train(runtime, texts: Sequence[str], out_dir: str | Path, *, steps: int = 60, rank: int = 8,
          lr: float = 3e-4, max_tokens: int = 128, seed: int = 0, progress: bool = True,
          eval_texts: Sequence[str] = ()) -> dict:
    """Train a small LoRA role adapter on ``texts`` (next-token loss) and save it.

    Only the adapter trains; the base stays frozen. Returns the loss curve; with ``eval_texts``
    (texts it does not train on) also their mean loss before and after training
    (``eval_before``, ``eval_after``): one example per step makes the curve itself noisy.
    """
    from peft import LoraConfig, get_peft_model  # lazy: peft is the optional `lora` extra

    if not texts:
        raise ConfigError("no training texts")
    random.seed(seed)
    torch.manual_seed(seed)
    cfg = LoraConfig(r=rank, lora_alpha=2 * rank, lora_dropout=0.0,
                     target_modules=["q_proj", "k_proj", "v_proj", "o_proj"], task_type="CAUSAL_LM")
    runtime.ensure_dense()  # PEFT wraps nn.Linear layers, and training needs their gradients
    model = get_peft_model(runtime.model, cfg)

    def held_out() -> float:
        model.eval()
        with torch.no_grad():
            xs = [runtime.encode(t)[:max_tokens] for t in eval_texts]
            out = [model(input_ids=torch.tensor([x], device=runtime.device), labels=torch.tensor(
                [x], device=runtime.device)).loss.item() for x in xs if len(x) >= 4]
        model.train()
        return _mean(out)

    eval_before = held_out() if eval_texts else math.nan
    model.train()
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=lr)
    losses = []
    order = list(range(len(texts)))
    for step in tqdm(range(steps), desc="training LoRA role", disable=not progress):
        if step % len(order) == 0:
            random.shuffle(order)
        ids = runtime.encode(texts[order[step % len(order)]])[:max_tokens]
        if len(ids) < 4:
            continue
        x = torch.tensor([ids], device=runtime.device)  # (1, T)
        loss = model(input_ids=x, labels=x).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    eval_after = held_out() if eval_texts else math.nan
    out_dir = Path(out_dir)
    model.save_pretrained(str(out_dir), safe_serialization=True)
    model.eval()
    runtime.model = model.unload()  # leave the runtime as the plain base model
    q = max(1, len(losses) // 4)
    curve = {"steps": steps, "first_loss": _mean(losses[:q]), "last_loss": _mean(losses[-q:]), "losses": losses}
    if eval_texts:
        curve |= {"eval_before": eval_before, "eval_after": eval_after, "eval_texts": len(eval_texts)}
    (out_dir / "c2c-training.json").write_text(json.dumps(curve))
    return curve


def _mean(xs: list[float]) -> float:
    return sum(xs) / len(xs) if xs else math.nan
