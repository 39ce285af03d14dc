"""The one module of c2c that imports transformers.

Everything that touches a Hugging Face model, tokenizer, config or cache object
lives here, behind a few plain functions, so that a change inside transformers
(``past_key_values`` → ``cache``, ``key_cache`` lists → ``layers``) is mended in
one place. Tested with transformers 5.24 (see pyproject for the pinned range).

Tensor layout of every K/V tensor crossing this module: ``[1, kv_heads, seq, head_dim]``.
"""

from __future__ import annotations

import contextlib
import json
import warnings
from dataclasses import replace
from pathlib import Path
from typing import Any, Sequence

import torch
import transformers
from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import AttentionInterface, AutoModelForCausalLM, AutoTokenizer, DynamicCache, PreTrainedTokenizerFast
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, sdpa_mask

from c2c.errors import ModelError, RuntimeUnsupportedError
from c2c.runtime.dtype import cpu_can_pack_bf16
from c2c.runtime.kvcache import KVCache

# NOTE: nothing is set for the host process at import: no environment variable, no global
# log level. Every load passes ``local_files_only=True`` (no hub is ever asked), and
# transformers' own log level is lowered only for the duration of our calls (``_quiet``).


@contextlib.contextmanager
def _quiet():
    """transformers' log level at ERROR for the duration of one of our calls, then restored."""
    before = transformers.logging.get_verbosity()
    transformers.logging.set_verbosity_error()
    try:
        yield
    finally:
        transformers.logging.set_verbosity(before)

SUPPORTED_ARCHITECTURES = ("llama", "qwen2", "gemma3_text")
EXACT_ROPE_TYPES = ("default", "linear", "llama3")
ATTENTION = "c2c_sdpa"   # our attention implementation's name in transformers' registry (see _register_attention)


# ---------------------------------------------------------------- attention
def _decode_attention(module, query, key, value, attention_mask, dropout: float = 0.0, scaling=None,
                      is_causal=None, **kwargs):
    """transformers' SDPA, except for one query token in a half-precision dtype on CPU.

    PyTorch's CPU flash-attention kernel takes ~0.4 ms per call for one bf16 query against
    512 keys (7x its fp32 time): a tenth of a 0.5B model's decode step. For that case the
    attention is computed here in fp32, grouped by K/V head (no repeat of K/V):
    ``query (1, H, 1, D)`` viewed as ``(1, Hkv, H/Hkv, D)`` against ``key (1, Hkv, T, D)``.
    The result is cast back to the query's dtype. Everything else goes to ``sdpa``.
    """
    B, H, q_len, D = query.shape
    if (q_len != 1 or query.dtype not in (torch.bfloat16, torch.float16) or query.device.type != "cpu"
            or dropout or kwargs.get("softcap") is not None or kwargs.get("position_bias") is not None):
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout,
                                      scaling=scaling, is_causal=is_causal, **kwargs)
    Hkv, T = key.shape[1], key.shape[2]
    scale = scaling if scaling is not None else D ** -0.5
    q = query.reshape(B, Hkv, H // Hkv, D).float()                            # (B, Hkv, G, D)
    scores = torch.matmul(q, key.float().transpose(-1, -2)) * scale             # (B, Hkv, G, T)
    if attention_mask is not None:
        mask = attention_mask[..., -1:, -T:]                                    # (B|1, 1|H, 1, T)
        if mask.shape[1] not in (1, Hkv):
            mask = mask.reshape(mask.shape[0], Hkv, H // Hkv, T)
        if mask.dtype == torch.bool:
            scores = scores.masked_fill(~mask, float("-inf"))
        else:
            scores = scores + mask.float()
    out = torch.matmul(scores.softmax(-1), value.float())                       # (B, Hkv, G, D)
    return out.reshape(B, H, 1, D).transpose(1, 2).to(query.dtype).contiguous(), None  # (B, 1, H, D)


def _register_attention() -> None:
    """Add :func:`_decode_attention` to transformers' registries under :data:`ATTENTION` (idempotent).

    Called when a model is loaded, never at import: it adds a name, and changes no other.
    """
    if ATTENTION not in AttentionInterface._global_mapping:
        AttentionInterface.register(ATTENTION, _decode_attention)
        ALL_MASK_ATTENTION_FUNCTIONS.register(ATTENTION, sdpa_mask)


# ---------------------------------------------------------------- load / save
def load(path: str | Path, *, dtype: torch.dtype = torch.float32, device: str = "cpu"):
    """Load a causal LM and its tokenizer from a local directory (never a hub)."""
    path = Path(path)
    if not (path / "config.json").is_file():
        raise ModelError(f"{path} is not a model directory (no config.json); pull it with `c2c models pull`")
    _register_attention()
    try:
        with _quiet():
            tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True)
            model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype, local_files_only=True,
                                                         attn_implementation=ATTENTION)
    except (OSError, ValueError, KeyError) as e:
        raise ModelError(f"could not load the model in {path}: {e}") from e
    model.to(device).eval()
    if model.config.model_type not in SUPPORTED_ARCHITECTURES:
        warnings.warn(f"architecture {model.config.model_type!r} is untested with c2c", stacklevel=2)
    return model, tokenizer


