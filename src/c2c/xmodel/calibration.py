"""`MapCalibration`: does a map earn the "mapped" path? Its record on held-out calibration questions.

A map is worth using only where the target reading the mapped cache answers better than the
source model answering alone (a public replication found pairs where it does not). The record
holds, for one map (pinned by its id) on one task, both conditions' counts on the same
questions and the 95% interval of the paired difference (mapped - source). ``earned`` is true
only when that interval lies above zero. The benchmark that measures it
(``benchmarks/xmodel_map.py --calibrate``) uses questions of another seed than the reported ones.

The decision layer reads it: offer "mapped" for a pair only with a map and an earned record
for that very map (:meth:`MapCalibration.require_for`), else hand off by text or re-prefill,
recording :attr:`MapCalibration.reason`.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from c2c._io import read_bounded, write_atomic
from c2c.canon import canonical_json
from c2c.errors import CorruptArtifactError, MapMismatchError

FORMAT = "c2c-xmodel-calibration"
VERSION = 1


def record_path(map_path: str | Path) -> Path:
    """Where a map's calibration record lives: beside the map, ``X.c2cmap`` -> ``X.calibration.json``."""
    return Path(map_path).with_suffix(".calibration.json")


@dataclass(frozen=True, kw_only=True)
class MapCalibration:
    """The mapped target against the source alone, on the same held-out calibration questions.

    Attributes:
        map_id: the id of the map measured (:attr:`c2c.xmodel.crossmap.CrossModelMap.id`).
        task: what was asked, e.g. ``"context_qa doc_tokens=1024 seed=1"``.
        n: questions; ``mapped_correct`` / ``source_correct`` / ``target_correct``: how many each
            condition got right (``target_correct``: the target's own prefill, the upper bound; -1
            when not measured).
        diff_ci95: 95% interval of the paired accuracy difference ``mapped - source``.
    """

    map_id: str
    task: str
    n: int
    mapped_correct: int
    source_correct: int
    diff_ci95: tuple[float, float]
    target_correct: int = -1

    @property
    def diff(self) -> float:
        return (self.mapped_correct - self.source_correct) / self.n if self.n else 0.0

    @property
    def earned(self) -> bool:
        """The mapped target beats the source alone: the interval of the difference clears zero."""
        return self.n > 0 and self.diff_ci95[0] > 0

    @property
    def reason(self) -> str:
        """One line for a decision record."""
        verdict = "beats" if self.earned else "does not clearly beat"
        return (f"mapped target {verdict} the source alone on {self.n} calibration questions ({self.task}): "
                f"{self.mapped_correct} vs {self.source_correct} right, difference {100 * self.diff:+.1f} points "
                f"(95% interval {100 * self.diff_ci95[0]:+.1f} to {100 * self.diff_ci95[1]:+.1f})")

    def require_for(self, map_id: str) -> None:
        """Raise :class:`MapMismatchError` unless this record measured the map ``map_id``."""
        if map_id != self.map_id:
            raise MapMismatchError(f"the calibration record measured map {self.map_id[:12]}..., not {map_id[:12]}...; "
                                   "calibrate this map (benchmarks/xmodel_map.py --calibrate)")

    # ------------------------------------------------------------------ file
    def to_dict(self) -> dict[str, Any]:
        return {"format": FORMAT, "version": VERSION, **asdict(self), "diff_ci95": list(self.diff_ci95)}

    @classmethod
    def from_dict(cls, d: Any) -> "MapCalibration":
        if not isinstance(d, dict) or d.get("format") != FORMAT or d.get("version") != VERSION:
            raise CorruptArtifactError(f"not a {FORMAT} record of version {VERSION}")
        try:
            rec = cls(map_id=str(d["map_id"]), task=str(d["task"]), n=int(d["n"]),
                      mapped_correct=int(d["mapped_correct"]), source_correct=int(d["source_correct"]),
                      target_correct=int(d.get("target_correct", -1)),
                      diff_ci95=(float(d["diff_ci95"][0]), float(d["diff_ci95"][1])))
        except (KeyError, TypeError, ValueError, IndexError) as e:
            raise CorruptArtifactError(f"malformed calibration record: {e}") from None
        if not (0 <= rec.mapped_correct <= rec.n and 0 <= rec.source_correct <= rec.n
                and -1 <= rec.diff_ci95[0] <= rec.diff_ci95[1] <= 1):
            raise CorruptArtifactError("calibration record counts or interval out of range")
        return rec

    def save(self, path: str | Path) -> None:
        write_atomic(path, canonical_json(self.to_dict()))

    @classmethod
    def load(cls, path: str | Path) -> "MapCalibration":
        try:
            return cls.from_dict(json.loads(bytes(read_bounded(path, 1 << 20))))
        except ValueError as e:
            raise CorruptArtifactError(f"{path} is not JSON: {e}") from None
