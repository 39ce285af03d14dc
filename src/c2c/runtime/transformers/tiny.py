"""Tiny random-weight models of each supported architecture, with a byte tokenizer, for tests on a CPU.

``c2c models pull tiny-qwen2`` (and ``tiny-llama``, ``tiny-gemma3``) builds one in a second:
4 or 6 layers of width 64, 4 query heads on 2 K/V heads of dim 16, a ChatML template.
"""

from __future__ import annotations

from pathlib import Path

import torch
import transformers
from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import AutoModelForCausalLM, PreTrainedTokenizerFast

from c2c.errors import ModelError

_CHATML = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def byte_tokenizer():
    """A byte-level BPE tokenizer with no merges: 256 byte tokens + specials."""

    alphabet = pre_tokenizers.ByteLevel.alphabet()
    vocab = {ch: i for i, ch in enumerate(sorted(alphabet))}
    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    for s in specials:
        vocab[s] = len(vocab)
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>")
    fast.add_special_tokens({"additional_special_tokens": specials})
    fast.chat_template = _CHATML
    return fast


def build_tiny(arch: str, out_dir: Path, *, seed: int = 0, layers: int | None = None,
               head_dim: int = 16, rope_theta: float | None = None) -> None:
    """Write a tiny random-weight model of ``arch`` (llama, qwen2, gemma3) with a byte tokenizer.

    ``layers``, ``head_dim`` and ``rope_theta`` (llama, qwen2) change the shape and RoPE (tests of
    maps between models of different depth, head size and rotary base); the zoo's tiny models
    use the defaults.
    """
    tokenizer = byte_tokenizer()
    common = dict(vocab_size=len(tokenizer), hidden_size=4 * head_dim, intermediate_size=8 * head_dim,
                  num_attention_heads=4, num_key_value_heads=2, head_dim=head_dim,
                  max_position_embeddings=4096, eos_token_id=tokenizer.eos_token_id,
                  pad_token_id=tokenizer.pad_token_id, bos_token_id=tokenizer.pad_token_id,
                  tie_word_embeddings=False)
    if arch == "llama":
        config = transformers.LlamaConfig(num_hidden_layers=layers or 4, rope_theta=rope_theta or 10000.0, **common)
    elif arch == "qwen2":
        config = transformers.Qwen2Config(num_hidden_layers=layers or 4, rope_theta=rope_theta or 1000000.0,
                                          **common)
    elif arch == "gemma3":
        config = transformers.Gemma3TextConfig(
            num_hidden_layers=6, sliding_window=16, query_pre_attn_scalar=16,
            layer_types=["sliding_attention"] * 2 + ["full_attention"] + ["sliding_attention"] * 2
            + ["full_attention"],
            rope_parameters={"full_attention": {"rope_type": "default", "rope_theta": 1000000.0},
                             "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0}},
            **common)
    else:
        raise ModelError(f"no tiny model for architecture {arch!r}; use llama, qwen2 or gemma3")
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    with torch.no_grad():  # larger random weights so that attention is not uniform
        for p in model.parameters():
            if p.dim() == 2:
                p.normal_(0.0, 0.2)
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
