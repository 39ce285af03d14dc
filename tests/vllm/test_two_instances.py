"""Across instances: a commit published by one ``vllm serve`` is attached by another over one Redis store.

Runs last in this folder (it stops the session's server): the machine runs one vLLM
server at a time, so instance B starts once A has published and stopped. B has a keyring
of its own that trusts A's public key only, as two hosts of one team would.
"""

from __future__ import annotations

import pytest
from openai import OpenAI

from c2c.testing.vllm import VllmProcess
from c2c.trust.keys import Keyring

from vllm_helpers import DOMAIN, FOLLOW_UP, QUESTION, SYSTEM, cached, chat, kv, model_dir

pytestmark = [pytest.mark.vllm, pytest.mark.slow, pytest.mark.redis]


def test_a_commit_published_on_one_instance_is_attached_on_another(vllm_server, tmp_path):
    a = OpenAI(base_url=vllm_server.base_url, api_key="unused", max_retries=0, timeout=300)
    r = chat(a, [SYSTEM, QUESTION], {"publish": {"stream": "analyst-a"}}, max_tokens=24)
    pub = kv(r)["publish"]
    messages = [SYSTEM, QUESTION, {"role": "assistant", "content": r.choices[0].message.content}, FOLLOW_UP]
    vllm_server.stop()

    home_b = tmp_path / "home-b"
    keys_a, keys_b = Keyring(vllm_server.home / "keys"), Keyring(home_b / "keys")
    for entry in keys_a.entries():
        keys_b.trust(keys_a.public_key(entry.key_id, entry.domain), label="instance A")
    server_b = VllmProcess(model_dir(), home_b, store=vllm_server.store_url, domain=DOMAIN, name="smol").start()
    try:
        b = OpenAI(base_url=server_b.base_url, api_key="unused", max_retries=0, timeout=300)
        plain = chat(b, messages)
        got = chat(b, messages, {"attach": pub["commit"], "mode": "full"})
        rec = kv(got)["attach"]
        assert rec["path"] == "cache" and rec["signer"]["domain"] == DOMAIN
        assert cached(got) == rec["imported_tokens"] == pub["tokens"]
        assert got.choices[0].token_ids == plain.choices[0].token_ids
    finally:
        server_b.stop()