def convert_gguf(gguf_file: Path, out_dir: Path) -> None:
    """Dequantize a GGUF file once into a safetensors model directory."""
    try:
        with _quiet():
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


# ------------------------------------------------------- packed bf16 weights
class PackedLinear(torch.nn.Module):
    """An ``nn.Linear`` whose weight is held in oneDNN's blocked layout (bf16 on CPU only).

    PyTorch's own bf16 ``linear`` reads a dense weight at ~17 GB/s on this project's CPU;
    the same weight reordered once (``mkldnn._reorder_linear_weight``) is read at ~23 GB/s,
    and decode is bound by reading weights. The products are bit-identical to
    ``F.linear`` in bf16 (``tests/runtime/test_dtype.py`` checks it on every shape of a
    model), so packing changes speed, never a token. The dense weight is freed; :meth:`dense`
    rebuilds the ``nn.Linear`` (for LoRA adapters and gradients, which need it).
    """

    def __init__(self, linear: torch.nn.Linear):
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.packed = torch.ops.mkldnn._reorder_linear_weight(linear.weight.detach(), 1)  # (out, in), blocked
        self.bias = linear.bias

    def forward(self, x: torch.Tensor) -> torch.Tensor:   # (..., in) -> (..., out)
        return torch.ops.mkldnn._linear_pointwise(x, self.packed, self.bias, "none", [], "")

    def dense(self) -> torch.nn.Linear:
        lin = torch.nn.Linear(self.in_features, self.out_features, bias=self.bias is not None, device="meta")
        lin.weight = torch.nn.Parameter(self.packed.to_dense(), requires_grad=False)
        lin.bias = self.bias
        return lin


def can_pack(model) -> bool:
    """bf16 weights on a CPU that oneDNN can pack them for, in a PyTorch build with the packed-linear ops."""
    p = next(model.parameters())
    return (p.dtype == torch.bfloat16 and p.device.type == "cpu" and cpu_can_pack_bf16()
            and torch.backends.mkldnn.is_available()
            and hasattr(torch.ops.mkldnn, "_reorder_linear_weight")
            and hasattr(torch.ops.mkldnn, "_linear_pointwise"))


def pack_linears(model) -> int:
    """Replace every ``nn.Linear`` of ``model`` (decoder and LM head) by a :class:`PackedLinear`.

    Returns how many were packed (0 when :func:`can_pack` says no). A tied LM head gets
    its own packed copy; the embedding keeps the dense table.
    """
    if not can_pack(model):
        return 0
    n = 0
    with torch.no_grad():
        for parent in list(model.modules()):
            for name, child in list(parent.named_children()):
                if type(child) is torch.nn.Linear:
                    setattr(parent, name, PackedLinear(child))
                    n += 1
    return n


def unpack_linears(model) -> int:
    """Undo :func:`pack_linears` (dense ``nn.Linear`` again, bit-identical weights). Returns how many."""
    n = 0
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if isinstance(child, PackedLinear):
                setattr(parent, name, child.dense())
                n += 1
    return n


# -------------------------------------------------------------- tiny models
_CHATML = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def _byte_tokenizer():
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


