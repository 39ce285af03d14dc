"""Store: versioned, append-only commits of artifacts kept as shared chunks, their dependency DAG,
invalidation, quotas and retention.

Open one by URL with :func:`open_store` (``sqlite:////ABS/PATH`` by default, or
``redis://HOST:PORT/DB``); every backend implements :class:`Store`. Reading only what a
reader lacks: :mod:`c2c.store.fetch` and :class:`c2c.store.manifest.HeldPrefix` (they load
the artifact codec, so they are not imported here).
"""

from c2c.store.interface import BlobProblem, Commit, CommitId, CommitRecord, Fetched, StaleEvent, Store
from c2c.store.gc import GCPolicy, GCReport, Retention, collect, retain
from c2c.store.graph import Deps, Graph
from c2c.store.hops import HopReport, hop_report
from c2c.store.url import default_url, open_store, store_url
from c2c.store.usage import DomainUsage, StoreStats

__all__ = [
    "BlobProblem", "Commit", "CommitId", "CommitRecord", "Deps", "DomainUsage", "Fetched", "GCPolicy", "GCReport",
    "Graph", "HopReport", "Retention", "StaleEvent", "Store", "StoreStats", "collect", "default_url", "hop_report",
    "open_store", "retain", "store_url",
]
