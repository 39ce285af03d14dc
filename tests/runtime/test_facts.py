"""ModelFacts and EngineId: the typed inputs of a fingerprint, and the one place the backend string is read."""

from __future__ import annotations

import pytest
import torch

from c2c.artifact.fingerprint import Fingerprint
from c2c.errors import IncompatibleCacheError
from c2c.runtime.facts import EngineId, ModelFacts
from c2c.runtime.kvcache import KVCache

GEMMA_LIKE = dict(architecture="gemma3_text", num_layers=3, kv_heads=2, head_dim=4, rope="{}", dtype="float32",
                  vocab_size=10, eos_token_ids=(1,))


def test_windows_are_derived_from_the_layer_types_and_cannot_disagree():
    f = ModelFacts(layer_types=("sliding_attention", "full_attention", "sliding_attention"), sliding_window=8,
                   **GEMMA_LIKE)
    assert f.windows == (8, None, 8)
    with pytest.raises(ValueError, match="window"):  # a sliding layer needs a window
        ModelFacts(layer_types=("sliding_attention", "full_attention", "full_attention"), sliding_window=None,
                   **GEMMA_LIKE)
    with pytest.raises(ValueError, match="window"):  # a window with no sliding layer
        ModelFacts(layer_types=("full_attention",) * 3, sliding_window=8, **GEMMA_LIKE)
    with pytest.raises(ValueError, match="layer_types"):
        ModelFacts(layer_types=("full_attention",) * 2, sliding_window=None, **GEMMA_LIKE)
    with pytest.raises(ValueError, match="layer_types"):
        ModelFacts(layer_types=("full_attention", "linear_attention", "full_attention"), sliding_window=None,
                   **GEMMA_LIKE)


def test_check_names_what_does_not_fit():
    f = ModelFacts(layer_types=("sliding_attention", "full_attention", "sliding_attention"), sliding_window=8,
                   **GEMMA_LIKE)

    def cache(n_layers=3, heads=2, dim=4, dtype=torch.float32, windows=f.windows):
        t = torch.zeros(1, heads, 5, dim, dtype=dtype)  # (1, H, T, D), T = 5 < W - 1
        return KVCache(keys=(t,) * n_layers, values=(t,) * n_layers, token_ids=(1, 2, 3, 4, 5),
                       windows=windows[:n_layers])

    f.require_fits(cache(), model="m")
    f.require_fits(None, model="m")
    for bad, words in ((cache(n_layers=2), "2 layers"), (cache(windows=(None,) * 3), "windows"),
                       (cache(heads=4), "4 KV heads"), (cache(dim=8), "dim 8"),
                       (cache(dtype=torch.bfloat16), "dtype")):
        with pytest.raises(IncompatibleCacheError, match=words):
            f.require_fits(bad, model="m")


@pytest.mark.parametrize("text", [
    "transformers",
    "llama.cpp 0.3.36 gguf:Q4_K_M kv:f16 v_trans:1",                                   # before numerics were named
    "llama.cpp 0.3.36 gguf:Q4_K_M kv:f16 v_trans:0 numerics:cpu/avx2+avx512+avx512_bf16",
    "transformers 5.24.0 numerics:torch-2.13.0+cpu/cpu-amd-avx512/linear-dense",
    "vllm k:v",
])
def test_an_engine_id_round_trips_through_its_string(text):
    engine = EngineId.parse(text)
    assert str(engine) == text and EngineId.parse(str(engine)) == engine


def test_the_parts_of_an_engine_id_are_typed():
    e = EngineId.parse("llama.cpp 0.3.36 gguf:Q4_K_M kv:f16 v_trans:1 numerics:cpu/avx2")
    assert (e.kind, e.version, e.numerics) == ("llama.cpp", "0.3.36", "cpu/avx2")
    assert e.option("v_trans") == "1" and e.option("gguf") == "Q4_K_M" and e.option("missing") is None
    assert e.without_numerics() == EngineId.parse("llama.cpp 0.3.36 gguf:Q4_K_M kv:f16 v_trans:1")


@pytest.mark.parametrize("text", ["", "transformers  5.24", "a b c", "x numerics:a k:v", "x k:v plain", " x",
                                  "x k:v ", "x :v", "x numerics:a numerics:b"])
def test_a_string_not_written_canonically_is_refused(text):
    """A header is byte-for-byte canonical or refused: a backend string that would not read back the same is."""
    with pytest.raises(ValueError):
        EngineId.parse(text)
    fp = dict(architecture="qwen2", num_layers=1, layer_types=["full_attention"], kv_heads=1, head_dim=4,
              sliding_window=None, rope="{}", dtype="float32", tokenizer_digest="t", weights_digest="w",
              adapters=[], cache_format=1, model_name="", backend=text)
    with pytest.raises(ValueError):
        Fingerprint.from_dict(fp)


def test_an_engine_id_cannot_be_built_to_write_an_unreadable_string():
    for bad in (dict(kind="a b"), dict(kind="a:b"), dict(kind="x", version="1:2"), dict(kind="x", numerics="a b"),
                dict(kind="x", options=(("numerics", "a"),)), dict(kind="x", options=(("", "a"),))):
        with pytest.raises(ValueError):
            EngineId(**bad)
