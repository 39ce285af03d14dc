"""Advisor: predict text-path and cache-path latency of a hop (costs only; the rules are decide()'s).

Inputs are calibrated per machine and model (:func:`c2c.bench.calibrate.calibrate`, cached under
``C2C_HOME/calibration``). Costs depend on where in the context a step runs,
so the model has a term for it (``T`` new tokens after ``past`` cached ones)::

    prefill_s(T, past) = fixed + per_token*T + per_pair*T*(past + (T-1)/2) + per_past*past
    decode_s(n, start) = sum over the n steps i of (per_step + per_position*(start + i))
    cache_handoff_s(B)  = piecewise linear in the artifact's bytes B through measured points
                          (+ B*8 / link bandwidth, + sampled verification)

``per_pair`` is attention (each new token looks at every earlier one); ``per_past``
is handing the cache to the model on every call. The cache handoff is measured
on the real path (export, write, read, import) at several sizes and
interpolated, because its cost need not be linear in the bytes (page cache).
The user supplies the link bandwidth between agents.

Of the four criteria of the sources (long context, one trust domain, one model or a
trained fuser, a short chain) the advisor measures only the first: whether the cache
path is actually faster. :func:`c2c.handoff.decide` applies all four, with the
advisor's :class:`Advice` as its ``advisor`` check, so every hop (and ``c2c advise``)
is decided by the same rules and the same hop limit.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Sequence

from c2c._io import write_atomic
from c2c.config import c2c_home
from c2c.errors import ConfigError

# Shape of a typical hop, in tokens (as in c2c.bench.handoff): chat-turn wrapping,
# a role prompt, and the instruction that asks for the message or the answer.
TURN_OVERHEAD_TOKENS = 12
ROLE_TOKENS = 24
INSTRUCTION_TOKENS = 32
CALIBRATION_VERSION = 2


@dataclass(frozen=True, kw_only=True)
class Calibration:
    """Measured costs of one model on one machine (see the module docstring for the formulas)."""

    model: str
    prefill_s_fixed: float          # seconds per prefill call, independent of length
    prefill_s_per_token: float      # seconds per prefilled token
    prefill_s_per_pair: float       # seconds per (new token, earlier token) pair: attention
    prefill_s_per_past: float       # seconds per token already cached, per call
    decode_s_per_token: float       # one greedy step with an empty cache
    decode_s_per_position: float    # extra seconds per step per cached token
    kv_bytes_per_token: int
    handoff_points: tuple           # ((artifact bytes, seconds), ...) of local cache handoffs, by size
    verify_sample_s: float = 0.0    # one sampled-verification position (one decode step)
    version: int = CALIBRATION_VERSION
    machine: dict = field(default_factory=dict)
    created: str = ""

    def prefill_s(self, tokens: int, past: int = 0) -> float:
        T = tokens
        return (self.prefill_s_fixed + self.prefill_s_per_token * T
                + self.prefill_s_per_pair * T * (past + (T - 1) / 2) + self.prefill_s_per_past * past)

    def decode_s(self, steps: int, start: int) -> float:
        """``steps`` greedy steps, the first fed at position ``start``."""
        n = max(steps, 0)
        return n * self.decode_s_per_token + self.decode_s_per_position * (n * start + n * (n - 1) / 2)

    def __post_init__(self):
        pts = tuple(sorted((int(b), float(t)) for b, t in self.handoff_points))
        if not pts:
            raise ConfigError("a calibration needs at least one measured cache handoff")
        object.__setattr__(self, "handoff_points", pts)

    @property
    def handoff_gbps(self) -> float:
        """Artifact throughput of a local cache handoff (export + write + read + import), GB/s."""
        b, t = self.handoff_points[-1]
        return b / max(t, 1e-12) / 1e9

    def local_handoff_s(self, nbytes: int) -> float:
        """Interpolated between the measured sizes; beyond them, the nearest segment's slope."""
        pts = self.handoff_points
        if len(pts) == 1:
            return pts[0][1] * nbytes / max(pts[0][0], 1)
        i = next((k for k in range(1, len(pts) - 1) if nbytes <= pts[k][0]), len(pts) - 1)
        (b0, t0), (b1, t1) = pts[i - 1], pts[i]
        return max(t0 + (t1 - t0) * (nbytes - b0) / max(b1 - b0, 1), 0.0)

    def cache_move_s(self, nbytes: int, bandwidth_gbps: float | None) -> float:
        s = self.local_handoff_s(nbytes)
        if bandwidth_gbps:
            s += nbytes * 8 / (bandwidth_gbps * 1e9)
        return s


@dataclass(frozen=True, kw_only=True)
class Advice:
    """Predicted seconds of both paths of one hop (and of its two-agent pipeline), and the bytes moved."""

    text_handoff_s: float
    cache_handoff_s: float
    text_pipeline_s: float
    cache_pipeline_s: float
    artifact_bytes: int
    message_tokens: int

    @property
    def cache_is_faster(self) -> bool:
        return self.cache_handoff_s < self.text_handoff_s

    @property
    def note(self) -> str:
        """One line comparing the two handoffs (the ``advisor`` check's detail)."""
        if self.cache_is_faster:
            return (f"advisor predicts cache {self.cache_handoff_s * 1e3:.0f} ms vs text {self.text_handoff_s:.2f} s "
                    f"for a {self.message_tokens}-token message")
        return (f"advisor: moving {self.artifact_bytes / 1e6:.1f} MB of K/V ({self.cache_handoff_s:.3f}s) costs "
                f"more than writing and reading {self.message_tokens} tokens ({self.text_handoff_s:.3f}s)")

    def to_dict(self) -> dict:
        return {**asdict(self), "cache_is_faster": self.cache_is_faster}


