"""What a loaded transformers model is: its :class:`~c2c.runtime.facts.ModelFacts` and context length.

Read from the model's own config (the text config of a multimodal one), never from its files.
"""

from __future__ import annotations

import json

from c2c.canon import canonical_json
from c2c.runtime.facts import FULL_ATTENTION, SLIDING_ATTENTION, ModelFacts

DEFAULT_CONTEXT = 32768  # a config without max_position_embeddings


def model_facts(model) -> ModelFacts:
    """Everything about ``model``'s cache layout that decides compatibility."""
    cfg = model.config.get_text_config(decoder=True)
    return config_facts(cfg, dtype=str(next(model.parameters()).dtype).replace("torch.", ""),
                        eos_token_ids=_as_list(getattr(model.generation_config, "eos_token_id", None)))


def config_facts(cfg, *, dtype: str, eos_token_ids: list[int] | tuple[int, ...] = ()) -> ModelFacts:
    """The :class:`ModelFacts` a (text) model config describes, read attribute by attribute: the one reading of
    a config, shared with engines that load the model themselves (vLLM's connector, :mod:`c2c.vllm.identity`).

    ``dtype``: the K/V dtype; ``eos_token_ids``: the generation config's, else the config's own.
    """
    n = cfg.num_hidden_layers
    layer_types = tuple(getattr(cfg, "layer_types", None) or [FULL_ATTENTION] * n)
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    window = getattr(cfg, "sliding_window", None)
    return ModelFacts(
        architecture=cfg.model_type, num_layers=n, layer_types=layer_types,
        sliding_window=window if SLIDING_ATTENTION in layer_types else None,
        kv_heads=cfg.num_key_value_heads, head_dim=head_dim,
        rope=canonical_json(json.loads(json.dumps(getattr(cfg, "rope_parameters", None) or {}, default=str))).decode(),
        dtype=dtype,
        vocab_size=cfg.vocab_size,
        eos_token_ids=tuple(sorted(list(eos_token_ids) or _as_list(getattr(cfg, "eos_token_id", None)))),
    )


def context_tokens(model) -> int:
    """The model's context window: its config's ``max_position_embeddings`` (else :data:`DEFAULT_CONTEXT`)."""
    n = getattr(model.config.get_text_config(decoder=True), "max_position_embeddings", None)
    return int(n) if isinstance(n, int) and n > 0 else DEFAULT_CONTEXT


def _as_list(x) -> list[int]:
    if x is None:
        return []
    return [int(v) for v in x] if isinstance(x, (list, tuple)) else [int(x)]
