import pytest

from c2c.advise import Calibration, advise, load_calibration, save_calibration
from c2c.advise.cost_model import fit_nonnegative
from c2c.bench.calibrate import calibrate
from c2c.errors import ConfigError
from c2c.handoff import forecast

# A machine like the 2-core CPU of the brief: ~108 ms/token decode, ~180 tok/s prefill.
CAL = Calibration(model="m", decode_s_per_token=0.108, decode_s_per_position=2e-5, prefill_s_fixed=0.05,
                  prefill_s_per_token=1 / 180, prefill_s_per_pair=1e-7, prefill_s_per_past=1e-6,
                  kv_bytes_per_token=24576, handoff_points=((2 * 10**6, 0.02), (40 * 10**6, 0.12)))


def test_cache_wins_for_a_long_message_on_one_machine():
    a = advise(CAL, message_tokens=256, context_tokens=512)
    assert a.cache_is_faster and "advisor predicts cache" in a.note
    assert a.text_handoff_s > 256 * 0.108
    assert a.cache_pipeline_s < a.text_pipeline_s
    d = forecast(CAL, message_tokens=256, context_tokens=512)
    assert d.path == "cache" and all(c.ok for c in d.checks) and d.advice["cache_is_faster"]


def test_each_criterion_forces_text_through_decide():
    assert forecast(CAL, message_tokens=256, context_tokens=512, cross_domain=True).path == "text"
    assert forecast(CAL, message_tokens=256, context_tokens=512, other_model=True).path == "text"
    assert forecast(CAL, message_tokens=256, context_tokens=512, other_model=True,
                    fuser_available=True).path == "fused"
    d = forecast(CAL, message_tokens=256, context_tokens=512, hops=5, hop_limit=3)
    assert d.path == "text" and "reference ids" in d.reason


def test_the_hop_limit_is_c2c_max_hops_unless_given(monkeypatch):
    monkeypatch.setenv("C2C_MAX_HOPS", "5")
    assert forecast(CAL, message_tokens=256, context_tokens=512, hops=5).path == "cache"
    assert forecast(CAL, message_tokens=256, context_tokens=512, hops=6).path == "text"
    assert forecast(CAL, message_tokens=256, context_tokens=512, hops=5, hop_limit=4).path == "text"


def test_slow_link_and_huge_context_make_text_cheaper():
    a = advise(CAL, message_tokens=8, context_tokens=200_000, bandwidth_gbps=0.01)
    assert not a.cache_is_faster and "costs more" in a.note
    d = forecast(CAL, message_tokens=8, context_tokens=200_000, bandwidth_gbps=0.01)
    assert d.path == "text" and d.check("advisor").ok is False and "costs more" in d.reason


def test_predictions_scale_the_right_way():
    small, big = (advise(CAL, message_tokens=n, context_tokens=512) for n in (32, 256))
    assert big.text_handoff_s > small.text_handoff_s
    assert big.artifact_bytes - small.artifact_bytes == (256 - 32) * CAL.kv_bytes_per_token
    with pytest.raises(ConfigError):
        advise(CAL, message_tokens=0, context_tokens=1)


def test_costs_grow_with_position():
    assert CAL.prefill_s(64, past=4096) > CAL.prefill_s(64, past=0)
    assert CAL.decode_s(10, start=4096) > CAL.decode_s(10, start=0)
    # ten steps from 100 cost the same as the sum of single steps at 100..109
    assert CAL.decode_s(10, 100) == pytest.approx(sum(CAL.decode_s(1, 100 + i) for i in range(10)))
    # a longer context makes the text path dearer through positions, not only through reading it
    near, far = (advise(CAL, message_tokens=128, context_tokens=c) for c in (0, 8000))
    assert far.text_handoff_s - near.text_handoff_s > 127 * CAL.decode_s_per_position * 8000 * 0.99


