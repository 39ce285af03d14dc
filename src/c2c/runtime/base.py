"""What every runtime backend offers, and what they share: chat rendering, sampling, cache checks.

A runtime speaks in token ids and :class:`~c2c.runtime.kvcache.KVCache` values.
Two backends implement it, each the one module that touches its engine:

- :class:`c2c.runtime.engine.Runtime`: transformers (any dtype, LoRA adapters, the fuser);
- :class:`c2c.runtime.llamacpp.LlamaCppRuntime`: llama.cpp on a GGUF file as shipped.

Their caches never mix: the backend is part of the fingerprint.
"""

from __future__ import annotations

from dataclasses import dataclass
import torch

from c2c.errors import ConfigError, IncompatibleCacheError
from c2c.runtime.kvcache import KVCache


@dataclass(frozen=True, kw_only=True)
class Generation:
    """Result of a greedy generation.

    ``cache`` covers every token fed plus every generated token but the last
    (whose K/V is computed only when something is fed after it).
    """

    token_ids: tuple[int, ...]
    cache: KVCache
    prefill_s: float
    decode_s: float
    text: str


GREEDY_BELOW = 1e-5  # a smaller temperature is greedy: it picks the argmax anyway, and logits / 1e-320 overflow


def check_sampling(temperature: float, top_p: float) -> None:
    """Raise :class:`ConfigError` unless ``temperature >= 0`` and ``0 < top_p <= 1``."""
    if not (isinstance(temperature, (int, float)) and 0 <= temperature < float("inf")):
        raise ConfigError(f"temperature={temperature!r}: give a number >= 0 (0 is greedy)")
    if not (isinstance(top_p, (int, float)) and 0 < top_p <= 1):
        raise ConfigError(f"top_p={top_p!r}: give a number in (0, 1]")


def sample_next(logits: torch.Tensor, *, temperature: float = 0.0, top_p: float = 1.0,
                generator: torch.Generator | None = None) -> int:
    """The next token from ``logits`` ``(vocab,)``.

    ``temperature`` below :data:`GREEDY_BELOW` (0 included): the argmax (greedy). Otherwise a draw from
    ``softmax(logits / temperature)`` restricted to the smallest set of most likely
    tokens whose probability reaches ``top_p`` (nucleus sampling), using ``generator``
    (on the logits' device) so that a seeded generator gives the same draw every time.
    """
    if temperature < GREEDY_BELOW:
        return int(torch.argmax(logits))
    probs = torch.softmax(logits.float() / temperature, dim=-1)  # (vocab,)
    if top_p < 1.0:
        sorted_p, order = torch.sort(probs, descending=True)  # (vocab,), (vocab,)
        # keep a token while the mass of the tokens before it is still below top_p (the first is always kept)
        keep = (torch.cumsum(sorted_p, dim=0) - sorted_p) < top_p
        keep[0] = True  # NOTE: a top_p below float32's range (1e-46) compares as 0, which would keep none
        return int(order[torch.multinomial(sorted_p * keep, 1, generator=generator)])
    return int(torch.multinomial(probs, 1, generator=generator))


class RuntimeBase:
    """The parts of a runtime that do not depend on its engine.

    A backend sets ``name``, ``facts`` (see :func:`c2c.runtime.hf.model_facts` for the keys),
    ``windows``, ``eos_ids``, ``adapters``, and implements ``encode``, ``decode``,
    ``render_chat``, ``bos_ids``, ``prefill``, ``generate``, ``reposition``, ``dtype``,
    ``device``, ``tokenizer_digest`` and ``weights_digest``.
    """

    backend = "?"
    engine_info = ""              # the engine's build and cache format, for the fingerprint
    packed = 0
    chars_per_token: float | None = None  # the most characters one token stands for; None: unknown

    def encode(self, text: str) -> list[int]:
        raise NotImplementedError

    def render_chat(self, messages: list[dict], add_generation_prompt: bool = False) -> str | None:
        raise NotImplementedError

    def render_turn(self, role: str, content: str) -> str:
        """The text of one chat turn, exactly as the model's template writes it mid-conversation."""
        anchor = [{"role": "system", "content": "x"}]
        if role == "system":
            full = self.render_chat([{"role": "system", "content": content}])
            if full is not None:
                return full
        else:
            before = self.render_chat(anchor)
            after = self.render_chat(anchor + [{"role": role, "content": content}])
            if before is not None and after.startswith(before):
                return after[len(before):]
        return f"{role.capitalize()}: {content}\n\n"  # plain template for base models

    def generation_prompt(self) -> str:
        anchor = [{"role": "system", "content": "x"}, {"role": "user", "content": "y"}]
        before = self.render_chat(anchor)
        if before is None:
            return "Assistant:"
        return self.render_chat(anchor, add_generation_prompt=True)[len(before):]

    def _check_cache(self, cache: KVCache | None) -> None:
        if cache is None:
            return
        if cache.num_layers != self.facts["num_layers"] or cache.windows != self.windows:
            raise IncompatibleCacheError(
                f"cache has {cache.num_layers} layers with windows {cache.windows}, but "
                f"{self.name} has {self.facts['num_layers']} with {self.windows}"
            )
        if cache.num_layers and (cache.keys[0].shape[1] != self.facts["kv_heads"]
                                 or cache.keys[0].shape[3] != self.facts["head_dim"]):
            raise IncompatibleCacheError(
                f"cache has {cache.keys[0].shape[1]} KV heads of dim {cache.keys[0].shape[3]}, "
                f"{self.name} has {self.facts['kv_heads']} of dim {self.facts['head_dim']}"
            )
        if cache.dtype != self.dtype:
            raise IncompatibleCacheError(f"cache dtype {cache.dtype} differs from the model's {self.dtype}")
