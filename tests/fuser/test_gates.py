"""Gates that select: with the general configs' settings a gate can close within a short run; with the old
ones (logit 2.0, the base learning rate) AdamW's step, at most about lr per step, cannot take it across 0."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from c2c.fuser.model import FuserConfig, KVProjector
from c2c.fuser.train import TrainConfig


def close_when_harmful(gate_init: float, lr: float, steps: int = 80) -> float:
    """Train one projector's gate alone on a loss that fusion only hurts; return the final gate logit."""
    torch.manual_seed(0)
    cfg = FuserConfig(receiver_layers=1, receiver_kv_heads=2, receiver_head_dim=8, sharer_kv_heads=1,
                      sharer_head_dim=8, layer_map=((0, 0),), hidden=16, gate_init=gate_init)
    p = KVProjector(cfg)
    torch.nn.init.normal_(p.out.weight, std=0.5)  # as after some training: the projector adds something
    for name, param in p.named_parameters():
        param.requires_grad_(name == "gate_logit")
    opt = torch.optim.AdamW([p.gate_logit], lr=lr, weight_decay=0.0)
    gen = torch.Generator().manual_seed(0)
    r, s = torch.randn(1, 2, 12, 8), torch.randn(1, 1, 12, 8)  # the Sharer's cache: noise for this Receiver
    for step in range(steps):
        tau = 1.0 * (0.1 / 1.0) ** (step / (steps - 1))
        loss = (p(r, s, tau=tau, generator=gen).float() - r).pow(2).mean()  # fusion can only hurt here
        opt.zero_grad()
        loss.backward()
        opt.step()
    return float(p.gate_logit)


CONFIGS = Path(__file__).resolve().parents[2] / "configs" / "fuser"
GENERAL = ["general_pair_a", "general_pair_b", "general_pair_c", "general_control"]


@pytest.mark.parametrize("name", GENERAL)
def test_the_general_configs_start_gates_undecided_with_a_larger_step(name):
    cfg = TrainConfig.from_file(CONFIGS / f"{name}.json")
    assert cfg.gate_init == 0.0 and cfg.gate_lr_mult == 10.0
    assert set(cfg.sources) == {"alpaca", "dolly", "lima"}  # instruction data only


def test_the_general_control_is_matched_to_every_general_pair():
    """Same data, steps, seed and size: every field but the name, the Sharer and the comment."""
    def trained(name):
        d = json.loads((CONFIGS / f"{name}.json").read_text())
        return {k: v for k, v in d.items() if k not in ("_comment", "name", "sharer")}
    control = trained("general_control")
    assert json.loads((CONFIGS / "general_control.json").read_text())["sharer"] == "self"
    for name in GENERAL[:-1]:
        assert trained(name) == control, name


def test_a_harmful_layer_closes_with_the_new_settings_and_stays_open_with_the_old():
    new = close_when_harmful(gate_init=0.0, lr=1e-3 * 10)
    old = close_when_harmful(gate_init=2.0, lr=1e-3)
    assert new < 0 < old  # closed (hard gate 0) against still open (hard gate 1)
    assert old > 2.0 - 80 * 1e-3 * 1.01  # AdamW moved it by at most about lr per step
