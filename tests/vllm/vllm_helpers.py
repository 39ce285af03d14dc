"""What the vLLM tests share: the model, the domain, the prompts, and reading a reply's c2c fields."""

from __future__ import annotations

import pytest
from openai import APIStatusError

from c2c.config import c2c_home

MODEL = "SmolLM2-135M-Instruct"
DOMAIN = "research"

SYSTEM = {"role": "system", "content": "You are a careful incident analyst. " + " ".join(
    f"Log line {i}: the cache tier in zone {i % 3} lost quorum at 09:{14 + i:02d} and recovered." for i in range(12))}
QUESTION = {"role": "user", "content": "Summarize the incident in one sentence."}
FOLLOW_UP = {"role": "user", "content": "Now give it a short title."}
OTHER = [{"role": "system", "content": "You are a poet."}, {"role": "user", "content": "Write about the sea."}]


def model_dir():
    """c2c's converted safetensors of the test model, or None when it is not pulled."""
    path = c2c_home() / "models" / MODEL
    return path if (path / "model.safetensors").exists() else None


def kv(response) -> dict:
    """The reply's ``kv_transfer_params.c2c``."""
    return ((response.model_extra or {}).get("kv_transfer_params") or {}).get("c2c") or {}


def cached(response) -> int:
    """OpenAI's ``usage.prompt_tokens_details.cached_tokens``: prompt tokens not computed for this request."""
    return response.usage.prompt_tokens_details.cached_tokens or 0


def chat(client, messages, c2c=None, max_tokens=16, **extra):
    """A greedy chat completion that returns its token ids, with ``kv_transfer_params: {"c2c": c2c}``."""
    body = {"return_token_ids": True, **extra}
    if c2c is not None:
        body["kv_transfer_params"] = {"c2c": c2c}
    return client.chat.completions.create(model="smol", messages=messages, max_tokens=max_tokens, temperature=0,
                                          extra_body=body)


def refused(client, messages, c2c) -> APIStatusError:
    with pytest.raises(APIStatusError) as info:
        chat(client, messages, c2c)
    return info.value


def tamper_chunk(store, commit_id: str) -> None:
    """Flip one stored byte of ``commit_id``'s last chunk (its own tokens only), behind the store's back.

    ``store``: a domain's part of a SQLite or Redis store (``open_store(url).in_domain(d)``).
    """
    from c2c.store.redis.backend import RedisStore

    digest = store._load(commit_id)[2][-1][0]
    if isinstance(store, RedisStore):  # the chunk's key
        where = f"{store.prefix}chunk:{digest}"
        raw = bytearray(store._r.get(where))
        raw[len(raw) // 2] ^= 1
        store._r.set(where, bytes(raw))
        return
    path = store._chunk_path(store.domain, digest)   # SQLite: the chunk's file
    raw = bytearray(path.read_bytes())
    raw[len(raw) // 2] ^= 1
    path.write_bytes(bytes(raw))
