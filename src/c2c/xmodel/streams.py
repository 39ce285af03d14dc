"""Token streams to fit a map on: the instruction corpora of ``$C2C_DATA/train``, rendered as chat.

Each stream is a system turn followed by user/assistant turns of consecutive examples,
cut at ``seq_len`` tokens, so the map sees the chat template's tokens and the deep
positions a long context reaches. Examples are used once: no two streams share one,
so a stream held out for calibration or testing holds text the fit never saw.

NOTE: LIMA is left out on purpose: the context-QA benchmark (:mod:`c2c.bench.context_qa`)
draws its documents from it, and a map is evaluated there.
"""

from __future__ import annotations

import json
import random

from c2c.config import data_dir
from c2c.errors import ConfigError

CORPORA = ("alpaca_en_demo.json", "dolly_hhrlhf_train_small.jsonl")
SYSTEM = "You are a helpful assistant."


def examples(*, seed: int = 0) -> list[tuple[str, str]]:
    """(instruction, response) pairs of every corpus in :data:`CORPORA`, shuffled with ``seed``."""
    out: list[tuple[str, str]] = []
    root = data_dir() / "train"
    for name in CORPORA:
        path = root / name
        try:
            text = path.read_text()
        except OSError:
            raise ConfigError(f"cannot read {path}; set C2C_DATA to the shared data folder") from None
        rows = json.loads(text) if name.endswith(".json") else [json.loads(x) for x in text.splitlines() if x.strip()]
        for r in rows:
            if "output" in r:  # alpaca: {instruction, input, output}
                q, a = f"{r['instruction']}\n{r.get('input', '')}".strip(), r["output"]
            else:              # dolly: {prompt (in an instruction template), response}
                p = r["prompt"]
                q = p.split("### Instruction:\n", 1)[-1].split("\n\n### Response:", 1)[0].strip()
                a = r.get("response", "")
            if q and a:
                out.append((q, a))
    random.Random(seed).shuffle(out)
    return out


def instructions(n: int, *, seed: int = 0, max_chars: int = 1500) -> list[str]:
    """``n`` distinct instructions of the training corpora (:func:`examples`' order with ``seed``), none
    longer than ``max_chars``.

    Raises:
        ConfigError: the corpora hold fewer such instructions.
    """
    out: list[str] = []
    seen: set[str] = set()
    for q, _ in examples(seed=seed):
        if q not in seen and len(q) <= max_chars:
            seen.add(q)
            out.append(q)
        if len(out) == n:
            return out
    raise ConfigError(f"the corpora hold only {len(out)} distinct instructions of at most {max_chars} characters; "
                      f"ask for fewer than {n}")

def token_streams(runtime, n_tokens: int, *, seq_len: int = 1024, seed: int = 0) -> list[list[int]]:
    """Streams of exactly ``seq_len`` token ids of ``runtime``'s tokenizer, ``n_tokens`` in all (rounded up).

    Raises:
        ConfigError: the corpora hold fewer tokens than asked for.
    """
    if seq_len < 8 or n_tokens < 1:
        raise ConfigError(f"seq_len={seq_len}, n_tokens={n_tokens}: give seq_len >= 8 and n_tokens >= 1")
    pool = examples(seed=seed)
    head = runtime.encode(runtime.render_turn("system", SYSTEM))
    streams: list[list[int]] = []
    i = 0
    while len(streams) * seq_len < n_tokens:
        ids = list(head)
        while len(ids) < seq_len:
            if i >= len(pool):
                raise ConfigError(f"the corpora ({', '.join(CORPORA)}) hold fewer than {n_tokens} tokens "
                                  f"in {seq_len}-token streams; ask for fewer --tokens")
            q, a = pool[i]
            i += 1
            ids += runtime.encode(runtime.render_turn("user", q) + runtime.render_turn("assistant", a))
        streams.append(ids[:seq_len])
    return streams
