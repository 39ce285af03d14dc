"""The Redis backend (``redis://HOST:PORT/DB``), for agents across processes and machines: the store itself
(:mod:`~c2c.store.redis.backend`), its URL options (:mod:`~c2c.store.redis.config`), key layout
(:mod:`~c2c.store.redis.layout`), server-side scripts (:mod:`~c2c.store.redis.lua`), chunk transfers
(:mod:`~c2c.store.redis.chunks`) and direct blob reads (:mod:`~c2c.store.redis.resp`).

Nothing is imported here: redis-py is an extra, and a caller that only reads a URL's options
(:mod:`c2c.store.acl`) must not need it.
"""
