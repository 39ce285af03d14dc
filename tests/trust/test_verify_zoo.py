"""KV verification with a real model (Qwen2.5-Coder-0.5B-Instruct): honest passes, tampering is caught."""

import random
from dataclasses import replace

import pytest

from c2c.artifact import Artifact
from c2c.trust.verify import default_tolerance, probe_errors, verify_kv

from .conftest import TEXT, build

pytestmark = pytest.mark.zoo
MODEL = "Qwen2.5-Coder-0.5B-Instruct"


@pytest.fixture(scope="module")
def real(real_model):
    rt = real_model(MODEL)
    ids = rt.encode(TEXT * 4)[:96]
    return rt, build(rt, ids)


def test_honest_real_cache_is_far_below_tolerance(real):
    rt, art = real
    r = verify_kv(art, rt, mode="sample", samples=16, rng=random.Random(0))
    assert r.layers == "all" and r.max_error < r.tolerance / 10


def test_tenth_of_one_layer_is_seen_at_every_tampered_position(real):
    rt, art = real
    c = art.cache
    T, layer = c.seq_len, 23
    hit = sorted(random.Random(0).sample(range(T), T // 10))
    k = c.keys[layer].clone()
    k[:, :, hit] = k[:, :, [(p + 5) % T for p in hit]]
    bad = Artifact.build(replace(c, keys=c.keys[:layer] + (k,) + c.keys[layer + 1:]),
                         fingerprint=art.header.fingerprint, prefix=art.header.prefix)
    errs = probe_errors(rt, bad.cache, list(range(T))).amax(dim=(0, 1))  # (T,)
    tol = default_tolerance(rt.dtype, rt.device)
    flagged = {p for p in range(T) if errs[p] > tol}
    assert flagged == set(hit)  # last layer: nothing downstream, so exactly the edited positions
    assert errs[hit].min() > 10 * tol


def test_real_recomputed_slice_verifies_after_the_prefix_and_noise_above_layer_0_is_refused(real):
    from c2c.artifact.prefix import SharedPrefix
    from c2c.errors import UnverifiableError, VerificationFailedError
    from c2c.team.agent import Team
    from c2c.trust.keys import SigningKey

    from .conftest import DOMAIN, SYSTEM, noised_above_layer0, slice_sender

    rt, _ = real
    art = slice_sender(rt).export(labels=("evidence",))  # after a private role: recomputed
    prefix = Team(shared=SharedPrefix.build(SYSTEM)).prefix_cache(rt)
    assert art.header.start == prefix.end and art.header.labels["isolation"] == "recompute"
    r = verify_kv(art, rt, mode="sample", samples=16, context=prefix, rng=random.Random(0))
    assert r.layers == "all" and r.deep_positions == 16 and r.max_error < r.tolerance / 10
    bad = noised_above_layer0(art, SigningKey.generate(DOMAIN))
    with pytest.raises(VerificationFailedError) as e:
        verify_kv(bad, rt, mode="sample", samples=16, context=prefix, rng=random.Random(0))
    assert e.value.report.worst["layer"] >= 1 and e.value.report.max_error > 10 * r.tolerance
    with pytest.raises(UnverifiableError, match="not verified beyond layer 0"):
        verify_kv(bad, rt, mode="sample")
