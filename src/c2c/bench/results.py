"""How a benchmark leaves its results: ``PREFIX.json``, ``PREFIX.md``, per-item records ``PREFIX.jsonl``
and a plot ``PREFIX.png``. Every script under ``benchmarks/`` writes through :func:`write`, so every
result file has one format (JSON indented by two, no trailing newline), is replaced whole (two runs
that finish together never leave a mixed file), and one rule gives the exit status."""

from __future__ import annotations

import json
import os
import platform
from pathlib import Path
from typing import Any, Callable, Iterable

from c2c._io import write_atomic
from c2c.runtime.numerics import machine_record


def write(prefix: str | Path, result: dict[str, Any], markdown: str, *,
          records: Iterable[dict[str, Any]] | None = None, plot: Callable[[Path], None] | None = None,
          echo: bool = True) -> int:
    """Write the result files, print the table, and return the exit status (0 when every acceptance holds).

    Args:
        prefix: the path without its suffix (``benchmarks/results/store``); a suffix given is replaced.
        records: one JSON line each, to ``PREFIX.jsonl``.
        plot: draws the figure into the path it is given (``PREFIX.png``), after the other files.
        echo: print the markdown (a script that prints its own summary passes False).
    """
    out = Path(prefix)
    out.parent.mkdir(parents=True, exist_ok=True)
    if records is not None:
        write_atomic(out.with_suffix(".jsonl"), "".join(json.dumps(r) + "\n" for r in records).encode(),
                     durable=False)
    write_atomic(out.with_suffix(".json"), json.dumps(result, indent=2).encode(), durable=False)
    write_atomic(out.with_suffix(".md"), markdown.encode(), durable=False)
    if plot is not None:
        plot(out.with_suffix(".png"))
    if echo:
        print(markdown)
    return 0 if all(result.get("acceptance", {}).values()) else 1


def machine() -> dict[str, Any]:
    """The machine as a result records it: :func:`c2c.runtime.numerics.machine_record` (CPU model, vendor,
    the flags that choose kernels), with ``cpu`` (the model), ``cores``, ``bf16_flags`` (what
    ``grep -o 'amx_bf16\\|avx512_bf16' /proc/cpuinfo`` finds), ``amx_bf16``, ``avx512_bf16``, the load
    average now and the Python version."""
    m = machine_record()
    flags = set(m["cpu_flags"])
    return {**m, "cpu": m["cpu_model"], "cores": os.cpu_count(), "bf16_flags": sorted(flags & {"amx_bf16", "avx512_bf16"}),
            "amx_bf16": "amx_bf16" in flags, "avx512_bf16": "avx512_bf16" in flags, "load_avg": os.getloadavg(),
            "python": platform.python_version()}


def read_records(path: Path, keep: Callable[[dict], bool] = lambda r: True) -> dict[tuple[str, str], dict]:
    """The records a resumable benchmark wrote to ``path`` (JSON lines), by ``(id, condition)``: those
    ``keep`` accepts (e.g. of the same map), the last of each pair. Empty when there is no file yet."""
    done: dict[tuple[str, str], dict] = {}
    if path.is_file():
        for line in path.read_text().splitlines():
            if line.strip():
                r = json.loads(line)
                if keep(r):
                    done[r["id"], r["condition"]] = r
    return done
