"""`MapOffer`: a map a hop may take, with the record that says whether it earns the mapped path.

:func:`c2c.handoff.decide` reads an offer's pair (the two fingerprints it was fitted for), its
id and its calibration record; it never touches the tensors. The mapped path applies
:attr:`MapOffer.xmap`. A descriptor without the map (``xmap=None``) is enough to decide, not to
map (``c2c advise`` forecasts with one).

On disk an offer is a map file and, beside it, its calibration record
(:func:`c2c.xmodel.calibration.record_path`: ``X.c2cmap`` -> ``X.calibration.json``, written by
``benchmarks/xmodel_map.py --calibrate``). A map without a record is offered, and refused by the
decision: nothing says it beats the source model alone.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from c2c.artifact.fingerprint import Fingerprint
from c2c.errors import ConfigError
from c2c.xmodel.calibration import MapCalibration, record_path
from c2c.xmodel.crossmap import CrossModelMap, load, require_pair


@dataclass(frozen=True, kw_only=True, eq=False)
class MapOffer:
    """One map on offer: its id, the pair it was fitted for, its calibration record and (to map) the map.

    Attributes:
        map_id: :attr:`CrossModelMap.id` (computed once: it hashes every tensor byte).
        source, target: the fingerprints the map was fitted for (``source``'s caches become ``target``'s).
        calibration: the record that says whether the mapped target beats the source alone, or None.
        xmap: the map itself; None for a descriptor that can decide but not map.
        origin: where it was read from, for messages ("" when built in memory).
    """

    map_id: str
    source: Fingerprint
    target: Fingerprint
    calibration: MapCalibration | None = None
    xmap: CrossModelMap | None = field(default=None, repr=False)
    origin: str = ""

    @classmethod
    def of(cls, xmap: CrossModelMap, calibration: MapCalibration | None = None, *, origin: str = "") -> "MapOffer":
        return cls(map_id=xmap.id, source=xmap.source, target=xmap.target, calibration=calibration, xmap=xmap,
                   origin=origin)

    @classmethod
    def load(cls, path: str | Path, calibration: str | Path | None = None) -> "MapOffer":
        """A map file (checked, :func:`c2c.xmodel.crossmap.load`) and its calibration record: ``calibration``,
        else the record beside the map if there is one.

        Raises:
            CorruptArtifactError, UnsupportedVersionError: the map or the record does not read.
            ConfigError: ``calibration`` names no file.
        """
        xmap = load(path)
        rec_path = Path(calibration) if calibration is not None else record_path(path)
        if calibration is not None and not rec_path.is_file():
            raise ConfigError(f"calibration record {rec_path} does not exist")
        rec = MapCalibration.load(rec_path) if rec_path.is_file() else None
        return cls.of(xmap, rec, origin=str(path))

    @property
    def pair(self) -> str:
        """``"SOURCE -> TARGET"`` by model name."""
        return f"{self.source.model_name or '?'} -> {self.target.model_name or '?'}"

    def check_pair(self, source: Fingerprint, target: Fingerprint) -> None:
        """Raise :class:`~c2c.errors.MapMismatchError` unless this map applies to ``source`` -> ``target``."""
        require_pair(self.source, self.target, source, target)

    def require_map(self) -> CrossModelMap:
        """The map, to apply it.

        Raises:
            ConfigError: this offer is a descriptor without its map.
        """
        if self.xmap is None:
            raise ConfigError(f"map {self.map_id[:12]} ({self.pair}) was offered without its tensors; "
                              "load it with MapOffer.load(path) to map a cache")
        return self.xmap
