"""Calibrate the advisor on this machine: measure prefill, decode and real cache handoffs.

It runs real handoffs (:func:`c2c.handoff.hand_off`), so it sits above them; the
cost model it feeds is the pure :mod:`c2c.advise`. ``c2c advise`` saves the
result under ``C2C_HOME/calibration``.
"""

from __future__ import annotations

import os
import statistics
import time
from typing import Callable, Sequence

from c2c.advise.cost_model import Calibration, fit_nonnegative, runtime_calibration_name
from c2c.artifact.prefix import SharedPrefix
from c2c.errors import ConfigError
from c2c.handoff import DirectoryTransport, hand_off
from c2c.team.agent import Agent, Team


def _median_time(fn: Callable[[], object], repeats: int) -> float:
    """Median wall time of ``repeats`` calls (a single fsync or scheduler hiccup cannot move it)."""
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def calibrate(runtime, *, short: int = 16, long: int = 512, far: int = 1024, decode_tokens: int = 16,
              repeats: int = 3, handoff_repeats: int = 5) -> Calibration:
    """Measure this machine's costs for ``runtime`` (a few seconds to about a minute)."""
    import torch  # lazy: the module imports without loading torch

    base = runtime.encode("The quick brown fox jumps over the lazy dog. " * (far // 4 + 16))
    if len(base) < far + 2 * long:
        raise ConfigError("calibration text too short for the tokenizer")
    mid = (short + long) // 2
    runtime.prefill(base[:short])  # warm-up
    # prefill: new tokens T after `past` cached ones, several shapes, median of `repeats` each
    _, near_cache = runtime.prefill(base[:long])
    _, far_cache = runtime.prefill(base[:far])
    caches = {0: None, long: near_cache, far: far_cache}
    shapes = [(short, 0), (mid, 0), (long, 0), (short, long), (mid, long), (short, far)]
    ys = [_median_time(lambda T=T, p=p: runtime.prefill(base[p:p + T], caches[p]), repeats) for T, p in shapes]
    fixed, per_tok, per_pair, per_past = fit_nonnegative(
        [[1.0, T, T * (p + (T - 1) / 2), p] for T, p in shapes], ys)
    # decode: greedy steps near the start and far into the context
    steps = []
    for p, ctx in ((short, None), (far, far_cache)):
        g = [runtime.generate(base[p:p + 1], ctx, max_new_tokens=decode_tokens, min_new_tokens=decode_tokens)
             for _ in range(repeats)]
        per_step = statistics.median(x.decode_s for x in g) / max(decode_tokens - 1, 1)
        steps.append((p + 1 + decode_tokens / 2, per_step))   # (mean position of a step, seconds per step)
    (p1, s1), (p2, s2) = steps
    per_pos = max((s2 - s1) / (p2 - p1), 0.0)
    per_step0 = max(s1 - per_pos * p1, 1e-6)
    ladder = sorted({short, *range(256, far, 256), far})
    handoffs = _calibrate_handoff(runtime, base, sizes=ladder, repeats=handoff_repeats)
    step = _median_time(lambda: runtime.prefill(base[long:long + 1], near_cache), repeats)
    return Calibration(
        model=runtime_calibration_name(runtime), prefill_s_fixed=fixed, prefill_s_per_token=per_tok, prefill_s_per_pair=per_pair,
        prefill_s_per_past=per_past, decode_s_per_token=per_step0, decode_s_per_position=per_pos,
        kv_bytes_per_token=near_cache.nbytes // near_cache.seq_len, handoff_points=handoffs, verify_sample_s=step,
        machine={"cpus": os.cpu_count(), "torch_threads": torch.get_num_threads(), "device": str(runtime.device)},
        created=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    )


def _calibrate_handoff(runtime, base: list[int], *, sizes: Sequence[int], repeats: int, pause_s: float = 0.25
                       ) -> tuple[tuple[int, float], ...]:
    """((artifact bytes, median seconds), ...) of real local ``full`` handoffs of senders holding ``sizes`` tokens."""
    team = Team(shared=SharedPrefix.build("Calibration of the c2c advisor."))
    transport = DirectoryTransport()  # what hand_off uses by default: a temporary file per handoff
    senders = []
    for n in sizes:
        sender = Agent("sender", runtime, team, role="Read.")
        sender.read(runtime.decode(base[:n]))
        senders.append(sender)

    def once(sender):
        time.sleep(pause_s)  # NOTE: agents compute between handoffs; back to back, writes queue behind writeback
        return hand_off(sender, Agent("receiver", runtime, team, role="Answer."), mode="full", transport=transport)

    # NOTE: the first handoffs of a process run up to 2x slower (allocator, page cache):
    # warm the whole ladder before measuring any of it.
    for _ in range(2):
        for sender in senders:
            once(sender)
    points = []
    for sender in senders:
        runs = [once(sender) for _ in range(repeats)]
        points.append((runs[0].artifact_bytes, statistics.median(h.seconds for h in runs)))
    return tuple(points)
