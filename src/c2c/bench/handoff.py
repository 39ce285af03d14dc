"""Benchmark one analyst -> writer handoff three ways in one run: text, full cache, slice.

The analyst reads a document of about ``context_tokens`` tokens, then its own
notes of about ``message_tokens`` tokens (its conclusion). The writer must then
answer a question with ``answer_tokens`` greedy tokens.

- text:  the analyst writes an ``message_tokens``-token message (decode), the
  writer reads it (prefill) and answers.
- full:  the writer continues from the analyst's whole cache and answers.
- slice: only the notes span is exported and attached after the writer's prefix.

``exact`` is true when the writer's answer after the full handoff (through
artifact bytes) is token for token the answer of a writer handed the analyst's
very tensors in memory (:class:`~c2c.handoff.SharedTransport`): the bytes changed
nothing. ``exact_vs_one_prefill`` compares with prefilling all of the writer's
tokens in one pass instead; that also depends on the runtime giving the same
numbers for one prefill as for a split one, which holds in fp32 here but not in
bf16 (oneDNN's kernels round differently for other row counts).
"""

from __future__ import annotations

import json
import os
import platform
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from c2c.artifact.prefix import SharedPrefix
from c2c.config import data_dir
from c2c.errors import ConfigError, RuntimeUnsupportedError
from c2c.handoff import DirectoryTransport, SharedTransport, hand_off
from c2c.runtime.protocol import Runtime
from c2c.team.agent import Agent, Team


SYSTEM = ("You are one agent of a small software team. Agents pass work to each other; "
          "be precise and brief.")
ANALYST_ROLE = "You are the analyst. Read the material and write down the facts that matter."
WRITER_ROLE = "You are the writer. Turn the analyst's findings into a short answer for the user."
QUESTION = "Based on the analyst's notes, what is the single most important point? Answer in one sentence."


@dataclass(frozen=True, kw_only=True)
class HandoffBenchConfig:
    message_tokens: int = 256
    context_tokens: int = 512
    answer_tokens: int = 16


def corpus_text(n_chars: int = 200_000) -> str:
    """Real English text: the outputs of the LIMA instruction corpus in ../shared/data."""
    path = data_dir() / "train" / "lima.json"
    try:
        rows = json.loads(path.read_text())
    except OSError:
        raise ConfigError(f"cannot read {path}; set C2C_DATA to the shared data folder") from None
    text = "\n\n".join(r["output"] for r in rows if r.get("output"))
    return text[:n_chars]


def take_tokens(runtime: Runtime, text: str, n: int) -> str:
    """A prefix of ``text`` that is about ``n`` tokens long for ``runtime``'s tokenizer."""
    ids = runtime.encode(text[: n * 8])
    if len(ids) < n:
        raise ConfigError(f"not enough text for {n} tokens")
    return runtime.decode(ids[:n])


