import torch

from c2c.fuser.model import CacheFuser, FuserConfig, KVProjector, gumbel_sigmoid

CFG = FuserConfig(receiver_layers=4, receiver_kv_heads=2, receiver_head_dim=16, sharer_kv_heads=3,
                  sharer_head_dim=8, layer_map=((2, 4), (3, 5)), hidden=32)


def caches(T=7, seed=0):
    g = torch.Generator().manual_seed(seed)
    rk = [torch.randn(1, 2, T, 16, generator=g) for _ in range(4)]
    rv = [torch.randn(1, 2, T, 16, generator=g) for _ in range(4)]
    sk = [torch.randn(1, 3, T, 8, generator=g) for _ in range(2)]
    sv = [torch.randn(1, 3, T, 8, generator=g) for _ in range(2)]
    return rk, rv, sk, sv


def perturb(fuser, seed=1):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in fuser.parameters():
            if p.dim() == 2:
                p.copy_(torch.randn(p.shape, generator=g) * 0.3)


def test_untrained_fuser_returns_the_receiver_cache():
    rk, rv, sk, sv = caches()
    fk, fv = CacheFuser(CFG).eval()(rk, rv, sk, sv)
    assert all(torch.equal(a, b) for a, b in zip(fk + fv, rk + rv))


def test_shapes_follow_the_receiver_and_unmapped_layers_are_untouched():
    rk, rv, sk, sv = caches()
    f = CacheFuser(CFG)
    perturb(f)
    fk, fv = f(rk, rv, sk, sv, tau=None)
    assert [t.shape for t in fk] == [t.shape for t in rk]
    assert torch.equal(fk[0], rk[0]) and torch.equal(fv[1], rv[1])
    assert not torch.equal(fk[2], rk[2]) and not torch.equal(fv[3], rv[3])


def test_gate_is_hard_at_inference():
    rk, rv, sk, sv = caches()
    f = CacheFuser(CFG)
    perturb(f)
    assert set(f.gates().values()) == {1.0}
    with torch.no_grad():
        f.proj["k2"].gate_logit.fill_(-0.01)
    assert f.gates()["k2"] == 0.0 and f.gates()["v2"] == 1.0
    fk, fv = f(rk, rv, sk, sv, tau=None)
    assert torch.equal(fk[2], rk[2])      # gate closed: exactly the receiver's keys
    assert not torch.equal(fv[2], rv[2])  # gate open: fused


def test_gate_is_a_differentiable_relaxed_sample_in_training():
    p = KVProjector(CFG)
    g = torch.Generator().manual_seed(0)
    samples = torch.stack([p.gate(1.0, g) for _ in range(400)])
    assert 0.0 < samples.min() < samples.max() < 1.0
    # a relaxed Bernoulli: P(gate > 1/2) = sigmoid(logit)
    assert abs((samples > 0.5).float().mean().item() - torch.sigmoid(torch.tensor(2.0)).item()) < 0.06
    sharp = torch.stack([p.gate(0.05, g) for _ in range(200)])
    assert ((sharp < 0.01) | (sharp > 0.99)).float().mean() > 0.9  # annealing sharpens it
    gumbel_sigmoid(p.gate_logit, 0.5, g).backward()
    assert p.gate_logit.grad is not None and p.gate_logit.grad.abs() > 0


def test_head_weight_is_per_receiver_head():
    p = KVProjector(CFG)
    assert p.head.out_features == CFG.receiver_kv_heads
    rk, _, sk, _ = caches()
    perturb(p)
    with torch.no_grad():  # silence head 0: only head 1 changes
        p.head.weight.zero_()
        p.head.bias.copy_(torch.tensor([-1e4, 1e4]))
    out = p(rk[2], sk[0], tau=None)
    assert torch.equal(out[:, 0], rk[2][:, 0]) and not torch.equal(out[:, 1], rk[2][:, 1])


def test_config_round_trips_through_a_dict():
    assert FuserConfig.from_dict(CFG.to_dict()) == CFG
