"""The transformers engine: the one package of c2c that imports transformers (and its tokenizers and PEFT).

Everything that touches a Hugging Face model, tokenizer, config or cache object lives
here, so that a change inside transformers is mended in one place (an import-linter
contract in ``pyproject.toml`` keeps it so). Tested with transformers 5.24 (see pyproject
for the pinned range). One module per job:

- :mod:`.runtime`: :class:`TransformersRuntime`, the engine behind the ``Runtime`` protocol;
- :mod:`.loading`: load a model directory, convert a GGUF file once into one;
- :mod:`.model_facts`: a loaded model's ``ModelFacts`` and context length;
- :mod:`.tokenizer`: ids, text, offsets, chat template, tokenizer identity;
- :mod:`.attention`: our SDPA (one bf16 query on a CPU in fp32);
- :mod:`.packing`: bf16 linear layers packed for oneDNN (a kernel the fingerprint names);
- :mod:`.forward`: forward passes from and into KVCaches;
- :mod:`.partial_forward`: forwards that stop early (verification probes, slice repair);
- :mod:`.rope`: re-positioning a cache (re-rotating its keys);
- :mod:`.lora`: LoRA role adapters through PEFT;
- :mod:`.tiny`: tiny random-weight models for tests.
"""

from c2c.runtime.transformers.runtime import TransformersRuntime

__all__ = ["TransformersRuntime"]
