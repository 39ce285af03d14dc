"""Store: versioned, append-only commits of artifacts, their dependency DAG, and invalidation.

Open one by URL with :func:`open_store` (``sqlite:////ABS/PATH`` by default, or
``redis://HOST:PORT/DB``); every backend implements :class:`Store`.
"""

from c2c.store.interface import BlobProblem, Commit, CommitId, CommitRecord, StaleEvent, Store
from c2c.store.gc import GCPolicy, GCReport, collect
from c2c.store.graph import Deps, Graph
from c2c.store.hops import HopReport, hop_report
from c2c.store.url import default_url, open_store, store_url

__all__ = [
    "BlobProblem", "Commit", "CommitId", "CommitRecord", "Deps", "GCPolicy", "GCReport", "Graph", "HopReport",
    "StaleEvent", "Store", "collect", "default_url", "hop_report", "open_store", "store_url",
]