def test_fit_nonnegative_recovers_coefficients_and_clips():
    rows = [[1.0, t, t * t] for t in (1, 2, 4, 8, 16)]
    assert fit_nonnegative(rows, [0.5 + 2 * t + 0.1 * t * t for t in (1, 2, 4, 8, 16)]) == pytest.approx(
        [0.5, 2.0, 0.1], rel=1e-6)
    # data that would want a negative quadratic term: that term is dropped, the rest refitted
    x = fit_nonnegative(rows, [1 + 3 * t - 0.01 * t * t for t in (1, 2, 4, 8, 16)])
    assert x[2] == 0.0 and all(v >= 0 for v in x)


def test_an_old_calibration_file_is_ignored(tmp_path, monkeypatch):
    monkeypatch.setenv("C2C_HOME", str(tmp_path))
    save_calibration(CAL)
    assert load_calibration("m") == CAL
    path = tmp_path / "calibration" / "m.json"
    path.write_text('{"model": "m", "decode_s_per_token": 0.1, "serialize_gbps": 1.0}')  # version 1 layout
    assert load_calibration("m") is None


def test_calibrate_and_cache_round_trip(tiny, tmp_path, monkeypatch):
    monkeypatch.setenv("C2C_HOME", str(tmp_path))
    cal = calibrate(tiny("qwen2"), short=8, long=32, far=64, decode_tokens=4, repeats=1, handoff_repeats=1)
    assert cal.decode_s_per_token > 0 and cal.handoff_gbps > 0 and len(cal.handoff_points) == 2
    assert [b for b, _ in cal.handoff_points] == sorted(b for b, _ in cal.handoff_points)
    assert min(cal.prefill_s_fixed, cal.prefill_s_per_token, cal.prefill_s_per_pair, cal.prefill_s_per_past) >= 0
    assert cal.prefill_s(32) > 0
    assert cal.kv_bytes_per_token == 4 * 2 * 2 * 16 * 4  # layers × (k, v) × heads × dim × fp32
    save_calibration(cal)
    assert load_calibration(cal.model) == cal


def test_cache_handoff_interpolates_between_measured_sizes():
    cal = CAL  # measured: 2 MB in 20 ms, 40 MB in 120 ms
    assert cal.local_handoff_s(2 * 10**6) == pytest.approx(0.02)
    assert cal.local_handoff_s(21 * 10**6) == pytest.approx(0.07)
    assert cal.local_handoff_s(78 * 10**6) == pytest.approx(0.22)  # beyond: the last segment's slope
    assert cal.cache_move_s(40 * 10**6, bandwidth_gbps=1.0) == pytest.approx(0.12 + 0.32)
    with pytest.raises(ConfigError):
        Calibration(**{**CAL.__dict__, "handoff_points": ()})


def test_each_dtype_and_backend_has_its_own_calibration(tiny):
    from c2c.advise import calibration_name, runtime_calibration_name

    assert calibration_name("m") == "m"  # the reference keeps the name calibrations had before dtypes
    assert calibration_name("m", "bfloat16") == "m@bfloat16"
    assert calibration_name("m", "float16", "llama.cpp") == "m@llama.cpp"
    assert runtime_calibration_name(tiny("qwen2")) == "tiny-qwen2"  # the suite runs in float32


def test_a_map_forecast_is_mapped_only_when_its_record_earns_it():
    from dataclasses import replace

    from c2c.testing.synthetic import synthetic_fingerprint
    from c2c.xmodel import MapCalibration, MapOffer

    small = synthetic_fingerprint()
    big = replace(small, weights_digest="3" * 64, head_dim=16)
    rec = MapCalibration(map_id="a" * 64, task="t", n=100, mapped_correct=70, source_correct=50, diff_ci95=(0.1, 0.3))
    offer = MapOffer(map_id="a" * 64, source=small, target=big, calibration=rec)
    d = forecast(CAL, message_tokens=256, context_tokens=512, xmap=offer)
    assert (d.path, d.map_id) == ("mapped", "a" * 64) and d.check("fingerprint").ok is False
    unearned = replace(offer, calibration=replace(rec, diff_ci95=(-0.1, 0.3)))
    d = forecast(CAL, message_tokens=256, context_tokens=512, xmap=unearned)
    assert d.path == "text" and "does not clearly beat" in d.reason
    assert forecast(CAL, message_tokens=256, context_tokens=512, xmap=offer, cross_domain=True).path == "text"
