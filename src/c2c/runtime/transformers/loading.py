"""Load a transformers model directory, or convert a GGUF file once into one.

Every load passes ``local_files_only=True``: no hub is ever asked. Nothing is set
for the host process: transformers' log level is lowered only for the duration of
one of our calls (:func:`quiet`), and our attention is registered under its own name
when a model is loaded, never at import.
"""

from __future__ import annotations

import contextlib
import warnings
from pathlib import Path

import torch
import transformers
from transformers import AutoModelForCausalLM, AutoTokenizer

from c2c.errors import ModelError
from c2c.runtime.transformers.attention import ATTENTION, register_attention

SUPPORTED_ARCHITECTURES = ("llama", "qwen2", "gemma3_text")


@contextlib.contextmanager
def quiet():
    """transformers' log level at ERROR for the duration of one of our calls, then restored."""
    before = transformers.logging.get_verbosity()
    transformers.logging.set_verbosity_error()
    try:
        yield
    finally:
        transformers.logging.set_verbosity(before)


def load(path: str | Path, *, dtype: torch.dtype = torch.float32, device: str = "cpu"):
    """A causal LM and its tokenizer from a local directory (never a hub), in eval mode, weights frozen.

    The weights never need gradients here: the fuser differentiates through the model into a
    cache's tensors, and LoRA training (PEFT) makes its own adapter weights trainable.
    """
    path = Path(path)
    if not (path / "config.json").is_file():
        raise ModelError(f"{path} is not a model directory (no config.json); pull it with `c2c models pull`")
    register_attention()
    try:
        with quiet():
            tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True)
            model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype, local_files_only=True,
                                                         attn_implementation=ATTENTION)
    except (OSError, ValueError, KeyError) as e:
        raise ModelError(f"could not load the model in {path}: {e}") from e
    model.to(device).eval()
    model.requires_grad_(False)
    if model.config.model_type not in SUPPORTED_ARCHITECTURES:
        warnings.warn(f"architecture {model.config.model_type!r} is untested with c2c", stacklevel=2)
    return model, tokenizer


def convert_gguf(gguf_file: Path, out_dir: Path) -> None:
    """Dequantize a GGUF file once into a safetensors model directory."""
    try:
        with quiet():
            tokenizer = AutoTokenizer.from_pretrained(gguf_file.parent, gguf_file=gguf_file.name,
                                                      local_files_only=True)
            model = AutoModelForCausalLM.from_pretrained(
                gguf_file.parent, gguf_file=gguf_file.name, dtype=torch.float32, local_files_only=True
            )
    except Exception as e:  # transformers raises many kinds here
        raise ModelError(f"could not convert {gguf_file}: {e}") from e
    # NOTE: the dequantized weights are plain fp32; drop the GGUF marker so that
    # save_pretrained writes them instead of refusing a "quantized" model.
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
