"""A map on offer: read with the calibration record beside it, checked for its pair, no map to map without."""

from __future__ import annotations

import pytest

from c2c.artifact.fingerprint import Fingerprint
from c2c.errors import ConfigError, CorruptArtifactError, MapMismatchError
from c2c.xmodel import MapCalibration, MapOffer
from c2c.xmodel.calibration import record_path


def test_an_offer_reads_the_map_and_the_record_beside_it(small_to_big, tmp_path):
    path = tmp_path / "small--big.c2cmap"
    mid = small_to_big.save(path)
    bare = MapOffer.load(path)
    assert bare.map_id == mid and bare.calibration is None and bare.origin == str(path)
    rec = MapCalibration(map_id=mid, task="t", n=10, mapped_correct=9, source_correct=2, diff_ci95=(0.4, 0.9))
    rec.save(record_path(path))
    assert record_path(path).name == "small--big.calibration.json"
    assert MapOffer.load(path).calibration == rec
    with pytest.raises(ConfigError):
        MapOffer.load(path, calibration=tmp_path / "missing.json")
    record_path(path).write_text("{}")
    with pytest.raises(CorruptArtifactError):  # a record that does not read is an error, not "no record"
        MapOffer.load(path)


def test_an_offer_checks_its_pair_and_a_descriptor_cannot_map(small_to_big, tiny_models):
    offer = MapOffer.of(small_to_big)
    small, big, other = (Fingerprint.of(tiny_models[n]) for n in ("small", "big", "big_other"))
    offer.check_pair(small, big)
    with pytest.raises(MapMismatchError):
        offer.check_pair(small, other)
    with pytest.raises(MapMismatchError):
        offer.check_pair(big, small)
    assert offer.require_map() is small_to_big and offer.pair == "tiny-small -> tiny-big"
    with pytest.raises(ConfigError, match="without its tensors"):
        MapOffer(map_id=offer.map_id, source=small, target=big).require_map()
