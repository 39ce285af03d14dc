"""Where c2c keeps its files: ``C2C_HOME`` (default ``~/.cache/c2c``)."""

from __future__ import annotations

import os
from pathlib import Path


def c2c_home() -> Path:
    """The root folder for models, keys and the default store. Created on first use."""
    home = Path(os.environ.get("C2C_HOME") or Path.home() / ".cache" / "c2c").expanduser()
    home.mkdir(parents=True, exist_ok=True)
    return home


def data_dir() -> Path:
    """The shared benchmark and training data: ``C2C_DATA``, else ``../shared/data`` beside the checkout."""
    env = os.environ.get("C2C_DATA")
    if env:
        return Path(env).expanduser()
    beside = Path(__file__).resolve().parents[2].parent / "shared" / "data"  # <checkout>/../shared/data
    return beside if beside.is_dir() else Path("/work/shared/data")
