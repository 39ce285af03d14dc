"""open_store: the backend is chosen by URL; the default is embedded SQLite under C2C_HOME."""

from __future__ import annotations

import pytest

from c2c.errors import ConfigError
from c2c.store import default_url, open_store, store_url
from c2c.store.sqlite import SQLiteConfig, SQLiteStore


def test_default_is_sqlite_under_c2c_home(tmp_path, monkeypatch):
    monkeypatch.setenv("C2C_HOME", str(tmp_path))
    monkeypatch.delenv("C2C_STORE", raising=False)
    assert default_url() == f"sqlite:///{tmp_path / 'store'}" == store_url()
    with open_store() as s:
        assert isinstance(s, SQLiteStore) and s.root == tmp_path / "store"
        assert (tmp_path / "store" / "store.sqlite3").exists()


def test_env_and_argument_override_the_default(tmp_path, monkeypatch):
    monkeypatch.setenv("C2C_STORE", f"sqlite:///{tmp_path / 'env'}")
    assert store_url() == f"sqlite:///{tmp_path / 'env'}"
    assert store_url("sqlite:///x") == "sqlite:///x"
    with open_store() as s:
        assert s.root == tmp_path / "env"


def test_sqlite_urls():
    assert SQLiteConfig.from_url("sqlite:////abs/dir").root.as_posix() == "/abs/dir"
    assert SQLiteConfig.from_url("sqlite:///rel/dir").root.as_posix() == "rel/dir"
    cfg = SQLiteConfig.from_url("sqlite:////d?synchronous=normal&busy_timeout_s=5")
    assert (cfg.synchronous, cfg.busy_timeout_s) == ("NORMAL", 5.0)
    for bad in ("sqlite://host/dir", "sqlite:///", "sqlite:////d?synchronous=off", "sqlite:////d?bogus=1",
                "sqlite:////d?busy_timeout_s=soon"):
        with pytest.raises(ConfigError):
            SQLiteConfig.from_url(bad)


def test_unknown_schemes_are_config_errors():
    for bad in ("fs:///tmp/x", "mongodb://h", "just-a-path"):
        with pytest.raises(ConfigError, match="sqlite:///PATH"):
            open_store(bad)
