"""`C2CConnector`: c2c inside vLLM, through its KV connector API (the one module of c2c that imports vLLM).

vLLM builds one instance per role. The **scheduler side** decides: for a request that
attaches a commit it fetches, verifies and rules on it (:class:`~c2c.vllm.commits.Attacher`)
on its own thread, answering vLLM "ask again later" meanwhile, then says how many of the
prompt's tokens the commit fills; for a request that publishes it keeps the finished
request's blocks until the worker has copied them. The **worker side** moves bytes:
it writes a verified commit's K/V into the request's blocks layer by layer, just before
each layer's attention runs, and copies a finished request's K/V out of the paged memory
in one step, after which signing and committing run on its own thread. Neither side
ever waits on the store.

A reply carries the outcome in ``kv_transfer_params.c2c``: ``attach`` (the decision, its
checks, and ``imported_tokens`` / ``reused_tokens`` / ``prefilled_tokens``) and
``publish`` (a ticket, which :class:`~c2c.vllm.api_middleware.C2CMiddleware` turns
into the commit once it is in the store). A request that must fail (a bad or invisible
id, a tampered commit, a refusal in ``full``) stops after one token and carries
``error``; the middleware answers it as an error in c2c's shape.
"""

from __future__ import annotations

import logging
import re
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from vllm.distributed.kv_transfer.kv_connector.v1.base import (KVConnectorBase_V1, KVConnectorMetadata,
                                                               KVConnectorRole)
from vllm.platforms import current_platform
from vllm import __version__ as _vllm_version
from vllm import _custom_ops as _vllm_ops

from c2c.errors import C2CError, RuntimeUnsupportedError
from c2c.runtime.kvcache import KVCache
from c2c.vllm import staging, tickets
from c2c.vllm.connector_config import ConnectorConfig, run_dir
from c2c.vllm.commits import Attacher, Publisher, Request, Verdict, error_dict
from c2c.vllm.identity import instance_facts, instance_fingerprint, model_dir
from c2c.vllm.paged import PagedLayout, check_against_kernel, layout_for
from c2c.trust.keys import Keyring

if TYPE_CHECKING:
    from vllm.config import VllmConfig
    from vllm.forward_context import ForwardContext
    from vllm.v1.core.kv_cache_manager import KVCacheBlocks
    from vllm.v1.core.sched.output import SchedulerOutput
    from vllm.v1.kv_cache_interface import KVCacheConfig
    from vllm.v1.request import Request as VllmRequest

log = logging.getLogger("vllm.c2c")  # a child of vLLM's logger: its lines reach vLLM's log, with its format
# the installed engine's version; a local tag ("+cpu") names the wheel's build, which the layout field already names
VLLM_VERSION = _vllm_version.split("+")[0]
_LAYER_INDEX = re.compile(r"\.(\d+)\.")


# ------------------------------------------------------------------ metadata
@dataclass(frozen=True)
class LoadSpec:
    """Write positions ``[start, end)`` of a staged, verified commit into a request's blocks."""

    req_id: str
    commit: str
    staged: str
    start: int
    end: int
    block_ids: tuple[int, ...]


@dataclass(frozen=True)
class SaveSpec:
    """Copy positions ``[0, len(token_ids))`` of a finished request out of its blocks, then publish."""

    req_id: str
    ticket: str
    token_ids: tuple[int, ...]
    block_ids: tuple[int, ...]
    stream: str | None
    parents: tuple[str, ...]
    share: tuple[str, ...] = ()


@dataclass
class C2CMetadata(KVConnectorMetadata):
    loads: list[LoadSpec] = field(default_factory=list)
    saves: list[SaveSpec] = field(default_factory=list)