def run(runtime: Runtime, cfg: HandoffBenchConfig, *, workdir: Path | None = None) -> dict:
    """Run the three pipelines once each; returns the flat result dict (see module doc)."""
    if cfg.message_tokens < 1 or cfg.context_tokens < 1 or cfg.answer_tokens < 1:
        raise ConfigError("message, context and answer token counts must be positive")
    text = corpus_text()
    document = take_tokens(runtime, text, cfg.context_tokens)
    notes = take_tokens(runtime, text[len(document) + 1:], cfg.message_tokens)
    team = Team(shared=SharedPrefix.build(SYSTEM, tools=["python", "search"], context={"task": "handoff-bench"}))
    team.prefix_cache(runtime)  # warm: every pipeline reuses the shared-prefix cache
    transport = DirectoryTransport(workdir)
    K = cfg.answer_tokens

    def analyst() -> tuple[Agent, float]:
        a = Agent("analyst", runtime, team, role=ANALYST_ROLE)
        t0 = time.perf_counter()
        a.read("Material:\n" + document, label="evidence", private=False)
        a.read("My notes:\n" + notes, label="notes", private=False)
        return a, time.perf_counter() - t0

    out: dict = {"model": runtime.name, **asdict(cfg)}
    # --- text --------------------------------------------------------------
    a, read_s = analyst()
    b = Agent("writer", runtime, team, role=WRITER_ROLE)
    h = hand_off(a, b, mode="text", message_tokens=cfg.message_tokens, min_message_tokens=cfg.message_tokens,
                 message_prompt="Write the notes above as a message for the writer.")
    t0 = time.perf_counter()
    g_text = b.respond(QUESTION, max_new_tokens=K, min_new_tokens=K)
    answer_s = time.perf_counter() - t0
    out.update(text_pipeline_s=read_s + h.seconds + answer_s, text_handoff_s=h.seconds,
               text_tokens_decoded=h.tokens_decoded, text_tokens_prefilled=h.tokens_prefilled,
               text_answer=g_text.text)
    # --- full cache ----------------------------------------------------------
    a, read_s = analyst()
    b = Agent("writer", runtime, team, role=WRITER_ROLE)
    h = hand_off(a, b, mode="full", transport=transport)
    # NOTE: a cache handoff takes tens of milliseconds, where one fsync can double it:
    # its time is the median of five handoffs of the same cache to fresh writers.
    handoff_s = _median([h.seconds] + [hand_off(a, Agent("writer", runtime, team, role=WRITER_ROLE), mode="full",
                                                transport=transport).seconds for _ in range(4)])
    t0 = time.perf_counter()
    g_full = b.respond(QUESTION, max_new_tokens=K, min_new_tokens=K)
    answer_s = time.perf_counter() - t0
    out.update(cache_pipeline_s=read_s + handoff_s + answer_s, cache_handoff_s=handoff_s,
               artifact_bytes=h.artifact_bytes, cache_tokens=a.cache.seq_len, cache_answer=g_full.text,
               cache_timings=h.timings)
    # exactness: a writer handed the analyst's very tensors (no bytes) answers the same
    twin = Agent("writer", runtime, team, role=WRITER_ROLE)
    hand_off(a, twin, mode="full", transport=SharedTransport())
    out["exact"] = twin.respond(QUESTION, max_new_tokens=K, min_new_tokens=K).token_ids == g_full.token_ids
    # and the writer prefilling the very same tokens itself, in one pass
    # what the reply was generated from: the conversation before its message, and the generation prompt
    fed = b.context.token_ids[:b.context.spans[-1].start] + tuple(runtime.encode(runtime.generation_prompt()))
    ref = runtime.generate(fed, max_new_tokens=K, min_new_tokens=K)
    out["exact_vs_one_prefill"] = ref.token_ids == g_full.token_ids
    # the forward passes the cache pipeline cannot avoid, for its compute bound (c2c.bench.limits): the
    # analyst's reads after the shared prefix, the writer's own tokens after the received cache, and the
    # answer's decode steps (its first token comes from the prefill's logits)
    prefix = team.prefix_cache(runtime).seq_len
    out["cache_passes"] = {"prefill": [[a.cache.seq_len - prefix, prefix],
                                       [len(fed) - a.cache.seq_len, a.cache.seq_len]],
                           "decode_steps": len(g_full.token_ids) - 1,
                           "decode_context": len(fed) + (len(g_full.token_ids) - 2) // 2}   # the mean step's past
    # --- slice ---------------------------------------------------------------
    a, read_s = analyst()
    b = Agent("writer", runtime, team, role=WRITER_ROLE)
    try:
        h = hand_off(a, b, mode="slice", labels=("notes",), transport=transport)
    except RuntimeUnsupportedError as e:  # e.g. the llama.cpp backend does not re-position slices
        out.update(slice_pipeline_s=None, slice_handoff_s=None, slice_artifact_bytes=None, slice_answer=None,
                   slice_unsupported=str(e))
    else:
        handoff_s = _median([h.seconds] + [hand_off(a, Agent("writer", runtime, team, role=WRITER_ROLE),
                                                    mode="slice", labels=("notes",), transport=transport).seconds
                                           for _ in range(4)])
        t0 = time.perf_counter()
        g_slice = b.respond(QUESTION, max_new_tokens=K, min_new_tokens=K)
        answer_s = time.perf_counter() - t0
        out.update(slice_pipeline_s=read_s + handoff_s + answer_s, slice_handoff_s=handoff_s,
                   slice_artifact_bytes=h.artifact_bytes, slice_answer=g_slice.text)
    out.update(
        speedup_full=out["text_pipeline_s"] / out["cache_pipeline_s"],
        speedup_slice=out["text_pipeline_s"] / out["slice_pipeline_s"] if out["slice_pipeline_s"] else None,
        handoff_ratio=out["cache_handoff_s"] / out["text_handoff_s"],
        machine={"cpus": os.cpu_count(), "torch_threads": torch.get_num_threads(),
                 "device": str(runtime.device), "dtype": str(runtime.dtype).replace("torch.", ""),
                 "python": platform.python_version(), "torch": torch.__version__},
        created=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    )
    return out


def _median(xs: list[float]) -> float:
    xs = sorted(xs)
    return xs[len(xs) // 2]
