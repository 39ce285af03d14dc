"""LoRA role adapters on a transformers model, through PEFT (the optional ``lora`` extra).

Each function takes the model and returns the model the runtime holds from then on
(PEFT wraps it); :class:`~c2c.runtime.transformers.runtime.TransformersRuntime` keeps it.
The adapter files' format and digest are engine-independent: :mod:`c2c.runtime.adapters`.
"""

from __future__ import annotations

import math
import random
from pathlib import Path
from typing import Callable, Sequence

import torch
from tqdm import tqdm

from c2c.errors import ConfigError


def attach(model, path: Path, name: str):
    """``model`` with the adapter at ``path`` loaded (once) under ``name`` and active."""
    from peft import PeftModel  # lazy: peft is the optional `lora` extra

    if not hasattr(model, "peft_config"):
        model = PeftModel.from_pretrained(model, str(path), adapter_name=name, is_trainable=False)
    elif name not in model.peft_config:
        model.load_adapter(str(path), adapter_name=name, is_trainable=False)
    model.base_model.enable_adapter_layers()
    model.set_adapter(name)
    model.eval()
    return model


def detach(model):
    """``model`` running as the plain base model; loaded adapters stay in memory for a cheap re-attach."""
    if hasattr(model, "peft_config"):
        model.base_model.disable_adapter_layers()
    return model


def train(model, encode: Callable[[str], list[int]], texts: Sequence[str], out_dir: Path, *, steps: int,
          rank: int, lr: float, max_tokens: int, seed: int, progress: bool,
          eval_texts: Sequence[str]) -> tuple[object, dict]:
    """Train a LoRA adapter of ``rank`` on ``texts`` (next-token loss), save it to ``out_dir``.

    Only the adapter trains; the base stays frozen. Returns (the plain base model again, the loss
    curve); with ``eval_texts`` (texts it does not train on) the curve also holds their mean loss
    before and after training (``eval_before``, ``eval_after``): one example per step makes the
    curve itself noisy.
    """
    from peft import LoraConfig, get_peft_model  # lazy: peft is the optional `lora` extra

    if not texts:
        raise ConfigError("no training texts")
    random.seed(seed)
    torch.manual_seed(seed)
    device = next(model.parameters()).device
    cfg = LoraConfig(r=rank, lora_alpha=2 * rank, lora_dropout=0.0,
                     target_modules=["q_proj", "k_proj", "v_proj", "o_proj"], task_type="CAUSAL_LM")
    peft_model = get_peft_model(model, cfg)

    def loss_of(ids: list[int]) -> torch.Tensor:
        x = torch.tensor([ids], device=device)  # (1, T)
        return peft_model(input_ids=x, labels=x).loss

    def held_out() -> float:
        peft_model.eval()
        with torch.no_grad():
            out = [loss_of(ids).item() for ids in (encode(t)[:max_tokens] for t in eval_texts) if len(ids) >= 4]
        peft_model.train()
        return _mean(out)

    eval_before = held_out() if eval_texts else math.nan
    peft_model.train()
    opt = torch.optim.AdamW([p for p in peft_model.parameters() if p.requires_grad], lr=lr)
    losses = []
    order = list(range(len(texts)))
    for step in tqdm(range(steps), desc="training LoRA role", disable=not progress):
        if step % len(order) == 0:
            random.shuffle(order)
        ids = encode(texts[order[step % len(order)]])[:max_tokens]
        if len(ids) < 4:
            continue
        loss = loss_of(ids)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    eval_after = held_out() if eval_texts else math.nan
    peft_model.save_pretrained(str(out_dir), safe_serialization=True)
    peft_model.eval()
    q = max(1, len(losses) // 4)
    curve = {"steps": steps, "first_loss": _mean(losses[:q]), "last_loss": _mean(losses[-q:]), "losses": losses}
    if eval_texts:
        curve |= {"eval_before": eval_before, "eval_after": eval_after, "eval_texts": len(eval_texts)}
    return peft_model.unload(), curve  # the plain base model again


def _mean(xs: list[float]) -> float:
    return sum(xs) / len(xs) if xs else math.nan
