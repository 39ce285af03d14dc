"""Fixtures for the fuser tests: every test runs with ``C2C_HOME`` in a temporary folder.

Tiny random models are built once per session in their own temporary home;
real zoo models (``@pytest.mark.zoo`` tests) are loaded from the real home.
"""

from __future__ import annotations

import json
import os
from contextlib import contextmanager
from pathlib import Path

import pytest
import torch

from c2c.config import c2c_home

REAL_HOME = c2c_home()
_models: dict = {}


@contextmanager
def _home(path: Path):
    old = os.environ.get("C2C_HOME")
    os.environ["C2C_HOME"] = str(path)
    try:
        yield
    finally:
        if old is None:
            os.environ.pop("C2C_HOME", None)
        else:
            os.environ["C2C_HOME"] = old


@pytest.fixture(autouse=True)
def tmp_home(tmp_path, monkeypatch):
    """A fresh ``C2C_HOME`` for each test (runs, precomputed caches, checkpoints)."""
    home = tmp_path / "c2c-home"
    monkeypatch.setenv("C2C_HOME", str(home))
    return home


@pytest.fixture(scope="session")
def tiny_rt(tmp_path_factory):
    """``tiny_rt("qwen2")`` -> Runtime of a tiny random model, built once in a session temp home."""
    home = tmp_path_factory.mktemp("tiny-home")

    def get(arch: str):
        if arch not in _models:
            from c2c.runtime import zoo

            with _home(home):
                _models[arch] = zoo.load(f"tiny-{arch}")
        return _models[arch]

    return get


@pytest.fixture(scope="session")
def real_rt():
    """``real_rt(NAME)`` -> Runtime of a real zoo model from the real ``C2C_HOME``."""

    def get(name: str):
        if name not in _models:
            from c2c.runtime import zoo

            with _home(REAL_HOME):
                _models[name] = zoo.load(name)
        return _models[name]

    return get


@pytest.fixture
def data_root(tmp_path, monkeypatch):
    """A tiny stand-in for the shared data folder, with every training source and a reported split."""
    root = tmp_path / "data"
    (root / "train").mkdir(parents=True)
    alpaca = [{"instruction": f"Say the word number {i}.", "input": "", "output": f"word {i}"} for i in range(6)]
    (root / "train" / "alpaca_en_demo.json").write_text(json.dumps(alpaca))
    (root / "train" / "lima.json").write_text(json.dumps(alpaca[:2]))
    with open(root / "train" / "dolly_hhrlhf_train_small.jsonl", "w") as f:
        for i in range(3):
            prompt = ("Below is an instruction that describes a task.\n\n### Instruction:\n"
                      f"Name colour {i}.\n\n### Response:\n")
            f.write(json.dumps({"prompt": prompt, "response": f"colour {i}"}) + "\n")
    (root / "eval" / "arc_easy").mkdir(parents=True)
    with open(root / "eval" / "arc_easy" / "ARC-Easy-Dev.jsonl", "w") as f:
        for i in range(6):
            f.write(json.dumps(arc_record(f"q{i}", f"What is {i} plus one?", [str(i + 1), str(i + 2), "zero"],
                                          "ABC", "A")) + "\n")
    (root / "eval" / "mmlu" / "dev").mkdir(parents=True)
    (root / "eval" / "mmlu" / "dev" / "toy_dev.csv").write_text("Pick one,x,y,z,w,B\nPick two,x,y,z,w,C\n")
    (root / "eval" / "mmlu" / "val").mkdir(parents=True)
    (root / "eval" / "mmlu" / "val" / "toy_val.csv").write_text("Held out,x,y,z,w,A\n")
    monkeypatch.setenv("C2C_DATA", str(root))
    return root


def arc_record(qid: str, stem: str, texts: list[str], labels: str, answer: str) -> dict:
    return {"id": qid, "question": {"stem": stem, "choices": [{"text": t, "label": l} for t, l in zip(texts, labels)]},
            "answerKey": answer}


def _link(receiver, sharer, *, perturb: int | None = None):
    from c2c.fuser import checkpoint as ckpt
    from c2c.fuser.align import layer_map
    from c2c.fuser.infer import Link, side_record
    from c2c.fuser.model import CacheFuser, FuserConfig

    rf = receiver.facts
    sf = (sharer or receiver).facts
    cfg = FuserConfig(receiver_layers=rf.num_layers, receiver_kv_heads=rf.kv_heads,
                      receiver_head_dim=rf.head_dim, sharer_kv_heads=sf.kv_heads, sharer_head_dim=sf.head_dim,
                      layer_map=layer_map("terminal", rf.num_layers, sf.num_layers), hidden=16)
    fuser = CacheFuser(cfg).eval()
    if perturb is not None:
        g = torch.Generator().manual_seed(perturb)
        with torch.no_grad():
            for p in fuser.parameters():
                if p.dim() == 2:
                    p.copy_(torch.randn(p.shape, generator=g) * 0.3)
    meta = ckpt.FuserMeta(fuser=cfg, receiver=side_record(receiver),
                          sharer=side_record(sharer) if sharer is not None else {"name": ckpt.SELF},
                          fuser_id=f"{perturb or 0:064x}")
    return Link(fuser=fuser, meta=meta, sharer=sharer)


@pytest.fixture
def make_link():
    """``make_link(receiver, sharer_or_None, perturb=seed)`` -> an in-memory fuser Link (zero-init unless perturbed)."""
    return _link
