"""Cross-model cache maps: a closed-form map from one model's KV-cache to another's.

When a conversation moves from a small model to a bigger one with the same vocabulary, the
bigger one would normally re-read the whole context. A map instead turns the small model's
cache into the big one's layout, so the target continues without prefilling those tokens:

- :mod:`~c2c.xmodel.streams`: token streams from the training corpora;
- :mod:`~c2c.xmodel.collect`: K/V with RoPE taken out, heads side by side;
- :mod:`~c2c.xmodel.ridge`: ridge regression from sufficient statistics;
- :mod:`~c2c.xmodel.fit`: the fit (layer mapping and ``alpha`` chosen on a calibration split,
  R² on a test split);
- :mod:`~c2c.xmodel.crossmap`: :class:`CrossModelMap`, the map as a checked safetensors file;
- :mod:`~c2c.xmodel.apply`: :func:`map_cache` (a whole context), :func:`map_after_prefix` (a slice) and
  :func:`map_received` (a received cache after a shared prefix: the one mapping of every mapped attach);
- :mod:`~c2c.xmodel.calibration`: :class:`MapCalibration`, whether the map earns its path;
- :mod:`~c2c.xmodel.mapoffer`: :class:`MapOffer`, a map and its record as a hop is offered them
  (:func:`c2c.handoff.decide` takes the "mapped" path only with an offer fitted for the very pair
  whose record says it beats the source alone).
"""

from c2c.xmodel.apply import map_after_prefix, map_cache, map_received
from c2c.xmodel.calibration import MapCalibration
from c2c.xmodel.fit import FitConfig, fit
from c2c.xmodel.crossmap import CrossModelMap, load
from c2c.xmodel.mapoffer import MapOffer

__all__ = ["CrossModelMap", "FitConfig", "MapCalibration", "MapOffer", "fit", "load", "map_after_prefix",
           "map_cache", "map_received"]
