"""c2c inside vLLM: a KV connector that publishes and attaches signed, versioned caches.

Run vLLM's OpenAI server with the connector and its middleware (vLLM in its own
virtualenv: ``bash scripts/setup_vllm.sh``)::

    .venv-vllm/bin/python -m vllm.entrypoints.openai.api_server --model ~/.cache/c2c/models/NAME \\
        --kv-transfer-config '{"kv_connector": "C2CConnector",
                               "kv_connector_module_path": "c2c.vllm.connector",
                               "kv_role": "kv_both",
                               "kv_connector_extra_config": {"store": "redis://HOST:6379/0", "domain": "research"}}' \\
        --middleware c2c.vllm.api_middleware.C2CMiddleware

and ask for it per request, in ``kv_transfer_params`` (``extra_body`` of the ``openai`` client):

- ``{"c2c": {"publish": {"stream": S, "parents": [...]}}}``: the request finishes as usual,
  and its K/V (prompt and answer) become a signed commit on the instance's domain's stream
  ``S``; the reply's ``kv_transfer_params.c2c.publish`` names it (``commit``, ``version``, ...).
- ``{"c2c": {"attach": ID, "mode": "auto" | "full"}}``: checked through :func:`c2c.handoff.decide`
  (signature by a key trusted in the instance's domain, fingerprint, the commit's tokens
  against the request's own prompt, staleness, hop count), then loaded into the request's
  blocks; vLLM prefills only the rest. ``auto`` refused: an ordinary prefill, the reason in
  the reply; ``full`` refused, or a bad, invisible or tampered id in any mode: an error reply.

**The rule a caller follows**: the attaching request's prompt begins with the commit's
tokens. For a chat, that is the published conversation plus its answer, then the new turn
(``messages + [{"role": "assistant", "content": answer}, next]``): the chat template renders
them as the same tokens. What the connector loads is the longest run of whole 16-token
blocks the two share (``auto``), so a template that re-renders the answer's last tokens
differently costs only those blocks; ``full`` needs every token. Streamed replies carry no
``kv_transfer_params`` in vLLM 0.32: publish and attach with ``stream=False``.

Modules: :mod:`~.connector` (``C2CConnector``, the one module of c2c that imports vLLM),
:mod:`~.exchange` (the attach ruling and the publish, off vLLM's loop), :mod:`~.paged`
(vLLM's CPU paged memory as c2c's per-layer tensors), :mod:`~.identity` (the instance's
fingerprint), :mod:`~.tickets` and :mod:`~.middleware` (the reply learns its commit),
:mod:`~.config` (``kv_connector_extra_config``).
"""
