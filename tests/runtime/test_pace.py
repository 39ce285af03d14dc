"""c2c.runtime.pace: a paced prefill is one pass's cache within rounding with its tokens and a call before every
pass; a paced repair (probe and recompute) is the one-pass repair, pass by pass; and the server's setting."""

from __future__ import annotations

import pytest
import torch

from c2c.errors import ConfigError
from c2c.runtime import zoo
from c2c.runtime.edit import drop
from c2c.runtime.pace import Pace
from c2c.conversation.decode import Sampling, generate
from c2c.serve.config import PREFILL_CHUNK, ServeConfig


@pytest.mark.parametrize("chunk", [1, 7, 64, 0])
def test_a_chunked_prefill_is_the_one_pass_prefill_within_rounding_in_fp32(chunk):
    rt = zoo.load("tiny-qwen2", dtype="float32")
    ids = list(range(3, 3 + 50))
    _, head = rt.prefill(ids[:5])
    whole_logits, whole = rt.prefill(ids[5:], head)
    checks = []
    s = rt.stepper(head)
    logits = Pace(chunk=chunk, between=lambda: checks.append(1)).feed(s, ids[5:])
    cache = s.cache()
    assert len(checks) == (1 if chunk == 0 else -(-45 // chunk))  # one turn check before every pass
    # a matrix product of fewer rows may round otherwise (CPU GEMM kernels block by rows): as any split prefill
    assert cache.token_ids == whole.token_ids and cache.max_abs_diff(whole) < 1e-4
    assert torch.allclose(logits, whole_logits, atol=1e-4) and int(logits.argmax()) == int(whole_logits.argmax())
    if chunk in (0, 64):  # one pass either way: bit for bit
        assert cache.max_abs_diff(whole) == 0 and torch.equal(logits, whole_logits)
    plain = generate(rt, head, ids[5:], Sampling(max_tokens=6, temperature=0))
    chunked = generate(rt, head, ids[5:], Sampling(max_tokens=6, temperature=0), pace=Pace(chunk=chunk))
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


def _passes(rt, record):
    """Wrap ``rt``'s probes and prefill so that each forward pass records how many new tokens it ran."""
    for name in ("probe_kv", "probe_first_layers", "prefill"):
        real = getattr(rt, name)

        def spy(ids, *a, _real=real, _name=name, **k):
            record.append((_name, len(ids)))
            return _real(ids, *a, **k)
        setattr(rt, name, spy)
    real_stepper = rt.stepper

    def stepper(past):
        s = real_stepper(past)
        real_feed = s.feed

        def feed(ids):
            record.append(("feed", len(ids)))
            return real_feed(ids)
        s.feed = feed
        return s
    rt.stepper = stepper
    return rt


@pytest.mark.parametrize("repair", ["ratio:0.5", "first:40", "ratio:1", "first:1048576"])
def test_a_paced_repair_runs_no_pass_longer_than_the_chunk_and_equals_the_one_pass_repair(repair):
    rt = zoo.load("tiny-llama", dtype="float32")
    ids = [3 + (i * 7) % 200 for i in range(300)]
    _, cache = rt.prefill(ids)
    one, step_one = drop(rt, cache, [(40, 60)], repair=repair)
    passes, calls = [], []
    _passes(rt, passes)
    paced, step_paced = drop(rt, cache, [(40, 60)], repair=repair,
                             pace=Pace(chunk=16, between=lambda: calls.append(len(passes))))
    assert step_paced == step_one and step_one.recomputed > 16
    assert passes and max(n for _, n in passes) <= 16   # no pass runs more than a chunk of new tokens
    assert len(calls) >= len(passes)                    # the turn may pass before every one of them
    assert paced.token_ids == one.token_ids and paced.start == one.start and paced.gaps == one.gaps
    assert paced.max_abs_diff(one) < 1e-4               # the same K/V, within the rounding of a split pass
    assert paced.edits == one.edits


def test_a_repair_level_reads_back_to_the_value_it_was_given():
    from c2c.runtime.edit import Repair

    for text in ("first:1048576", "first:3", "ratio:1", "ratio:0.25", "ratio:0.123456789", "none"):
        level = Repair.parse(text)
        assert Repair.parse(str(level)) == level
    assert str(Repair.parse("first:1048576")) == "first:1048576"  # was 'first:1.04858e+06', refused on reading
