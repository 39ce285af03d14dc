"""`Settings`: every ``C2C_*`` environment variable, read in this one place.

=========================  =======================================  =====================================
variable                   meaning                                  default
=========================  =======================================  =====================================
``C2C_HOME``               models, keys, calibrations, the store    ``~/.cache/c2c``
``C2C_DATA``               benchmark and training data              ``../shared/data`` beside the checkout
``C2C_STORE``              store URL (``sqlite:////...``,            the SQLite store under ``C2C_HOME``
                           ``redis://...``)
``C2C_MAX_HOPS``           longest chain a cache may travel; past   ``3``
                           it, handoffs and the store use text
``C2C_MAX_ARTIFACT_BYTES`` largest artifact c2c reads               ``17179869184`` (16 GiB)
``C2C_THREADS``            torch threads for CLI commands (0: all)  ``0``
``C2C_DTYPE``              how models run: ``auto`` (bf16 where     ``auto``
                           the CPU or GPU has it), ``float32``,
                           ``bfloat16``, ``float16``
``C2C_MALLOC_TUNE``        ``0`` stops the CLI from tuning glibc's   ``1``
                           malloc for large tensors
=========================  =======================================  =====================================

:func:`settings` builds a fresh frozen :class:`Settings` from the environment on
each call (it costs microseconds), so that a process that changes its
environment, such as a test, sees the change; nothing else in c2c reads a
``C2C_*`` variable. A bad value is a :class:`~c2c.errors.ConfigError` naming the
variable.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping

from c2c._io import private_dir
from c2c.errors import ConfigError

#: the dtypes a model can run in (``auto``: see :mod:`c2c.runtime.dtype`)
DTYPES: tuple[str, ...] = ("auto", "float32", "bfloat16", "float16", "int8")

#: (variable, one-line meaning) for ``c2c --help`` and the README
VARIABLES: tuple[tuple[str, str], ...] = (
    ("C2C_HOME", "models, keys, calibrations and the default store (default ~/.cache/c2c)"),
    ("C2C_DATA", "benchmark and training data (default ../shared/data beside the checkout)"),
    ("C2C_STORE", "store URL: sqlite:////abs/dir, sqlite:///rel/dir, redis://host:6379/0 (default: SQLite under C2C_HOME)"),
    ("C2C_MAX_HOPS", "longest chain a cache may travel before handoffs fall back to text (default 3)"),
    ("C2C_MAX_ARTIFACT_BYTES", "largest artifact c2c reads (default 16 GiB)"),
    ("C2C_THREADS", "torch threads for CLI commands, 0 for all cores (default 0)"),
    ("C2C_DTYPE", "how models run: auto (bf16 where the CPU or GPU has it), float32, bfloat16, float16 (default auto)"),
    ("C2C_MALLOC_TUNE", "0 stops the CLI from tuning glibc malloc for large tensors (default 1)"),
)


@dataclass(frozen=True, kw_only=True)
class Settings:
    """The process's c2c configuration (see the module docstring)."""

    home: Path
    data: Path
    store_url: str | None
    max_hops: int = 3
    max_artifact_bytes: int = 16 << 30
    threads: int = 0
    dtype: str = "auto"
    malloc_tune: bool = True

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> "Settings":
        env = os.environ if env is None else env
        home = Path(env.get("C2C_HOME") or Path.home() / ".cache" / "c2c").expanduser()
        data = Path(env["C2C_DATA"]).expanduser() if env.get("C2C_DATA") else _beside_checkout()
        return cls(home=home, data=data, store_url=env.get("C2C_STORE") or None,
                   max_hops=_int(env, "C2C_MAX_HOPS", 3, lo=0),
                   max_artifact_bytes=_int(env, "C2C_MAX_ARTIFACT_BYTES", 16 << 30, lo=8),
                   threads=_int(env, "C2C_THREADS", 0, lo=0),
                   dtype=_choice(env, "C2C_DTYPE", "auto", DTYPES),
                   malloc_tune=env.get("C2C_MALLOC_TUNE", "1") != "0")


def settings() -> Settings:
    """The settings the environment gives now."""
    return Settings.from_env()


def _beside_checkout() -> Path:
    return Path(__file__).resolve().parents[2].parent / "shared" / "data"  # <checkout>/../shared/data


def _choice(env: Mapping[str, str], name: str, default: str, choices: tuple[str, ...]) -> str:
    value = env.get(name) or default
    if value not in choices:
        raise ConfigError(f"{name}={value!r} is not one of {', '.join(choices)}")
    return value


def _int(env: Mapping[str, str], name: str, default: int, *, lo: int) -> int:
    raw = env.get(name)
    if raw is None or raw.strip() == "":
        return default
    try:
        value = int(raw)
    except ValueError:
        raise ConfigError(f"{name}={raw!r} is not an integer; unset it or give a whole number") from None
    if value < lo:
        raise ConfigError(f"{name}={value} must be at least {lo}")
    return value


def c2c_home() -> Path:
    """The root folder for models, keys and the default store; created 0700 on first use."""
    return private_dir(settings().home, error=ConfigError)  # an existing folder is left as it is


def data_dir() -> Path:
    """The shared benchmark and training data: ``C2C_DATA``, else ``../shared/data`` beside the checkout."""
    return settings().data
