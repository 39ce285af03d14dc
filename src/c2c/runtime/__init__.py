"""Runtime: prefill, capture, attach and continue from KV-caches; re-position slices.

Every engine implements one protocol (:mod:`c2c.runtime.protocol`), each in the one module
or package of c2c that imports it: :mod:`c2c.runtime.transformers`, :mod:`c2c.runtime.llama_cpp`.
The rest of this package is engine-independent: the cache value (:mod:`.kvcache`), the
fingerprint's inputs (:mod:`.facts`, :mod:`.numerics`), sampling, chat turns, dtypes, the
zoo, adapters' files and slice repair.
"""

from c2c.runtime.kvcache import KVCache

__all__ = ["KVCache"]