def advise(cal: Calibration, *, message_tokens: int, context_tokens: int, bandwidth_gbps: float | None = None,
           answer_tokens: int = 16, prefix_tokens: int = 60, verify_samples: int = 0) -> Advice:
    """Predict both paths of one hop (and its whole two-agent pipeline).

    The pipeline is the one of :mod:`c2c.bench.handoff`: the sender reads its role,
    ``context_tokens`` of material and its ``message_tokens`` of notes; then either
    it writes the message and the receiver reads it (text), or the receiver takes
    the sender's cache (cache); then the receiver answers ``answer_tokens`` tokens.
    """
    if message_tokens < 1 or context_tokens < 0:
        raise ConfigError("message_tokens must be ≥ 1 and context_tokens ≥ 0")
    N, C, K, P0 = message_tokens, context_tokens, answer_tokens, prefix_tokens
    R, O, I = ROLE_TOKENS, TURN_OVERHEAD_TOKENS, INSTRUCTION_TOKENS
    pf, dec = cal.prefill_s, cal.decode_s
    # the sender reads its role turn, the material, its notes (one prefill each)
    read = pf(R, P0) + pf(C + O, P0 + R) + pf(N + O, P0 + R + C + O)
    S = P0 + R + C + N + 2 * O                       # tokens in the sender's cache
    # text: the sender writes N tokens (the first comes from the instruction's prefill),
    # the receiver (after its own role turn) reads them
    text_handoff = pf(I, S) + dec(N - 1, S + I) + pf(N + O, P0 + R)

    def answer(at: int) -> float:  # the receiver's question, then K greedy tokens
        return pf(I, at) + dec(K - 1, at + I)

    nbytes = cal.kv_bytes_per_token * S
    cache_handoff = cal.cache_move_s(nbytes, bandwidth_gbps) + verify_samples * cal.verify_sample_s
    text_pipeline = read + text_handoff + answer(P0 + R + N + O)
    # after a cache handoff the receiver still reads its own role turn before answering
    cache_pipeline = read + cache_handoff + pf(R, S) + answer(S + R)
    return Advice(text_handoff_s=text_handoff, cache_handoff_s=cache_handoff, text_pipeline_s=text_pipeline,
                  cache_pipeline_s=cache_pipeline, artifact_bytes=nbytes, message_tokens=N)


# ------------------------------------------------------------------ calibration
def calibration_name(model: str, dtype: str = "float32", backend: str = "transformers") -> str:
    """What a calibration is saved under: the model's name, with its dtype and backend unless they are
    the reference (fp32 on transformers, so calibrations made before dtypes keep their name).
    A bf16 or llama.cpp runtime runs at other speeds, so it has its own calibration."""
    if backend != "transformers":
        return f"{model}@{backend}"
    return model if dtype == "float32" else f"{model}@{dtype}"


def runtime_calibration_name(runtime) -> str:
    """:func:`calibration_name` of a loaded runtime."""
    return calibration_name(runtime.name, str(runtime.dtype).replace("torch.", ""), runtime.engine_id.kind)


def calibration_path(model: str) -> Path:
    d = c2c_home() / "calibration"
    d.mkdir(parents=True, exist_ok=True)
    return d / f"{model.replace('/', '_')}.json"


def load_calibration(model: str) -> Calibration | None:
    """The saved calibration of ``model`` on this machine, or ``None`` (absent or from an older version)."""
    p = calibration_path(model)
    try:
        cal = Calibration(**json.loads(p.read_text()))
    except (OSError, ValueError, TypeError):
        return None
    return cal if cal.version == CALIBRATION_VERSION else None


def save_calibration(cal: Calibration) -> Path:

    p = calibration_path(cal.model)
    write_atomic(p, json.dumps(asdict(cal), indent=2).encode())
    return p


def fit_nonnegative(rows: Sequence[Sequence[float]], ys: Sequence[float]) -> list[float]:
    """Least squares ``rows @ x ≈ ys`` with ``x ≥ 0`` (drop the most negative coefficient, refit)."""
    import torch  # lazy: c2c.advise imports without torch

    active = list(range(len(rows[0])))
    x = [0.0] * len(rows[0])
    while active:
        A = torch.tensor([[r[j] for j in active] for r in rows], dtype=torch.float64)
        b = torch.tensor(list(ys), dtype=torch.float64)[:, None]
        sol = torch.linalg.lstsq(A, b, driver="gelsd").solution[:, 0].tolist()
        worst = min(range(len(active)), key=lambda i: sol[i])
        if sol[worst] >= 0:
            for j, v in zip(active, sol):
                x[j] = v
            break
        active.pop(worst)
    return x
