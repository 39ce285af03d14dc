import json

import pytest
import torch

from c2c.errors import ConfigError, FuserCheckpointError
from c2c.fuser import checkpoint as ckpt
from c2c.fuser.align import align_tokens, render
from c2c.fuser.data import instruction_example
from c2c.fuser.infer import aligned_sharer
from c2c.fuser.train import TrainConfig, Trainer

EXAMPLES = [instruction_example(f"Repeat after me: token {i}.", f"token {i} token {i}", "test") for i in range(4)]


def config(tmp_path, name="t", **kw):
    base = dict(name=name, receiver="tiny-qwen2", sharer="tiny-gemma3", sources={"alpaca": 4},
                out_dir=str(tmp_path / name), max_context_tokens=512, max_response_tokens=12, hidden=16,
                grad_accum=2, epochs=3.0, lr=1e-2, warmup_steps=1, save_every=2, seed=0)
    base.update(kw)
    return TrainConfig(**base)


def trainer(tiny_rt, cfg, **kw):
    sharer = None if cfg.sharer == ckpt.SELF else tiny_rt("gemma3")
    return Trainer(cfg, receiver=tiny_rt("qwen2"), sharer=sharer, examples=EXAMPLES, progress=False, **kw)


def test_loss_goes_down_and_a_checkpoint_is_written(tiny_rt, tmp_path):
    t = trainer(tiny_rt, config(tmp_path, epochs=10.0, lr=3e-2))
    state = t.train()
    assert state.step == t.total_steps == 20
    assert sum(state.losses[-4:]) / 4 < sum(state.losses[:4]) / 4 - 0.05
    fuser, meta = ckpt.load(tmp_path / "t")
    assert meta.step == 20 and meta.sharer["name"] == "tiny-gemma3" and meta.fuser.layer_map == ((0, 2), (1, 3),
                                                                                                  (2, 4), (3, 5))
    log = [json.loads(line) for line in (tmp_path / "t" / "train_log.jsonl").read_text().splitlines()]
    assert [r["step"] for r in log] == list(range(1, 21)) and log[-1]["tau"] < log[0]["tau"]


def test_resume_continues_the_same_loss_curve(tiny_rt, tmp_path):
    straight = trainer(tiny_rt, config(tmp_path, "a")).train()
    first = trainer(tiny_rt, config(tmp_path, "b"))
    first.train(until=3)
    assert first.state.step == 3
    with open(tmp_path / "b" / "train_log.jsonl", "a") as f:  # a step logged, then killed before its save
        f.write(json.dumps({"step": 4, "loss": 9.9}) + "\n")
    resumed = trainer(tiny_rt, config(tmp_path, "b"))
    assert resumed.state.step == 3  # picked up train_state/
    state = resumed.train()
    assert state.step == straight.step == 6
    assert torch.allclose(torch.tensor(state.losses), torch.tensor(straight.losses), rtol=1e-5, atol=1e-6)
    log = [json.loads(line) for line in (tmp_path / "b" / "train_log.jsonl").read_text().splitlines()]
    assert [r["step"] for r in log] == [1, 2, 3, 4, 5, 6] and 9.9 not in [r["loss"] for r in log]
    a, _ = ckpt.load(tmp_path / "a")
    b, _ = ckpt.load(tmp_path / "b")
    for x, y in zip(a.state_dict().values(), b.state_dict().values()):
        assert torch.allclose(x, y, atol=1e-6)


def test_resume_refuses_a_changed_config(tiny_rt, tmp_path):
    trainer(tiny_rt, config(tmp_path, "c")).train(until=2)
    with pytest.raises(FuserCheckpointError, match="different config"):
        trainer(tiny_rt, config(tmp_path, "c", lr=5e-3))


def test_precomputed_sharer_cache_matches_a_fresh_one(tiny_rt, tmp_path):
    t = trainer(tiny_rt, config(tmp_path))
    r, s = tiny_rt("qwen2"), tiny_rt("gemma3")
    msgs = EXAMPLES[1].message_dicts()
    rr, sr = render(r, msgs), render(s, msgs)
    _, cache = s.prefill(list(sr.ids))
    keys, values = aligned_sharer(cache, align_tokens(rr, sr), t.fcfg.layer_map, r.facts.windows)
    ids, sk, sv = t.store.get(1)
    assert tuple(ids) == rr.ids == t.tokens[1].context
    for a, b in zip(keys + values, sk + sv):
        assert a.shape == b.shape and torch.allclose(a, b, atol=2e-3, rtol=1e-3)  # stored as fp16
    # gemma3's sliding layers (window 16) no longer hold early tokens: those entries are zero
    assert t.fcfg.layer_map[1] == (1, 3) and s.facts.windows[3] == 16 and s.facts.windows[2] is None
    assert (sk[1][:, :, 0] == 0).all() and (sk[1][:, :, -1] != 0).any() and (sk[0][:, :, 0] != 0).any()
    shard = next(t.store.path.glob("shard_*.safetensors"))
    mtime = shard.stat().st_mtime_ns
    again = trainer(tiny_rt, config(tmp_path, "t2"))
    assert again.store.path == t.store.path and shard.stat().st_mtime_ns == mtime  # computed once