def build_tiny(arch: str, out_dir: Path, *, seed: int = 0) -> None:
    """Write a tiny random-weight model of ``arch`` (llama, qwen2, gemma3) with a byte tokenizer."""
    tokenizer = _byte_tokenizer()
    common = dict(vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128,
                  num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                  max_position_embeddings=4096, eos_token_id=tokenizer.eos_token_id,
                  pad_token_id=tokenizer.pad_token_id, bos_token_id=tokenizer.pad_token_id,
                  tie_word_embeddings=False)
    if arch == "llama":
        config = transformers.LlamaConfig(num_hidden_layers=4, rope_theta=10000.0, **common)
    elif arch == "qwen2":
        config = transformers.Qwen2Config(num_hidden_layers=4, rope_theta=1000000.0, **common)
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


# -------------------------------------------------------------------- facts
def model_facts(model) -> dict[str, Any]:
    """Everything about a model's cache layout that decides compatibility."""
    cfg = model.config.get_text_config(decoder=True)
    n = cfg.num_hidden_layers
    layer_types = list(getattr(cfg, "layer_types", None) or ["full_attention"] * n)
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    window = getattr(cfg, "sliding_window", None)
    windows = [window if t == "sliding_attention" else None for t in layer_types]
    rope = getattr(cfg, "rope_parameters", None) or {}
    return {
        "architecture": cfg.model_type,
        "num_layers": n,
        "layer_types": layer_types,
        "windows": windows,
        "kv_heads": cfg.num_key_value_heads,
        "head_dim": head_dim,
        "sliding_window": window if any(w is not None for w in windows) else None,
        "rope": json.loads(json.dumps(rope, sort_keys=True, default=str)),
        "dtype": str(next(model.parameters()).dtype).replace("torch.", ""),
        "vocab_size": cfg.vocab_size,
        "eos_token_ids": sorted(_as_list(getattr(model.generation_config, "eos_token_id", None))
                                or _as_list(cfg.eos_token_id)),
    }


def _as_list(x) -> list[int]:
    if x is None:
        return []
    return [int(v) for v in x] if isinstance(x, (list, tuple)) else [int(x)]


def tokenizer_material(tokenizer) -> bytes:
    """Canonical bytes that identify a tokenizer's behaviour (vocab, specials, template)."""
    vocab = tokenizer.get_vocab()
    payload = {
        "vocab": sorted(vocab.items(), key=lambda kv: kv[1]),
        "added": sorted(str(t) for t in tokenizer.all_special_tokens),
        "chat_template": tokenizer.chat_template or "",
        "bos": tokenizer.bos_token_id,
        "class": type(tokenizer).__name__,
    }
    return json.dumps(payload, ensure_ascii=False, sort_keys=True, separators=(",", ":")).encode()


# ---------------------------------------------------------------- tokenizer
def encode(tokenizer, text: str) -> list[int]:
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


def decode(tokenizer, ids: Sequence[int]) -> str:
    return tokenizer.decode(list(ids), skip_special_tokens=True)


def encode_with_offsets(tokenizer, text: str) -> tuple[list[int], list[tuple[int, int]]]:
    """Token ids of ``text`` (as :func:`encode`) and each token's character span ``[a, b)``.

    Used by the fuser to align two tokenizers by characters. Needs a fast
    tokenizer (every zoo model has one).
    """
    if not getattr(tokenizer, "is_fast", False):
        raise RuntimeUnsupportedError("character offsets need a fast (Rust) tokenizer")
    enc = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    return list(enc["input_ids"]), [(int(a), int(b)) for a, b in enc["offset_mapping"]]


