"""Where c2c keeps its files: ``C2C_HOME`` (default ``~/.cache/c2c``)."""

from __future__ import annotations

import os
from pathlib import Path

from c2c._io import private_dir


def c2c_home() -> Path:
    """The root folder for models, keys and the default store. Created on first use."""
    home = Path(os.environ.get("C2C_HOME") or Path.home() / ".cache" / "c2c").expanduser()
    return private_dir(home)  # 0700 when created; an existing folder is left as it is


def data_dir() -> Path:
    """The shared benchmark and training data: ``C2C_DATA``, else ``../shared/data`` beside the checkout."""
    env = os.environ.get("C2C_DATA")
    if env:
        return Path(env).expanduser()
    return Path(__file__).resolve().parents[2].parent / "shared" / "data"  # <checkout>/../shared/data
