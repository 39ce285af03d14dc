"""The calibration record: the mapped path is earned only by an interval that clears the source alone."""

from __future__ import annotations

import json

import pytest

from c2c.errors import CorruptArtifactError, MapMismatchError
from c2c.xmodel import MapCalibration


def _rec(lo, hi, mapped=70, source=50):
    return MapCalibration(map_id="a" * 64, task="context_qa doc_tokens=256 seed=1", n=100, mapped_correct=mapped,
                          source_correct=source, diff_ci95=(lo, hi), target_correct=80)


def test_earned_only_when_the_interval_clears_zero():
    assert _rec(0.08, 0.32).earned
    assert not _rec(-0.01, 0.3).earned
    assert not _rec(-0.2, -0.05, mapped=40).earned
    assert "beats" in _rec(0.08, 0.32).reason and "does not clearly beat" in _rec(-0.01, 0.3).reason
    assert abs(_rec(0.08, 0.32).diff - 0.2) < 1e-12


def test_a_record_pins_its_map():
    _rec(0.1, 0.3).require_for("a" * 64)
    with pytest.raises(MapMismatchError):
        _rec(0.1, 0.3).require_for("b" * 64)


def test_file_round_trip_and_a_malformed_record_is_refused(tmp_path):
    path = tmp_path / "cal.json"
    _rec(0.1, 0.3).save(path)
    assert MapCalibration.load(path) == _rec(0.1, 0.3)
    doc = json.loads(path.read_text())
    doc["mapped_correct"] = 101  # more right answers than questions
    path.write_text(json.dumps(doc))
    with pytest.raises(CorruptArtifactError):
        MapCalibration.load(path)
    path.write_text("{not json")
    with pytest.raises(CorruptArtifactError):
        MapCalibration.load(path)
