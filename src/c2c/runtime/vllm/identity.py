"""The fingerprint of a vLLM instance: the model it loaded, in the dtype and block layout its KV has.

Built from plain values (the connector reads them off vLLM's config), so the scheduler
and each worker compute the same fingerprint without talking to each other:

- the layout facts (architecture, layers, KV heads, head dim, windows, RoPE) come from
  the model's config, as :func:`c2c.runtime.hf.model_facts` reads them;
- ``weights_digest`` is c2c's digest of the ``*.safetensors`` files vLLM loaded (the same
  digest, memoized beside them, that c2c's transformers runtime records);
- ``tokenizer_digest`` is the digest c2c's transformers runtime records for the same folder
  (:func:`c2c.runtime.transformers.tokenizer.folder_digest`: vocabulary, specials, template), so
  that a vLLM cache and a transformers one of the same model differ only in the engine
  (``backend``), which :mod:`c2c.handoff.cross_engine` rules on;
- ``dtype`` is the KV cache's dtype;
- ``backend`` names the engine and the block layout, e.g.
  ``vllm 0.32.0 cpu_attn:vec k:DxB v:BxD block:128``: a cache from another engine or
  another packing never passes the fingerprint check.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from c2c.runtime.facts import EngineId
from c2c.artifact.fingerprint import Fingerprint
from c2c.canon import canonical_json, weights_digest
from c2c.errors import RuntimeUnsupportedError

def model_dir(model: str) -> Path:
    """The local folder vLLM loaded ``model`` from; a hub id has no files c2c could digest."""
    path = Path(model).expanduser()
    if not path.is_dir() or not any(path.glob("*.safetensors")):
        raise RuntimeUnsupportedError(
            f"the c2c connector needs vLLM to load a local folder of *.safetensors weights (it digests them for "
            f"the fingerprint); {model!r} is not one. Serve the folder itself, e.g. ~/.cache/c2c/models/NAME")
    return path


def tokenizer_digest(path: Path) -> str:
    """The tokenizer digest of the folder, as c2c's transformers runtime records it."""
    from c2c.runtime.transformers.tokenizer import folder_digest  # lazy: loads the tokenizer once per process

    return folder_digest(path)


def layout_facts(hf_config: Any) -> dict[str, Any]:
    """Layers, heads, windows and RoPE of a (transformers) model config, read attribute by attribute."""
    cfg = hf_config.get_text_config() if hasattr(hf_config, "get_text_config") else hf_config
    n = cfg.num_hidden_layers
    layer_types = list(getattr(cfg, "layer_types", None) or ["full_attention"] * n)
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    window = getattr(cfg, "sliding_window", None)
    windows = [window if t == "sliding_attention" else None for t in layer_types]
    rope = getattr(cfg, "rope_parameters", None) or {}
    return {"architecture": cfg.model_type, "num_layers": n, "layer_types": layer_types, "windows": windows,
            "kv_heads": cfg.num_key_value_heads, "head_dim": head_dim,
            "sliding_window": window if any(w is not None for w in windows) else None,
            "rope": json.loads(json.dumps(rope, sort_keys=True, default=str))}


def instance_fingerprint(*, hf_config: Any, path: Path, dtype: str, backend: str, name: str) -> Fingerprint:
    """The fingerprint of the caches this instance makes and may attach (see the module docstring)."""
    f = layout_facts(hf_config)
    if any(w is not None for w in f["windows"]):
        raise RuntimeUnsupportedError("the c2c connector does not yet handle sliding-window layers in vLLM")
    return Fingerprint(architecture=f["architecture"], num_layers=f["num_layers"], layer_types=tuple(f["layer_types"]),
                       kv_heads=f["kv_heads"], head_dim=f["head_dim"], sliding_window=f["sliding_window"],
                       rope=canonical_json(f["rope"]).decode(), dtype=dtype, tokenizer_digest=tokenizer_digest(path),
                       weights_digest=weights_digest(path), model_name=name, backend=EngineId.parse(backend))
