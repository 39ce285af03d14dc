"""benchmarks/random_zoo.py: random weights of a model's shapes, initialized as transformers initializes them."""

from __future__ import annotations

import torch

from bench_helpers import load_benchmark


def test_norms_are_ones_and_matrices_are_small_normals():
    bench = load_benchmark("random_zoo")
    g = torch.Generator().manual_seed(0)
    norm = bench._random("model.layers.0.input_layernorm.weight", [896], g)
    assert torch.equal(norm, torch.ones(896))
    w = bench._random("model.layers.0.mlp.up_proj.weight", [512, 256], g)
    b = bench._random("model.layers.0.self_attn.q_proj.bias", [4096], g)
    assert w.shape == (512, 256) and abs(w.std().item() - 0.02) < 0.002 and abs(w.mean().item()) < 0.001
    assert abs(b.std().item() - 0.01) < 0.001
    again = bench._random("model.layers.0.mlp.up_proj.weight", [512, 256], torch.Generator().manual_seed(0))
    assert not torch.equal(w, torch.zeros_like(w)) and again.shape == w.shape
