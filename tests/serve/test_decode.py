"""c2c.serve.decode's chunked prefill: one pass's cache within rounding, its tokens, and a turn check per chunk."""

from __future__ import annotations

import pytest
import torch

from c2c.errors import ConfigError
from c2c.runtime import zoo
from c2c.serve.decode import Sampling, feed_chunked, generate
from c2c.serve.serve_config import PREFILL_CHUNK, ServeConfig


@pytest.mark.parametrize("chunk", [1, 7, 64, 0])
def test_a_chunked_prefill_is_the_one_pass_prefill_within_rounding_in_fp32(chunk):
    rt = zoo.load("tiny-qwen2", dtype="float32")
    ids = list(range(3, 3 + 50))
    _, head = rt.prefill(ids[:5])
    whole_logits, whole = rt.prefill(ids[5:], head)
    checks = []
    s = rt.stepper(head)
    logits = feed_chunked(s, ids[5:], chunk=chunk, check=lambda: checks.append(1))
    cache = s.cache()
    assert len(checks) == (1 if chunk == 0 else -(-45 // chunk))  # one turn check before every pass
    # a matrix product of fewer rows may round otherwise (CPU GEMM kernels block by rows): as any split prefill
    assert cache.token_ids == whole.token_ids and cache.max_abs_diff(whole) < 1e-4
    assert torch.allclose(logits, whole_logits, atol=1e-4) and int(logits.argmax()) == int(whole_logits.argmax())
    if chunk in (0, 64):  # one pass either way: bit for bit
        assert cache.max_abs_diff(whole) == 0 and torch.equal(logits, whole_logits)
    plain = generate(rt, head, ids[5:], Sampling(max_tokens=6, temperature=0), prefill_chunk=0)
    chunked = generate(rt, head, ids[5:], Sampling(max_tokens=6, temperature=0), prefill_chunk=chunk)
    assert chunked.token_ids == plain.token_ids


def test_the_prefill_chunk_is_a_checked_setting():
    from c2c.cli.main import build_parser

    assert ServeConfig().prefill_chunk == PREFILL_CHUNK > 0
    serve = build_parser()._subparsers._group_actions[0].choices["serve"]
    [flag] = [a for a in serve._actions if "--prefill-chunk" in a.option_strings]
    assert f"default {PREFILL_CHUNK}," in flag.help  # the help says the default the server uses
    assert ServeConfig(prefill_chunk=0).prefill_chunk == 0
    with pytest.raises(ConfigError, match="--prefill-chunk"):
        ServeConfig(prefill_chunk=-1)
