"""The embedded SQLite backend (``sqlite:////ABS/PATH``), the default: the store itself
(:mod:`~c2c.store.sqlite.backend`), its URL options (:mod:`~c2c.store.sqlite.config`), its schema and
migrations (:mod:`~c2c.store.sqlite.schema`) and its chunk files (:mod:`~c2c.store.sqlite.chunks`).
"""