def test_control_fuser_is_fed_the_receivers_own_cache(tiny_rt, tmp_path):
    t = trainer(tiny_rt, config(tmp_path, "ctl", sharer="self"))
    assert t.store is None and t.fcfg.layer_map == tuple((i, i) for i in range(4))
    seen = {}
    forward = t.fuser.forward

    def spy(keys, values, sk, sv, **kw):
        seen["keys"], seen["sk"], seen["sv"], seen["values"] = keys, sk, sv, values
        return forward(keys, values, sk, sv, **kw)

    t.fuser.forward = spy
    t.example_loss(0, tau=1.0)
    _, cache = tiny_rt("qwen2").prefill(list(t.tokens[0].context))
    assert all(torch.equal(a, b) for a, b in zip(seen["sk"], cache.keys))
    assert all(torch.equal(a, b) for a, b in zip(seen["sv"], cache.values))
    t.fuser.forward = forward
    t.train(until=1)
    assert ckpt.read_meta(tmp_path / "ctl").is_control


def test_config_file_validation(tmp_path):
    p = tmp_path / "c.json"
    p.write_text(json.dumps({"name": "x", "receiver": "a", "sharer": "b", "sources": {"alpaca": 1}, "lrr": 1}))
    with pytest.raises(ConfigError, match="lrr"):
        TrainConfig.from_file(p)
    p.write_text(json.dumps({"_comment": "ok", "name": "x", "receiver": "a", "sharer": "b",
                             "sources": {"alpaca": 1}}))
    cfg = TrainConfig.from_file(p)
    assert cfg.out_path().name == "x" and cfg.out_path().parent.name == "runs"


def test_gate_learning_rate_multiplier(tiny_rt, tmp_path):
    moved = {}
    for mult in (1.0, 30.0):
        t = trainer(tiny_rt, config(tmp_path, f"g{mult}", gate_lr_mult=mult, lr=1e-3))
        assert len(t.opt.param_groups) == (1 if mult == 1.0 else 2)
        t.train(until=3)
        moved[mult] = max(abs(float(p.gate_logit.detach()) - 2.0) for p in t.fuser.proj.values())
    assert moved[30.0] > 5 * moved[1.0]


def test_resume_key_ignores_later_fields_at_their_default(tmp_path):
    from c2c.canon import canonical_json, sha256_hex

    cfg = config(tmp_path)
    d = cfg.to_dict()
    for k in ("out_dir", "cache_dir", "data_root", "device", "save_every", "gate_lr_mult", "mc_response"):
        d.pop(k)
    assert cfg.resume_key() == sha256_hex(canonical_json(d))  # the key of runs made before the field existed
    assert config(tmp_path, gate_lr_mult=10.0).resume_key() != cfg.resume_key()


def test_held_out_losses_of_a_loaded_checkpoint(tiny_rt, tmp_path):
    trained = trainer(tiny_rt, config(tmp_path, "h", epochs=10.0, lr=3e-2))
    trained.train()
    assert TrainConfig.from_checkpoint(ckpt.read_meta(tmp_path / "h")) == trained.cfg  # its recipe, back again
    fresh = trainer(tiny_rt, config(tmp_path, "other"))            # the same run's shape, untrained weights
    before = fresh.held_out_losses()
    meta = fresh.load_weights(tmp_path / "h")
    after = fresh.held_out_losses()
    assert meta.step == 20 and len(after) == len(EXAMPLES)
    assert after == fresh.held_out_losses()                        # hard gates: no sampling, no drift
    assert after == trained.held_out_losses()                      # the checkpoint's weights, exactly
    assert sum(after) < sum(before) - 0.05                         # the trained fuser, not the fresh one
    control = trainer(tiny_rt, config(tmp_path, "c", sharer=ckpt.SELF))
    with pytest.raises(FuserCheckpointError, match="another shape or Sharer"):
        control.load_weights(tmp_path / "h")
