"""Advisor: predict text-path and cache-path latency of a hop, and decide.

Inputs are calibrated per machine and model (:func:`calibrate`, cached under
``C2C_HOME/calibration``): decode seconds per token, prefill cost as a linear
function of tokens, K/V bytes per token, artifact serialization and disk I/O
throughput. The user supplies the link bandwidth between agents.

The decision applies the four criteria of the sources:

1. long context / frequent collaboration: the cache path must actually be faster;
2. one trust domain: across domains, always text;
3. one model, or a trained fuser for the pair;
4. a short chain: beyond the hop limit, text with reference ids.
"""

from __future__ import annotations

import json
import os
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from c2c.errors import ConfigError
from c2c.home import c2c_home

# Shape of a typical hop, in tokens (as in c2c.bench.handoff): chat-turn wrapping,
# a role prompt, and the instruction that asks for the message or the answer.
TURN_OVERHEAD_TOKENS = 12
ROLE_TOKENS = 24
INSTRUCTION_TOKENS = 32


@dataclass(frozen=True, kw_only=True)
class Calibration:
    """Measured costs of one model on one machine."""

    model: str
    decode_s_per_token: float
    prefill_s_fixed: float        # seconds per prefill call, independent of length
    prefill_s_per_token: float    # seconds per prefilled token
    kv_bytes_per_token: int
    serialize_gbps: float         # encode + decode + validate, GB/s of artifact bytes
    disk_gbps: float              # write (fsync) + read, GB/s
    verify_sample_s: float = 0.0  # one sampled-verification position (one decode step)
    machine: dict = field(default_factory=dict)
    created: str = ""

    def prefill_s(self, tokens: int) -> float:
        return self.prefill_s_fixed + self.prefill_s_per_token * tokens

    def cache_move_s(self, nbytes: int, bandwidth_gbps: float | None) -> float:
        s = nbytes / (self.serialize_gbps * 1e9) + nbytes / (self.disk_gbps * 1e9)
        if bandwidth_gbps:
            s += nbytes * 8 / (bandwidth_gbps * 1e9)
        return s


@dataclass(frozen=True, kw_only=True)
class Advice:
    decision: str                 # "cache" or "text"
    reasons: tuple[str, ...]
    text_handoff_s: float
    cache_handoff_s: float
    text_pipeline_s: float
    cache_pipeline_s: float
    artifact_bytes: int
    criteria: dict[str, bool]

    def to_dict(self) -> dict:
        d = asdict(self)
        d["reasons"] = list(self.reasons)
        return d


def advise(cal: Calibration, *, message_tokens: int, context_tokens: int, hops: int = 1,
           bandwidth_gbps: float | None = None, cross_domain: bool = False, same_model: bool = True,
           fuser_available: bool = False, hop_limit: int = 3, answer_tokens: int = 16,
           prefix_tokens: int = 60, verify_samples: int = 0) -> Advice:
    """Predict both paths of one hop (and its whole two-agent pipeline) and decide."""
    if message_tokens < 1 or context_tokens < 0 or hops < 1:
        raise ConfigError("message_tokens and hops must be ≥ 1, context_tokens ≥ 0")
    N, C, K = message_tokens, context_tokens, answer_tokens
    # the sender reads: its role turn, the material, its notes (one prefill each)
    read = (cal.prefill_s(ROLE_TOKENS) + cal.prefill_s(C + TURN_OVERHEAD_TOKENS)
            + cal.prefill_s(N + TURN_OVERHEAD_TOKENS))
    # the receiver answers: its instruction, then K greedy tokens (the first comes from the prefill)
    answer = cal.prefill_s(INSTRUCTION_TOKENS) + (K - 1) * cal.decode_s_per_token
    text_handoff = (cal.prefill_s(INSTRUCTION_TOKENS) + (N - 1) * cal.decode_s_per_token   # sender writes
                    + cal.prefill_s(N + TURN_OVERHEAD_TOKENS))                               # receiver reads
    nbytes = cal.kv_bytes_per_token * (prefix_tokens + ROLE_TOKENS + C + N + 2 * TURN_OVERHEAD_TOKENS)
    cache_handoff = cal.cache_move_s(nbytes, bandwidth_gbps) + verify_samples * cal.verify_sample_s
    text_pipeline = read + text_handoff + answer
    # after a cache handoff the receiver still reads its own role turn before answering
    cache_pipeline = read + cache_handoff + cal.prefill_s(ROLE_TOKENS) + answer
    criteria = {
        "cache_is_faster": cache_handoff < text_handoff,
        "one_trust_domain": not cross_domain,
        "compatible_models": same_model or fuser_available,
        "short_chain": hops <= hop_limit,
    }
    reasons = []
    if cross_domain:
        reasons.append("agents are in different trust domains: caches never cross, use text")
    if not (same_model or fuser_available):
        reasons.append("different models and no trained fuser for the pair: use text")
    if hops > hop_limit:
        reasons.append(f"chain of {hops} hops exceeds the limit of {hop_limit}: text with reference ids")
    if not criteria["cache_is_faster"]:
        reasons.append(f"moving {nbytes / 1e6:.1f} MB of K/V ({cache_handoff:.3f}s) costs more than "
                       f"writing and reading {N} tokens ({text_handoff:.3f}s)")
    decision = "cache" if all(criteria.values()) else "text"
    if decision == "cache":
        reasons.append(f"cache handoff {cache_handoff:.3f}s vs text {text_handoff:.2f}s "
                       f"({text_handoff / max(cache_handoff, 1e-9):.0f}x); same domain, compatible models, "
                       f"{hops} hop(s) within the limit of {hop_limit}")
    return Advice(decision=decision, reasons=tuple(reasons), text_handoff_s=text_handoff,
                  cache_handoff_s=cache_handoff, text_pipeline_s=text_pipeline, cache_pipeline_s=cache_pipeline,
                  artifact_bytes=nbytes, criteria=criteria)


