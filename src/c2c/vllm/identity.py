"""The fingerprint of a vLLM instance: the model it loaded, in the dtype and block layout its KV has.

Built from plain values (the connector reads them off vLLM's config), so the scheduler
and each worker compute the same fingerprint without talking to each other:

- the layout facts (architecture, layers, KV heads, head dim, windows, RoPE) are the model
  config's :class:`~c2c.runtime.facts.ModelFacts`, read by the one reader of a config that c2c's
  transformers runtime uses too (:func:`c2c.runtime.transformers.model_facts.config_facts`);
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

from pathlib import Path
from typing import Any

from c2c.runtime.facts import EngineId, ModelFacts
from c2c.artifact.fingerprint import Fingerprint
from c2c.canon import weights_digest
from c2c.errors import RuntimeUnsupportedError
from c2c.runtime.transformers.model_facts import config_facts

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


def instance_facts(hf_config: Any, *, dtype: str) -> ModelFacts:
    """The :class:`ModelFacts` of the model vLLM loaded (its text config's), with the KV cache's ``dtype``.

    Raises:
        RuntimeUnsupportedError: a model with sliding-window layers (the connector reads whole caches only).
    """
    text = getattr(hf_config, "get_text_config", None)  # a multimodal config nests its text model's
    facts = config_facts(text() if callable(text) else hf_config, dtype=dtype)
    if facts.sliding_window is not None:
        raise RuntimeUnsupportedError("the c2c connector does not yet handle sliding-window layers in vLLM; serve a "
                                      "model without them, or use c2c serve")
    return facts


def instance_fingerprint(*, facts: ModelFacts, path: Path, backend: str, name: str) -> Fingerprint:
    """The fingerprint of the caches this instance makes and may attach (see the module docstring)."""
    return Fingerprint.of_facts(facts, tokenizer_digest=tokenizer_digest(path), weights_digest=weights_digest(path),
                                model_name=name, backend=EngineId.parse(backend))
