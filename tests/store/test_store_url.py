"""open_store: the backend is chosen by URL; the default is embedded SQLite under C2C_HOME."""

from __future__ import annotations

import pytest

from c2c.errors import ConfigError
from c2c.store import default_url, open_store, store_url
from c2c.store.sqlite.backend import SQLiteStore
from c2c.store.sqlite.config import SQLiteConfig


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
                "sqlite:////d?busy_timeout_s=soon", "sqlite:dir", "sqlite:/dir", "sqlite:"):
        with pytest.raises(ConfigError):
            SQLiteConfig.from_url(bad)
    with pytest.raises(ConfigError, match="names a host"):
        SQLiteConfig.from_url("sqlite://host/dir")


def test_three_slashes_before_a_top_level_directory_is_ambiguous():
    msg = "write sqlite:////tmp/x for the absolute path or sqlite:///./tmp/x for a relative one"
    with pytest.raises(ConfigError, match=msg):
        open_store("sqlite:///tmp/x")
    with pytest.raises(ConfigError, match="sqlite:////var/c2c/store"):
        SQLiteConfig.from_url("sqlite:///var/c2c/store?synchronous=normal")


def test_four_slashes_open_the_absolute_path(tmp_path):
    url = f"sqlite:///{tmp_path / 's'}"
    assert url.startswith("sqlite:////")
    with open_store(url) as s:
        assert s.root == tmp_path / "s" and s.root.is_absolute() and s.url == url
    assert (tmp_path / "s" / "store.sqlite3").is_file()


def test_three_slashes_and_a_dot_open_relative_to_the_working_directory(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with open_store("sqlite:///./tmp/x") as s:
        assert s.root.resolve() == tmp_path / "tmp" / "x"
        assert s.url == "sqlite:///./tmp/x" and SQLiteConfig.from_url(s.url).root == s.root
    assert (tmp_path / "tmp" / "x" / "store.sqlite3").is_file()
    with open_store("sqlite:///rel") as s:  # no top-level /rel: plainly relative
        assert s.root.resolve() == tmp_path / "rel" and SQLiteConfig.from_url(s.url).root == s.root


def test_default_url_is_absolute_even_for_a_relative_c2c_home(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("C2C_HOME", "home")  # relative, and /home is a top-level directory on most hosts
    url = default_url()
    assert url.startswith("sqlite:////")
    assert SQLiteConfig.from_url(url).root == tmp_path / "home" / "store"


def test_unknown_schemes_are_config_errors():
    for bad in ("fs:///tmp/x", "mongodb://h", "just-a-path"):
        with pytest.raises(ConfigError, match="sqlite:///PATH"):
            open_store(bad)