def chars_per_token(tokenizer) -> float | None:
    """The most characters of text that one token can stand for; ``None`` when that is unbounded.

    What lets a server refuse an oversized prompt without tokenizing it: a text of ``n``
    characters is at least ``n / chars_per_token`` tokens. A token stands for at most as
    many characters as its own string holds: in a byte-level vocabulary each of its
    characters is one byte of text (at least one character's worth); elsewhere ``▁`` is one
    space and ``<0x0A>`` one byte. A normalizer that composes Unicode (NFC, NFKC) joins at
    most 4 code points into one, and one of at least 2 bytes from at most 3: x1.5 on a
    byte-level vocabulary, x4 elsewhere. A slow tokenizer, a normalizer that can drop text
    (strip, accents, control characters, an unknown one) and an added token that swallows
    whitespace make the bound unknown: ``None``.
    """
    if not getattr(tokenizer, "is_fast", False):
        return None
    spec = json.loads(tokenizer.backend_tokenizer.to_str())
    if any(t.get("lstrip") or t.get("rstrip") for t in spec.get("added_tokens") or ()):
        return None
    composes = _composes(spec.get("normalizer"))
    if composes is None:
        return None
    longest = max(len(t) for t in tokenizer.get_vocab())  # added tokens included
    byte_level = "ByteLevel" in json.dumps([spec.get("pre_tokenizer"), spec.get("decoder")])
    return float(longest) * ((1.5 if byte_level else 4.0) if composes else 1.0)


def _composes(normalizer: dict | None) -> bool | None:
    """Whether a normalizer (tokenizer.json's) may join characters; ``None`` if it may shrink text otherwise."""
    if normalizer is None:
        return False
    kind = normalizer.get("type")
    if kind == "Sequence":
        each = [_composes(n) for n in normalizer.get("normalizers") or ()]
        return None if None in each else any(each)
    if kind in ("NFC", "NFKC"):
        return True
    if kind in ("NFD", "NFKD", "Prepend", "Lowercase"):
        return False
    if kind == "Replace":
        pattern = (normalizer.get("pattern") or {}).get("String")
        return False if pattern is not None and len(normalizer.get("content", "")) >= len(pattern) else None
    return None


def bos_ids(tokenizer, model) -> list[int]:
    """The ids a sequence must start with (e.g. Gemma's <bos>); empty for ChatML models."""
    probe = tokenizer("x", add_special_tokens=True)["input_ids"]
    bare = tokenizer("x", add_special_tokens=False)["input_ids"]
    return list(probe[: len(probe) - len(bare)]) if probe[-len(bare):] == bare else []


def render_chat(tokenizer, messages: list[dict], add_generation_prompt: bool = False) -> str | None:
    """Render with the tokenizer's chat template, or ``None`` when it has none."""
    if not tokenizer.chat_template:
        return None
    return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=add_generation_prompt)


# ------------------------------------------------------------------ forward
def _to_hf(model, kv: KVCache | None, batch: int = 1) -> DynamicCache:
    """``kv`` as a transformers cache; ``batch`` > 1 repeats it (as views) for that many sequences."""
    cache = DynamicCache(config=model.config)
    if kv is None or kv.seq_len == 0:
        return cache
    if kv.start != 0:
        raise RuntimeUnsupportedError(
            f"a model can only continue from a cache that starts at position 0, not {kv.start}; "
            "re-position the slice after a prefix first"
        )
    if len(cache.layers) != kv.num_layers:
        raise RuntimeUnsupportedError(f"cache has {kv.num_layers} layers, model has {len(cache.layers)}")
    for layer, k, v in zip(cache.layers, kv.keys, kv.values):
        layer.update(k.expand(batch, -1, -1, -1), v.expand(batch, -1, -1, -1))
        if hasattr(layer, "cumulative_length"):
            # sliding layers hold only the last W-1 tokens; the count of tokens seen is T
            layer.cumulative_length = kv.seq_len
    return cache


def _from_hf(cache: DynamicCache, token_ids: tuple[int, ...], windows: tuple) -> KVCache:
    keys, values = [], []
    for layer, w in zip(cache.layers, windows):
        keep = KVCache.layer_length(len(token_ids), w)
        keys.append(layer.keys[:, :, -keep:] if keep else layer.keys[:, :, :0])
        values.append(layer.values[:, :, -keep:] if keep else layer.values[:, :, :0])
    return KVCache(keys=tuple(keys), values=tuple(values), token_ids=token_ids, windows=windows)


