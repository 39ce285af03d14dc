import json

import pytest
import torch

from c2c.errors import FuserCheckpointError
from c2c.fuser import checkpoint as ckpt
from c2c.fuser.model import CacheFuser, FuserConfig

CFG = FuserConfig(receiver_layers=4, receiver_kv_heads=2, receiver_head_dim=16, sharer_kv_heads=3,
                  sharer_head_dim=8, layer_map=((2, 4), (3, 5)), hidden=32)
META = ckpt.FuserMeta(fuser=CFG, receiver={"name": "r", "weights_digest": "a" * 64, "tokenizer_digest": "b" * 64},
                      sharer={"name": "s"}, step=7)


def trained():
    f = CacheFuser(CFG)
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in f.parameters():
            p.copy_(torch.randn(p.shape, generator=g))
    return f


def test_round_trip_is_exact(tmp_path):
    f = trained()
    meta = ckpt.save(tmp_path / "c", f, META)
    g, meta2 = ckpt.load(tmp_path / "c")
    assert meta2 == meta and meta2.step == 7 and len(meta.fuser_id) == 64
    for (n1, a), (n2, b) in zip(f.state_dict().items(), g.state_dict().items()):
        assert n1 == n2 and torch.equal(a, b)
    assert not g.training  # loaded for inference: hard gates
    assert sorted(p.name for p in (tmp_path / "c").iterdir()) == ["config.json", "fuser.safetensors"]


def test_fuser_id_changes_with_the_weights(tmp_path):
    a = ckpt.save(tmp_path / "a", trained(), META)
    f = trained()
    with torch.no_grad():
        f.proj["k2"].gate_logit.add_(1.0)
    b = ckpt.save(tmp_path / "b", f, META)
    assert a.fuser_id != b.fuser_id


def test_tampered_weights_are_refused(tmp_path):
    ckpt.save(tmp_path / "c", trained(), META)
    path = tmp_path / "c" / "fuser.safetensors"
    data = bytearray(path.read_bytes())
    data[-3] ^= 0x40
    path.write_bytes(bytes(data))
    with pytest.raises(FuserCheckpointError, match="fuser_id"):
        ckpt.load(tmp_path / "c")


def test_truncated_or_missing_files_are_refused(tmp_path):
    ckpt.save(tmp_path / "c", trained(), META)
    w = tmp_path / "c" / "fuser.safetensors"
    w.write_bytes(w.read_bytes()[:100])
    with pytest.raises(FuserCheckpointError):
        ckpt.load(tmp_path / "c")
    with pytest.raises(FuserCheckpointError, match="not a fuser checkpoint"):
        ckpt.load(tmp_path / "nothing")


def test_weights_must_fit_the_config(tmp_path):
    ckpt.save(tmp_path / "c", trained(), META)
    doc = json.loads((tmp_path / "c" / "config.json").read_text())
    doc["fuser"]["hidden"] = 16
    (tmp_path / "c" / "config.json").write_text(json.dumps(doc))
    with pytest.raises(FuserCheckpointError, match="shape"):
        ckpt.load(tmp_path / "c")


def test_wrong_format_or_version(tmp_path):
    ckpt.save(tmp_path / "c", trained(), META)
    doc = json.loads((tmp_path / "c" / "config.json").read_text())
    (tmp_path / "c" / "config.json").write_text(json.dumps({**doc, "version": 99}))
    with pytest.raises(FuserCheckpointError, match="version"):
        ckpt.load(tmp_path / "c")
