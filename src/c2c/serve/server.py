"""`Server`: the loaded pieces of a running `c2c serve` (models, store, keyring, tokens, metrics).

:func:`c2c.serve.runner.run` starts one and serves it with uvicorn.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass, field

from c2c.conversation.render import template_stability
from c2c.runtime import zoo
from c2c.runtime.protocol import Runtime
from c2c.serve.auth import TokenTable
from c2c.serve.config import ServeConfig
from c2c.serve.exchange import Exchange
from c2c.serve.mapped import load_maps
from c2c.serve.metrics import Metrics
from c2c.serve.service import ChatService
from c2c.store.interface import Store
from c2c.store.url import open_store, store_url
from c2c.trust.keys import Keyring

log = logging.getLogger("c2c")


@dataclass(eq=False)
class Server:
    config: ServeConfig
    service: ChatService
    tokens: TokenTable
    store: Store
    metrics: Metrics
    draining: threading.Event = field(default_factory=threading.Event)

    @classmethod
    def start(cls, config: ServeConfig, *, runtimes: dict[str, Runtime] | None = None) -> "Server":
        """Load the models (unless given) and the maps between them, open the store and keyring, read the tokens."""
        tokens = TokenTable.load(config.tokens_file) if config.tokens_file is not None else TokenTable.open()
        if runtimes is None:
            runtimes = {}
            for name in config.models:
                rt = zoo.load(name, dtype=config.dtype, device=config.device, backend=config.backend)
                runtimes[rt.name] = rt
        maps = load_maps(config.maps, runtimes)  # before the store opens: a map that cannot serve stops the start
        store = open_store(config.store_url)
        metrics = Metrics()
        exchange = Exchange(store, Keyring(), verify_kv=config.verify_kv, maps=maps)
        service = ChatService(config, runtimes, exchange, metrics, tenants=len(tokens.domains))
        log.info("serving %s; store %s; %s", ", ".join(runtimes), store_url(config.store_url),
                 "open access in domain 'default'" if tokens.is_open else
                 f"tokens for domain(s) {', '.join(tokens.domains)}")
        for name, worker in service.workers.items():
            if worker.batch is None and config.max_batch > 1:
                log.warning("%s decodes one request per forward pass: its engine (%s) has no batched decode; "
                            "serve it with --backend transformers to batch", name, runtimes[name].engine_id.kind)
            elif worker.batch is None:
                log.info("%s decodes one request per forward pass (--max-batch 1)", name)
            else:
                log.info("%s decodes up to %d requests per forward pass (--max-batch)", name, worker.max_batch)
        for name, rt in runtimes.items():   # the chat template, checked once per model (c2c.conversation.render)
            stability = template_stability(rt)
            (log.info if stability.stable else log.warning)("%s: %s", name, stability.reason)
        for m in maps:
            rec = m.offer.calibration
            log.info("map %s: %s -> %s (%s)", m.offer.map_id[:12], m.source.name, m.target.name,
                     "no calibration record: never used" if rec is None else rec.reason)
        return cls(config=config, service=service, tokens=tokens, store=store, metrics=metrics)

    def close(self) -> None:
        self.draining.set()
        self.service.close()
        self.store.close()