@torch.inference_mode()
def forward(model, ids: Sequence[int], past: KVCache | None, windows: tuple,
            start: int = 0) -> tuple[torch.Tensor, KVCache]:
    """Run ``ids`` after ``past``. Returns (last-token logits ``(vocab,)``, cache of past + ids).

    ``start`` places a fresh sequence (``past is None``) at positions ``start...``.
    """
    device = next(model.parameters()).device
    cache = _to_hf(model, past)
    input_ids = torch.tensor([list(ids)], dtype=torch.long, device=device)  # (1, T)
    kwargs = {}
    if start:
        kwargs["position_ids"] = torch.arange(start, start + len(ids), device=device)[None, :]  # (1, T)
    out = model(input_ids=input_ids, cache=cache, use_cache=True, logits_to_keep=1, **kwargs)
    prior = past.token_ids if past is not None else ()
    kv = _from_hf(out.cache, prior + tuple(int(i) for i in ids), windows)
    return out.logits[0, -1].float(), (replace(kv, start=start) if start else kv)


@torch.inference_mode()
def forward_all_logits(model, ids: Sequence[int], past: KVCache | None) -> torch.Tensor:
    """Logits ``(T, vocab)`` for every position of ``ids`` after ``past`` (for scoring)."""
    device = next(model.parameters()).device
    cache = _to_hf(model, past)
    input_ids = torch.tensor([list(ids)], dtype=torch.long, device=device)
    return model(input_ids=input_ids, cache=cache, use_cache=True).logits[0].float()


@torch.inference_mode()
def forward_batch_logits(model, seqs: Sequence[Sequence[int]], past: KVCache | None) -> list[torch.Tensor]:
    """Logits ``(len(s), vocab)`` for each sequence ``s`` fed after ``past``, in one forward.

    The sequences are right-padded into one batch: under causal attention a real
    token never sees the padding after it, so no mask is needed. (Scoring the
    options of a question this way costs one forward instead of one per option.)
    """
    device = next(model.parameters()).device
    B, L = len(seqs), max(len(s) for s in seqs)
    cache = _to_hf(model, past, batch=B)
    input_ids = torch.zeros(B, L, dtype=torch.long, device=device)                    # (B, L), right-padded
    for b, s in enumerate(seqs):
        input_ids[b, :len(s)] = torch.tensor(list(s), dtype=torch.long)
    logits = model(input_ids=input_ids, cache=cache, use_cache=True).logits.float()  # (B, L, V)
    return [logits[b, :len(s)] for b, s in enumerate(seqs)]


def forward_logits_grad(model, ids: Sequence[int], past: KVCache | None) -> torch.Tensor:
    """Like :func:`forward_all_logits`, but under the caller's grad mode: ``(T, vocab)``.

    The tensors of ``past`` (``[1, kv_heads, seq, head_dim]`` per layer) may require
    grad; the loss then back-propagates through the frozen model into them. This is
    how a cache fuser is trained. Freeze the model's own parameters first.
    """
    device = next(model.parameters()).device
    cache = _to_hf(model, past)
    input_ids = torch.tensor([list(ids)], dtype=torch.long, device=device)  # (1, T)
    return model(input_ids=input_ids, cache=cache, use_cache=True).logits[0].float()


