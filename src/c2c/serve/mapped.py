"""Cross-model maps a server holds (``c2c serve --map FILE``): one served model's commit, attached by a
request to another served model, continues there unprefilled.

Each map is loaded at start with its calibration record (beside it,
:func:`c2c.xmodel.calibration.record_path`) and paired with the two served models it was fitted for; a map
whose two models the server does not both serve is a :class:`~c2c.errors.ConfigError` (it could never be
used). Whether an attach takes the mapped path is :func:`c2c.handoff.decide`'s, from the commit's
fingerprint, the request's model and the offers (:class:`c2c.xmodel.MapOffer`); this module only applies
the map it chose (:func:`mapped_parts`).

NOTE: the source model's K/V are not re-computed to verify them (``--verify-kv sample|strict`` would run
the source model on the receiver's turn); such a server reads the commit as text instead. The signature,
the prefix and the source's fingerprint are checked as for a cache.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Mapping, Sequence

from c2c.artifact import Artifact
from c2c.artifact.fingerprint import Fingerprint
from c2c.errors import ConfigError, HandoffError, MapMismatchError
from c2c.runtime.protocol import Runtime
from c2c.conversation import Part
from c2c.xmodel import MapOffer, map_received


@dataclass(frozen=True, kw_only=True, eq=False)
class ServedMap:
    """A map on offer and the two served models it maps between."""

    offer: MapOffer
    source: Runtime
    target: Runtime

    def to_dict(self) -> dict:
        """For an attach record: the map's id and pair, and its record's verdict."""
        rec = self.offer.calibration
        return {"id": self.offer.map_id, "source": self.source.name, "target": self.target.name,
                "calibration": None if rec is None else {"task": rec.task, "n": rec.n, "earned": rec.earned,
                                                         "diff_ci95": list(rec.diff_ci95)}}


def load_maps(paths: Sequence[str | Path], runtimes: Mapping[str, Runtime]) -> tuple[ServedMap, ...]:
    """Each map file with its record, paired with the served models it was fitted for.

    Raises:
        ConfigError: a map whose source and target this server does not both serve.
        CorruptArtifactError, UnsupportedVersionError: a map or a record that does not read.
    """
    out = []
    for path in paths:
        offer = MapOffer.load(path)
        pairs = [(s, t) for s in runtimes.values() for t in runtimes.values() if s is not t and _fits(offer, s, t)]
        if not pairs:
            raise ConfigError(f"--map {path}: fitted for {offer.pair}, and this server does not serve both (it "
                              f"serves {', '.join(runtimes)}); serve the two models with --model, or leave the map "
                              "out")
        out.extend(ServedMap(offer=offer, source=s, target=t) for s, t in pairs)
    return tuple(out)


def _fits(offer: MapOffer, source: Runtime, target: Runtime) -> bool:
    try:
        offer.check_pair(Fingerprint.of(source), Fingerprint.of(target))
    except MapMismatchError:
        return False
    return True


def mapped_parts(served: ServedMap, artifact: Artifact, *, runtime: Runtime, prefix_ids: Sequence[int], label: str,
                 text: str) -> tuple[Part, ...]:
    """The commit's K/V after the shared prefix, mapped into ``runtime``'s (the request's model), at their
    positions.

    The request model's own prefix is the session's or prefilled by the request, as for any slice (so
    those tokens count as reused or prefilled, never as imported), and the map needs none of it. Runs
    on the request model's turn: the source model runs no forward pass (its RoPE is taken out of the
    keys, nothing more).

    Raises:
        HandoffError: the commit withholds its token ids. MapMismatchError, IncompatibleCacheError: the
        map does not apply to this commit and model (a ``fall_back`` to text in ``auto``).
    """
    h = artifact.header
    if h.tokens is None:
        raise HandoffError("the commit withholds its token ids, so the server cannot track what the cache holds")
    mapped = map_received(served.offer.require_map(), artifact.cache, source=served.source, target=runtime,
                          prefix_len=len(prefix_ids))  # the source's K/V: [0, end) or a slice [start, end)
    if mapped is None:
        return ()
    return (Part(label=label, token_ids=tuple(mapped.token_ids), private=False, kv=mapped, text=text),)