@dataclass
class _Tracked:
    """What the scheduler side knows about one request that carries a c2c field."""

    ask: Request | None
    error: dict | None = None
    job: Future | None = None
    verdict: Verdict | None = None
    end: int = 0                 # loads end here (tokens)
    reused: int = 0              # tokens vLLM already held (its own prefix cache)
    imported: int = 0
    started: bool = False        # the ticket's "start" report is written (streamed replies)


# ------------------------------------------------------------------ connector
class C2CConnector(KVConnectorBase_V1):
    """Publishes finished requests' KV as signed c2c commits and attaches verified commits to new requests."""

    def __init__(self, vllm_config: "VllmConfig", role: KVConnectorRole, kv_cache_config: "KVCacheConfig"):
        super().__init__(vllm_config=vllm_config, role=role, kv_cache_config=kv_cache_config)
        self.config = ConnectorConfig.from_extra(self._kv_transfer_config.kv_connector_extra_config)
        self.run_dir = run_dir()
        mc, cc = vllm_config.model_config, vllm_config.cache_config
        self.block_size = cc.block_size
        if not current_platform.is_cpu():
            raise RuntimeUnsupportedError("the c2c connector reads vLLM's CPU paged layout only, for now")
        if cc.cache_dtype not in ("auto", None):
            raise RuntimeUnsupportedError(f"the c2c connector needs an unquantized KV cache, not {cc.cache_dtype}")
        # NOTE: a private name, unavoidably: vLLM 0.32's CPU attention picks its kernel (vec, vec16, amx, neon) in
        # _get_attn_isa and exposes no public accessor; the K/V block packing follows that choice, so the
        # connector asks the same function. tests/vllm/test_paged.py checks it exists and answers for the
        # installed wheel, so a vLLM that renames it fails a test, not a user's server.
        from vllm.v1.attention.backends.cpu_attn import _get_attn_isa  # lazy: the CPU backend's kernel choice

        dtype = str(mc.dtype).replace("torch.", "")
        facts = instance_facts(mc.hf_config, dtype=dtype)
        self.layout: PagedLayout = layout_for(_get_attn_isa(mc.dtype, self.block_size, facts.head_dim, cc.cache_dtype),
                                              block_size=self.block_size, kv_heads=facts.kv_heads,
                                              head_dim=facts.head_dim)
        # the packing c2c reads, checked against this wheel's own kernel on this CPU before anything is served
        check_against_kernel(self.layout, _vllm_ops.cpu_attn_reshape_and_cache, mc.dtype)
        name = mc.served_model_name if isinstance(mc.served_model_name, str) else Path(mc.model).name
        self.fingerprint = instance_fingerprint(
            facts=facts, path=model_dir(mc.model), name=name,
            backend=f"vllm {VLLM_VERSION} {self.layout.name} block:{self.block_size}")
        keyring = Keyring(self.config.keys)
        common = dict(store_url=self.config.store, domain=self.config.domain, keyring=keyring,
                      fingerprint=self.fingerprint)
        # one thread per side: the store connection, the hashing and the signing never run on vLLM's loop
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"c2c-{role.name.lower()}")
        if role == KVConnectorRole.SCHEDULER:
            tickets.sweep(self.run_dir)
            self.attacher = Attacher(**common, staging=self.run_dir / "staging", agent=self.config.agent,
                                     prefix_policy=self.config.prefix, max_hops=self.config.max_hops)
            self.publisher = Publisher(**common, run_dir=self.run_dir, agent=self.config.agent)
            self.publisher.signing_key()  # created here once, so workers never race to create it
            self._tracked: dict[str, _Tracked] = {}
            self._loads: list[LoadSpec] = []
            self._saves: list[SaveSpec] = []
        else:
            self.publisher = Publisher(**common, run_dir=self.run_dir, agent=self.config.agent,
                                       model_dir=model_dir(mc.model))
            self._kv: dict[str, torch.Tensor] = {}
            self._layer_of: dict[str, int] = {}
            self._pending: dict[int, list[tuple[LoadSpec, KVCache]]] = {}
            self._failed_blocks: set[int] = set()
            self._saved: set[str] = set()
            self._finished: set[str] = set()
            self._lock = threading.Lock()
        log.info("c2c connector (%s): domain %s, store %s, %s", role.name, self.config.domain,
                 self.config.store or "default", self.fingerprint.backend)

    # ============================================================== scheduler
    def on_new_request(self, request: "VllmRequest") -> None:
        self._track(request)

    def _track(self, request: "VllmRequest") -> _Tracked | None:
        rid = request.request_id
        if rid in self._tracked:
            return self._tracked[rid]
        try:
            ask = Request.parse(request.kv_transfer_params)
        except C2CError as e:
            t = self._tracked[rid] = _Tracked(ask=None, error=error_dict(e))
            request.max_tokens = 1  # NOTE: fails fast: the reply becomes an error (see the middleware)
            return t
        if ask is None:
            return None
        t = self._tracked[rid] = _Tracked(ask=ask)
        if ask.attach is not None:  # start fetching at once, before the request is first scheduled
            t.job = self._pool.submit(self.attacher.admit, ask.attach, ask.mode, list(request.prompt_token_ids or ()),
                                      request_id=_safe(rid))
        return t

    def get_num_new_matched_tokens(self, request: "VllmRequest", num_computed_tokens: int) -> tuple[int | None, bool]:
        """How many prompt tokens the commit's K/V fill. Side-effect free on the request, as vLLM's contract
        asks: it may be called again for the same request; it only reads the attach's verdict once ready."""
        t = self._track(request)
        if t is None or t.ask is None or t.ask.attach is None:
            return 0, False
        if t.verdict is None:
            if not t.job.done():
                return None, False  # fetching or verifying: vLLM asks again on a later step
            t.verdict = t.job.result()
            if t.verdict.error is not None:
                t.error = t.verdict.error  # the request is cut to one token once scheduled (update_state_after_alloc)
        if t.imported:
            return 0, False  # loaded once already (then preempted): the staged bytes are gone, vLLM recomputes
        t.reused = num_computed_tokens
        if not t.verdict.load_tokens:
            return 0, False
        t.end = min(t.verdict.load_tokens, request.num_prompt_tokens - 1)  # vLLM computes at least one token
        return max(0, t.end - num_computed_tokens), False

    def update_state_after_alloc(self, request: "VllmRequest", blocks: "KVCacheBlocks", num_external_tokens: int):
        t = self._tracked.get(request.request_id)
        if t is not None and t.error is not None:
            request.max_tokens = 1  # NOTE: a refused full attach or a bad id: no answer is made from it
        if t is not None and t.ask is not None and t.ask.ticket and not t.started:
            # a streamed reply: the middleware holds the stream until it knows whether it must be an error
            t.started = True
            self._report(t.ask.ticket, {"error": t.error} if t.error else {}, "start")
        if t is None or num_external_tokens <= 0 or t.verdict is None or t.verdict.staged is None:
            return
        t.imported = num_external_tokens
        self._loads.append(LoadSpec(req_id=request.request_id, commit=t.verdict.commit, staged=t.verdict.staged,
                                    start=t.end - num_external_tokens, end=t.end,
                                    block_ids=tuple(blocks.get_block_ids()[0])))

    def build_connector_meta(self, scheduler_output: "SchedulerOutput") -> KVConnectorMetadata:
        meta = C2CMetadata(loads=self._loads, saves=self._saves)
        self._loads, self._saves = [], []
        return meta

    def request_finished(self, request: "VllmRequest", block_ids: list[int]) -> tuple[bool, dict[str, Any] | None]:
        t = self._tracked.pop(request.request_id, None)
        if t is None:
            return False, None
        keep, params = self._finish(t, request, block_ids)
        if t.ask is not None and t.ask.ticket:  # a streamed reply carries no kv_transfer_params: report them
            self._report(t.ask.ticket, params, "reply")
        return keep, params

    def _report(self, ticket: str, payload: dict[str, Any], kind: str) -> None:
        try:
            tickets.settle(self.run_dir, ticket, payload, kind=kind)
        except C2CError as e:  # the engine goes on; the middleware stops waiting after its timeout
            log.warning("c2c could not write the %s report of ticket %s: %s", kind, ticket[:8], e)

    def _finish(self, t: _Tracked, request: "VllmRequest", block_ids: list[int]) -> tuple[bool, dict[str, Any]]:
        if t.job is not None and not t.job.done():
            t.job.cancel()
        staged = t.verdict.staged if t.verdict is not None else None
        if staged and not t.imported:
            Path(staged).unlink(missing_ok=True)  # ruled loadable, never loaded (a local hit, or aborted)
        out: dict[str, Any] = {}
        if t.verdict is not None:
            rec = dict(t.verdict.record)
            if rec.get("path") == "cache" and not t.imported:
                rec["reason"] = rec.get("reason", "") + "; nothing to import (vLLM already held those tokens)"
            prompt = request.num_prompt_tokens
            # as c2c serve counts them: the commit's tokens the prompt holds, split into imported, reused (vLLM's
            # prefix cache) and prefilled; the reply's top-level counts are the whole prompt's
            held = min(int(rec.get("tokens") or 0), prompt)
            reused = min(t.reused, held - t.imported)
            rec.update(tokens=held, imported_tokens=t.imported, reused_tokens=reused,
                       prefilled_tokens=held - t.imported - reused)
            out.update(attach=rec, imported_tokens=t.imported, reused_tokens=t.reused,
                       prefilled_tokens=max(0, prompt - t.imported - t.reused))
        if t.error is not None:
            out["error"] = t.error
            return False, {"c2c": out}
        if t.ask is not None and t.ask.publish:
            if not request.is_finished() or request.status.name not in ("FINISHED_STOPPED", "FINISHED_LENGTH_CAPPED"):
                out["publish"] = {"error": {"type": "HandoffError",
                                            "message": f"not published: the request ended {request.status.name}"}}
                return False, {"c2c": out}
            n = min(request.num_computed_tokens, request.num_tokens)  # K/V exist for these positions
            parents = list(t.ask.parents)
            if t.imported and t.verdict is not None:
                parents.append(t.verdict.commit)
            ticket = t.ask.ticket or tickets.new_ticket()
            self._saves.append(SaveSpec(req_id=request.request_id, ticket=ticket,
                                        token_ids=tuple(request.all_token_ids[:n]), block_ids=tuple(block_ids),
                                        stream=t.ask.stream, parents=tuple(dict.fromkeys(parents)),
                                        share=t.ask.share))
            out["publish"] = {"ticket": ticket, "status": "pending", "tokens": n,
                              "stream": t.ask.stream or self.config.agent}
            return True, {"c2c": out}  # True: vLLM keeps the blocks until the worker has copied them
        return False, {"c2c": out}

    # ================================================================= worker
    def register_kv_caches(self, kv_caches: dict[str, torch.Tensor]):
        for name, layer in kv_caches.items():
            self.layout.require_layer(layer)
            m = _LAYER_INDEX.search(name)
            if m is None:
                raise RuntimeUnsupportedError(f"cannot tell the layer index of vLLM's attention layer {name!r}")
            self._layer_of[name] = int(m.group(1))
        self._kv = dict(kv_caches)
        if sorted(self._layer_of.values()) != list(range(self.fingerprint.num_layers)):
            raise RuntimeUnsupportedError(f"vLLM registered KV for layers {sorted(self._layer_of.values())}, "
                                          f"the model has {self.fingerprint.num_layers}")

    def start_load_kv(self, forward_context: "ForwardContext", **kwargs: Any) -> None:
        meta = self._get_connector_metadata()
        assert isinstance(meta, C2CMetadata)
        for spec in meta.loads:
            try:  # verified once, off the engine loop (the scheduler's Attacher): read, not re-hashed, here
                keys, values = staging.unstage(spec.staged, spec.commit, layers=self.fingerprint.num_layers,
                                               end=spec.end)
            except C2CError as e:
                self._fail(spec, e)
                continue
            for i in range(self.fingerprint.num_layers):
                self._pending.setdefault(i, []).append((spec, (keys[i], values[i])))

    def wait_for_layer_load(self, layer_name: str) -> None:
        i = self._layer_of.get(layer_name)
        for spec, (k, v) in self._pending.pop(i, ()):
            try:
                # (1, H, T, D) slices of the commit, into the request's blocks just before this layer attends
                self.layout.write(self._kv[layer_name], spec.block_ids, spec.start,
                                  k[:, :, spec.start:spec.end], v[:, :, spec.start:spec.end])
            except C2CError as e:
                self._fail(spec, e)

    def _fail(self, spec: LoadSpec, e: C2CError) -> None:
        """``spec`` cannot load: its other layers are dropped and its blocks reported, so vLLM recomputes them."""
        log.error("c2c: cannot load %s for %s: %s; vLLM recomputes those tokens", spec.commit[:12], spec.req_id, e)
        for layer in self._pending.values():
            layer[:] = [x for x in layer if x[0] is not spec]
        self._failed_blocks.update(spec.block_ids[spec.start // self.block_size: -(-spec.end // self.block_size)])

    def save_kv_layer(self, layer_name: str, kv_layer: torch.Tensor, attn_metadata: Any, **kwargs: Any) -> None:
        return  # publishing copies a request's K/V once it has finished (wait_for_save), not per layer

    def wait_for_save(self):
        if self._pending:  # a layer vLLM did not announce: load it now rather than never
            for name, i in self._layer_of.items():
                if i in self._pending:
                    self.wait_for_layer_load(name)
        if not self.has_connector_metadata():
            return
        meta = self._get_connector_metadata()
        assert isinstance(meta, C2CMetadata)
        for spec in meta.saves:
            try:
                cache = self._copy_out(spec)
            except Exception as e:  # noqa: BLE001 - reported on the ticket; the engine goes on
                log.error("c2c: cannot copy %s's KV out: %s", spec.req_id, e)
                tickets.settle(self.run_dir, spec.ticket, {"error": {"type": type(e).__name__, "message": str(e)}})
            else:
                self._pool.submit(self.publisher.publish, cache, ticket=spec.ticket, stream=spec.stream,
                                  parents=spec.parents, request_id=spec.req_id, share=spec.share)
            with self._lock:
                self._saved.add(spec.req_id)

    def _copy_out(self, spec: SaveSpec) -> KVCache:
        keys, values = [], []
        names = sorted(self._layer_of, key=self._layer_of.get)
        for name in names:
            k, v = self.layout.read(self._kv[name], spec.block_ids, 0, len(spec.token_ids))  # (1, H, T, D) each
            keys.append(k)
            values.append(v)
        return KVCache(keys=tuple(keys), values=tuple(values), token_ids=spec.token_ids)

    def get_finished(self, finished_req_ids: set[str]) -> tuple[set[str] | None, set[str] | None]:
        with self._lock:
            self._finished |= finished_req_ids
            done = self._saved & self._finished
            self._saved -= done
            self._finished -= done
        return (done or None), None

    def get_block_ids_with_load_errors(self) -> set[int]:
        failed, self._failed_blocks = self._failed_blocks, set()
        return failed

    def shutdown(self):
        self._pool.shutdown(wait=True)
        for side in ("attacher", "publisher"):
            if hasattr(self, side):
                getattr(self, side).close()


def _safe(request_id: str) -> str:
    """A request id as a file-name part."""
    return re.sub(r"[^A-Za-z0-9_-]", "_", request_id)[:80]