# --------------------------------------------------------------------- RoPE
def rotary_cos_sin(model, layer: int, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """The model's own RoPE ``cos, sin`` for ``positions`` at ``layer``: each ``(T, head_dim)``.

    Raises:
        RuntimeUnsupportedError: the RoPE type scales cos/sin or depends on the
            sequence length, so a re-rotation would not be exact.
    """
    cfg = model.config.get_text_config(decoder=True)
    base = model.get_base_model() if hasattr(model, "get_base_model") else model  # unwrap PEFT
    rotary = base.model.rotary_emb
    layer_types = getattr(cfg, "layer_types", None)
    params = cfg.rope_parameters or {}
    kwargs = {}
    if layer_types and isinstance(rotary.rope_type, dict):
        kwargs["layer_type"] = layer_types[layer]
        params = params[layer_types[layer]]
        scaling = getattr(rotary, f"{layer_types[layer]}_attention_scaling")
    else:
        scaling = rotary.attention_scaling
    rope_type = params.get("rope_type", "default")
    if rope_type not in EXACT_ROPE_TYPES or scaling != 1.0:
        raise RuntimeUnsupportedError(
            f"RoPE type {rope_type!r} (attention scaling {scaling}) cannot be re-rotated exactly; "
            "hand off a full cache instead of a re-positioned slice"
        )
    device = next(model.parameters()).device
    dummy = torch.empty(1, dtype=dtype, device=device)
    cos, sin = rotary(dummy, positions.to(device)[None, :], **kwargs)  # (1, T, D)
    return cos[0], sin[0]


# ------------------------------------------------------------ partial forwards
@torch.inference_mode()
def forward_first_layers(model, ids: Sequence[int], past: KVCache, n_layers: int,
                         windows: tuple) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """K/V of ``ids`` after ``past`` for the first ``n_layers`` layers only (cheap probe).

    Returns ``n_layers`` pairs of ``(1, kv_heads, len(ids), head_dim)`` tensors.
    """
    device = next(model.parameters()).device
    cache = _to_hf(model, past)
    with _stop_after_attention(model, n_layers - 1):  # the later layers never run
        model(input_ids=torch.tensor([list(ids)], dtype=torch.long, device=device), cache=cache,
              use_cache=True, logits_to_keep=1)
    T = len(ids)
    return [(cache.layers[i].keys[:, :, -T:], cache.layers[i].values[:, :, -T:]) for i in range(n_layers)]


@torch.inference_mode()
def forward_masked(model, ids: Sequence[int], positions: Sequence[int], past: KVCache,
                   allowed: torch.Tensor) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Run ``ids`` at explicit ``positions`` after ``past`` under a custom attention mask.

    ``allowed`` is a bool ``(len(ids), past.seq_len + len(ids))`` matrix: which cache
    entries (then which of the new tokens) each new token may attend to. Returns the
    new tokens' K/V per layer, ``(1, kv_heads, len(ids), head_dim)`` each. Only for
    models without sliding windows (the same mask serves every layer). The forward
    ends after the last attention block: the MLP, norm and LM head would be wasted.
    """
    device = next(model.parameters()).device
    cache = _to_hf(model, past)
    input_ids = torch.tensor([list(ids)], dtype=torch.long, device=device)            # (1, q)
    position_ids = torch.tensor([list(positions)], dtype=torch.long, device=device)   # (1, q)
    mask = allowed.to(device)[None, None]                                              # (1, 1, q, kv)
    with _stop_after_attention(model, -1):
        model(input_ids=input_ids, position_ids=position_ids, attention_mask=mask, cache=cache, use_cache=True,
              logits_to_keep=1)
    q = len(ids)
    return [(layer.keys[:, :, -q:], layer.values[:, :, -q:]) for layer in cache.layers]


@torch.inference_mode()
def forward_layer0(model, ids: Sequence[int], start: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Layer-0 K/V of ``ids`` at positions ``start, start + 1, ...`` (about 1/num_layers of a prefill).

    Returns ``(keys, values)``, each ``(1, kv_heads, T_0, head_dim)`` where ``T_0`` is
    what layer 0 keeps (all ``T``, or the last ``W - 1`` for a sliding window).
    """
    device = next(model.parameters()).device
    cache = _to_hf(model, None)
    input_ids = torch.tensor([list(ids)], dtype=torch.long, device=device)              # (1, T)
    positions = torch.arange(start, start + len(ids), device=device)[None, :]          # (1, T)
    with _stop_after_attention(model, 0):
        model(input_ids=input_ids, position_ids=positions, cache=cache, use_cache=True, logits_to_keep=1)
    layer = cache.layers[0]
    return layer.keys, layer.values


class _Stop(Exception):
    """Raised from a module hook to end a forward after the layer we need."""


@contextlib.contextmanager
def _stop_after_attention(model, layer: int):
    """End the forward right after ``layer``'s attention block (its K/V are cached by then)."""
    def stop(*_):
        raise _Stop

    handle = _decoder_layers(model)[layer].self_attn.register_forward_hook(stop)
    try:
        yield
    except _Stop:
        pass
    finally:
        handle.remove()


def _decoder_layers(model):
    base = model.get_base_model() if hasattr(model, "get_base_model") else model  # unwrap PEFT
    inner = getattr(base, "model", base)
    layers = getattr(inner, "layers", None)
    if layers is None:
        raise RuntimeUnsupportedError(f"cannot find the decoder layers of {type(model).__name__}")
    return layers
