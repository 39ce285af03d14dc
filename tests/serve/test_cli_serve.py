"""`c2c serve`: its flags, their defaults, and its help."""

from __future__ import annotations

import pytest

from c2c.cli.main import build_parser, main
from c2c.cli.serve import config_from
from c2c.errors import ConfigError
from c2c.runtime.zoo import DEFAULT_MODEL
from c2c.serve.config import MB


def parse(*argv: str):
    return config_from(build_parser().parse_args(["serve", *argv]))


def test_no_flags_serve_the_default_model_on_loopback_with_the_embedded_store():
    c = parse()
    assert c.models == (DEFAULT_MODEL,) and c.host == "127.0.0.1" and c.port == 8000
    assert c.store_url is None and c.tokens_file is None and c.open_access  # SQLite under C2C_HOME


def test_flags_reach_the_config(tmp_path):
    c = parse("--model", "tiny-qwen2", "--model", "tiny-llama", "--store", "sqlite:////tmp/s", "--port", "9001",
              "--tokens", str(tmp_path / "t.json"), "--max-queue", "3", "--session-budget-mb", "2.5")
    assert c.models == ("tiny-qwen2", "tiny-llama") and c.store_url == "sqlite:////tmp/s" and c.port == 9001
    assert c.max_queue == 3 and c.session_budget_bytes == int(2.5 * MB) and not c.open_access


def test_share_and_timeout_flags_reach_the_config_and_default_to_even_shares():
    c = parse("--max-queue", "9", "--max-queue-per-tenant", "4", "--fair-half-life", "2", "--max-sessions", "100",
              "--max-sessions-per-tenant", "30", "--session-budget-per-tenant-mb", "64", "--read-timeout", "5")
    assert c.max_queue_per_tenant == 4 and c.fair_half_life_s == 2 and c.max_sessions == 100
    assert c.max_sessions_per_tenant == 30 and c.session_budget_per_tenant_bytes == 64 * MB and c.read_timeout_s == 5
    assert c.shares(3).queue == 4 and c.shares(3).sessions == 30 and c.shares(3).session_bytes == 64 * MB
    even = parse("--max-queue", "9", "--max-sessions", "100", "--session-budget-mb", "300").shares(3)
    assert even.queue == 3 and even.sessions == 33 and even.session_bytes == 100 * MB
    assert parse().shares(1).queue == 17  # one domain: the whole queue, as before
    with pytest.raises(ConfigError):
        parse("--read-timeout", "0")


def test_help_ends_with_an_example(capsys):
    with pytest.raises(SystemExit):
        main(["serve", "--help"])
    out = capsys.readouterr().out
    assert "Example:" in out and out.rstrip().splitlines()[-1].strip().startswith("#")
    assert "c2c serve --model" in out


def test_open_access_off_loopback_is_a_one_line_error(capsys):
    assert main(["serve", "--host", "0.0.0.0", "--model", "tiny-qwen2"]) == 2
    assert "ConfigError" in capsys.readouterr().err


@pytest.mark.parametrize("flag, value, least", [("--max-body-mb", "0", "0.001"), ("--session-budget-mb", "-1", "0")])
def test_a_size_flag_too_small_is_refused_in_megabytes(capsys, flag, value, least):
    assert main(["serve", flag, value, "--model", "tiny-qwen2"]) == 2
    assert f"{flag} is too small ({value}); give at least {least}" in capsys.readouterr().err  # was in bytes


def test_open_access_checks_host_names_unless_allow_open(tmp_path):
    assert parse().loopback_hosts_only
    assert not parse("--allow-open").loopback_hosts_only
    assert not parse("--tokens", str(tmp_path / "t.json")).loopback_hosts_only
