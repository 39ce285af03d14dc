"""How a benchmark leaves its results: ``PREFIX.json``, ``PREFIX.md``, and per-item records ``PREFIX.jsonl``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Iterable


def write(prefix: str | Path, result: dict[str, Any], markdown: str, *,
          records: Iterable[dict[str, Any]] | None = None) -> int:
    """Write the result files, print the table, and return the exit status (0 when every acceptance holds)."""
    out = Path(prefix)
    out.parent.mkdir(parents=True, exist_ok=True)
    if records is not None:
        out.with_suffix(".jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    out.with_suffix(".json").write_text(json.dumps(result, indent=2))
    out.with_suffix(".md").write_text(markdown)
    print(markdown)
    return 0 if all(result.get("acceptance", {}).values()) else 1
