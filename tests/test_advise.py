import pytest

from c2c.advise import Calibration, advise, calibrate, load_calibration, save_calibration
from c2c.errors import ConfigError

# A machine like the 2-core CPU of the brief: ~108 ms/token decode, ~180 tok/s prefill.
CAL = Calibration(model="m", decode_s_per_token=0.108, prefill_s_fixed=0.05, prefill_s_per_token=1 / 180,
                  kv_bytes_per_token=24576, serialize_gbps=1.0, disk_gbps=0.7)


def test_cache_wins_for_a_long_message_on_one_machine():
    a = advise(CAL, message_tokens=256, context_tokens=512)
    assert a.decision == "cache" and all(a.criteria.values())
    assert a.text_handoff_s > 256 * 0.108
    assert a.cache_pipeline_s < a.text_pipeline_s


def test_each_criterion_forces_text():
    assert advise(CAL, message_tokens=256, context_tokens=512, cross_domain=True).decision == "text"
    assert advise(CAL, message_tokens=256, context_tokens=512, same_model=False).decision == "text"
    assert advise(CAL, message_tokens=256, context_tokens=512, same_model=False,
                  fuser_available=True).decision == "cache"
    a = advise(CAL, message_tokens=256, context_tokens=512, hops=5, hop_limit=3)
    assert a.decision == "text" and any("reference ids" in r for r in a.reasons)


def test_slow_link_and_huge_context_make_text_cheaper():
    a = advise(CAL, message_tokens=8, context_tokens=200_000, bandwidth_gbps=0.01)
    assert a.decision == "text" and not a.criteria["cache_is_faster"]
    assert any("costs more" in r for r in a.reasons)


def test_predictions_scale_the_right_way():
    small, big = (advise(CAL, message_tokens=n, context_tokens=512) for n in (32, 256))
    assert big.text_handoff_s > small.text_handoff_s
    assert big.artifact_bytes - small.artifact_bytes == (256 - 32) * CAL.kv_bytes_per_token
    with pytest.raises(ConfigError):
        advise(CAL, message_tokens=0, context_tokens=1)


def test_calibrate_and_cache_round_trip(tiny, tmp_path, monkeypatch):
    monkeypatch.setenv("C2C_HOME", str(tmp_path))
    cal = calibrate(tiny("qwen2"), short=16, long=64, decode_tokens=4, repeats=1)
    assert cal.decode_s_per_token > 0 and cal.prefill_s_per_token > 0 and cal.disk_gbps > 0
    assert cal.kv_bytes_per_token == 4 * 2 * 2 * 16 * 4  # layers × (k, v) × heads × dim × fp32
    save_calibration(cal)
    assert load_calibration(cal.model) == cal