# ------------------------------------------------------------------ calibration
def calibration_path(model: str) -> Path:
    d = c2c_home() / "calibration"
    d.mkdir(parents=True, exist_ok=True)
    return d / f"{model.replace('/', '_')}.json"


def load_calibration(model: str) -> Calibration | None:
    p = calibration_path(model)
    try:
        return Calibration(**json.loads(p.read_text()))
    except (OSError, ValueError, TypeError):
        return None


def save_calibration(cal: Calibration) -> Path:
    from c2c.artifact import write_atomic

    p = calibration_path(cal.model)
    write_atomic(p, json.dumps(asdict(cal), indent=2).encode())
    return p


def calibrate(runtime, *, short: int = 64, long: int = 512, decode_tokens: int = 16, repeats: int = 2) -> Calibration:
    """Measure this machine's costs for ``runtime`` (takes a few seconds to a minute)."""
    import torch

    from c2c.artifact import Artifact
    from c2c.fingerprint import Fingerprint
    from c2c.prefix import PrefixRef

    base = runtime.encode("The quick brown fox jumps over the lazy dog. " * (long // 8 + 8))
    if len(base) < long:
        raise ConfigError("calibration text too short for the tokenizer")

    def typical(fn) -> float:
        # NOTE: the mean, not the minimum: predictions are compared with single runs
        # measured under the same machine load.
        times = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
        return sum(times) / len(times)

    runtime.prefill(base[:short])  # warm-up
    t_short = typical(lambda: runtime.prefill(base[:short]))
    t_long = typical(lambda: runtime.prefill(base[:long]))
    per_tok = max((t_long - t_short) / (long - short), 1e-9)
    fixed = max(t_short - per_tok * short, 0.0)
    _, ctx = runtime.prefill(base[:long])
    gens = [runtime.generate(base[long:long + 1], ctx, max_new_tokens=decode_tokens, min_new_tokens=decode_tokens)
            for _ in range(repeats)]
    decode = max(sum(g.decode_s for g in gens) / len(gens) / max(decode_tokens - 1, 1), 1e-6)
    fp = Fingerprint.of(runtime)
    from c2c.artifact import write_atomic

    def serialize():  # what a handoff does to the bytes besides disk I/O: build (digest), encode, decode
        Artifact.decode(Artifact.build(ctx, fingerprint=fp, prefix=PrefixRef.of(base[:8])).encode())

    data = Artifact.build(ctx, fingerprint=fp, prefix=PrefixRef.of(base[:8])).encode()
    ser = typical(serialize)
    with tempfile.TemporaryDirectory() as d:
        p = Path(d) / "cal.c2c"
        disk = typical(lambda: (write_atomic(p, data), p.read_bytes()))
    step = typical(lambda: runtime.prefill(base[long:long + 1], ctx))
    return Calibration(
        model=runtime.name, decode_s_per_token=decode, prefill_s_fixed=fixed, prefill_s_per_token=per_tok,
        kv_bytes_per_token=ctx.nbytes // ctx.seq_len, serialize_gbps=len(data) / ser / 1e9,
        disk_gbps=len(data) / disk / 1e9, verify_sample_s=step,
        machine={"cpus": os.cpu_count(), "torch_threads": torch.get_num_threads(), "device": str(runtime.device)},
        created=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    )
