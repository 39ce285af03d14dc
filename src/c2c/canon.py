"""Canonical bytes and digests: what c2c hashes and signs, the same on every machine.

- :func:`canonical_json`: sorted keys, no spaces, UTF-8, no NaN. The one
  serialization of anything that is hashed or signed (headers, signatures,
  fingerprints, configs).
- :func:`sha256_hex`, :func:`token_digest` (token ids as little-endian uint32),
  :func:`weights_digest` (a model's weight files, memoized beside them).
- :func:`utc_now`: timestamps as ``YYYY-MM-DDTHH:MM:SS.ffffffZ``.
- :func:`check_utf8`, :func:`non_utf8_at`: text that encodes as UTF-8 (JSON's
  ``"\\ud800"`` decodes to a lone surrogate, which does not), checked before it
  reaches a tokenizer or a database.

Never Python's ``hash()`` or pickle: these values cross processes and machines.
"""

from __future__ import annotations

import hashlib
import json
import struct
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, NewType, Sequence

from c2c._io import write_atomic
from c2c.errors import ArtifactWriteError, ConfigError

Sha256Hex = NewType("Sha256Hex", str)  # 64 lowercase hex characters


def canonical_json(obj: Any) -> bytes:
    """The one canonical serialization c2c hashes and signs: sorted keys, no spaces, UTF-8."""
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False,
                      allow_nan=False).encode("utf-8")


def check_format(doc: Any, fmt: str, version: int, *, where: str, what: str,
                 not_it: type[Exception], too_new: type[Exception]) -> dict:
    """``doc`` when it is a JSON object of format ``fmt`` and version ``version`` (a file's header or config).

    Raises ``not_it`` (another format, or no object) or ``too_new`` (another version), naming ``where``
    (the file) and ``what`` (the kind of file, e.g. "c2c map").
    """
    if not isinstance(doc, dict) or doc.get("format") != fmt:
        raise not_it(f"{where} is not a {what} (format is not {fmt!r})")
    if doc.get("version") != version:
        raise too_new(f"{where}: {what} version {doc.get('version')!r}; this build reads {version}")
    return doc


def check_utf8(text: str, what: str) -> str:
    """``text`` if it encodes as UTF-8 (no lone surrogates), else :class:`ConfigError` naming ``what``."""
    where = non_utf8_at(text)
    if where is not None:
        raise ConfigError(f"{what} is not valid UTF-8 (it holds a lone surrogate such as \\ud800); "
                          "send text that encodes as UTF-8")
    return text


def non_utf8_at(value: Any) -> str | None:
    """The path (``messages.0.content``; ``""`` for ``value`` itself) of the first string in ``value``,
    a key included, that does not encode as UTF-8; None when every string does. The path itself is
    always valid UTF-8 (a bad key is shown escaped), so it can go into an error message.

    Walks dicts, lists and tuples without recursion, so any depth the JSON parser accepted is fine.
    """
    todo: list[tuple[Any, str]] = [(value, "")]
    while todo:
        v, where = todo.pop()
        if isinstance(v, str):
            if not v.isascii():
                try:
                    v.encode("utf-8")
                except UnicodeEncodeError:
                    return where
        elif isinstance(v, dict):
            for k, x in v.items():
                part = ascii(k) if isinstance(k, str) and non_utf8_at(k) is not None else str(k)
                todo.append((k, f"{where}.{part}" if where else part))
                todo.append((x, f"{where}.{part}" if where else part))
        elif isinstance(v, (list, tuple)):
            todo.extend((x, f"{where}.{i}" if where else str(i)) for i, x in enumerate(v))
    return None


def sha256_hex(data: bytes) -> Sha256Hex:
    return Sha256Hex(hashlib.sha256(data).hexdigest())


def token_digest(token_ids: Sequence[int]) -> Sha256Hex:
    """sha256 of token ids packed as little-endian uint32."""
    return sha256_hex(struct.pack(f"<{len(token_ids)}I", *token_ids))


def utc_now() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def files_digest(files: list[Path], memo: Path, *, named: bool = True) -> str:
    """sha256 over ``files`` (each name, with ``named``, then its bytes), remembered in ``memo``
    keyed by the files' names, sizes and mtimes, so a model is hashed once per change."""
    key = [[p.name, p.stat().st_size, p.stat().st_mtime_ns] for p in files]
    try:
        cached = json.loads(memo.read_text())
        if cached.get("key") == key:
            return cached["digest"]
    except (OSError, ValueError):
        pass
    h = hashlib.sha256()
    for p in files:
        if named:
            h.update(p.name.encode())
        with open(p, "rb") as f:
            while block := f.read(1 << 24):
                h.update(block)
    digest = h.hexdigest()
    try:
        write_atomic(memo, json.dumps({"key": key, "digest": digest}).encode(), durable=False)
    except ArtifactWriteError:
        pass  # NOTE: a read-only model dir just means we hash again next time
    return digest


def weights_digest(path: Path | None, model=None) -> str:
    """sha256 over a model's weight files, cached next to them keyed by size and mtime.

    Falls back to hashing the in-memory parameters when there is no directory.
    """
    if path is not None:
        files = sorted(Path(path).glob("*.safetensors"))
        if files:
            return files_digest(files, Path(path) / "c2c-weights.sha256.json")
    if model is None:
        raise ValueError("weights_digest needs a model directory or a model")
    import torch  # lazy: only when hashing in-memory weights; canon imports without torch

    h = hashlib.sha256()
    for name, t in sorted(model.state_dict().items()):
        h.update(name.encode())
        h.update(t.detach().cpu().contiguous().view(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()
