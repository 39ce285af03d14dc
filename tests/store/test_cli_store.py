"""`c2c store ...`: thin commands over the store, with JSON output and one-line errors."""

from __future__ import annotations

import json

import pytest
from store_helpers import make_artifact

from c2c.cli.main import build_parser, main


def run(capsys, *argv) -> tuple[int, str, str]:
    code = main(list(argv))
    out = capsys.readouterr()
    return code, out.out, out.err


@pytest.fixture
def env(tmp_path, monkeypatch):
    monkeypatch.setenv("C2C_STORE", f"sqlite:///{tmp_path / 'store'}")
    files = {}
    for name, seed in (("a", 1), ("b", 2), ("c", 3)):
        files[name] = tmp_path / f"{name}.c2c"
        make_artifact(seed, agent="analyst").write(files[name])
    return files


def test_every_store_command_is_documented_with_an_example():
    store = next(a for a in build_parser()._subparsers._group_actions[0].choices.items() if a[0] == "store")[1]
    actions = store._subparsers._group_actions[0].choices
    assert {"put", "show", "log", "deps", "invalidate", "gc", "verify", "graph", "stats", "quota",
            "retention"} <= set(actions)
    for name, sub in actions.items():
        assert sub.epilog and "Example:" in sub.epilog and f"c2c store {name}" in sub.epilog, name
        assert all(a.help for a in sub._actions if a.dest != "help"), name


def test_put_show_log_deps_invalidate_verify_graph(env, capsys, tmp_path):
    code, out, _ = run(capsys, "store", "put", str(env["a"]))
    a = out.strip()
    assert code == 0 and len(a) == 64
    code, out, _ = run(capsys, "store", "put", str(env["b"]), "--stream", "writer", "--parent", a[:8], "--json")
    b = json.loads(out)
    assert code == 0 and b["parents"] == [a] and b["stream"] == "writer" and b["version"] == 1

    code, out, _ = run(capsys, "store", "show", a[:10], "--json")
    shown = json.loads(out)
    assert shown["id"] == a and shown["stream"] == "analyst" and shown["stale"] is False
    assert shown["stale_reason"] is None

    code, out, _ = run(capsys, "store", "invalidate", a, "--reason", "source retracted")
    assert code == 0 and "2 commit(s) marked stale" in out
    code, out, _ = run(capsys, "store", "show", b["id"], "--json")
    shown = json.loads(out)
    assert shown["stale"] is True and "source retracted" in shown["stale_reason"]
    assert shown["stale_chain"] == [a, b["id"]]
    code, out, _ = run(capsys, "store", "show", b["id"])
    assert "stale    yes: built on stale" in out

    code, out, _ = run(capsys, "store", "log", "--json")
    assert [r["id"] for r in json.loads(out)] == [b["id"], a]
    code, out, _ = run(capsys, "store", "log", "--stream", "writer")
    assert b["id"][:12] in out and a[:12] not in out and "STALE" in out

    code, out, _ = run(capsys, "store", "deps", b["id"], "--max-hops", "0", "--json")
    deps = json.loads(out)
    assert deps["parents"] == [a] and deps["hops"]["depth"] == 1 and deps["hops"]["exceeded"] is True
    code, out, _ = run(capsys, "store", "deps", b["id"], "--max-hops", "0")
    assert "EXCEEDED" in out and f"c2c:{a[:12]}" in out

    code, out, _ = run(capsys, "store", "events", "--json")
    assert [e["commit"] for e in json.loads(out)] == [a, b["id"]]

    code, out, _ = run(capsys, "store", "verify")
    assert code == 0 and "all 2 commit(s) intact" in out  # #33: commits are chunks, not blobs
    png = tmp_path / "dag.png"
    code, out, _ = run(capsys, "store", "graph", "--png", str(png))
    assert code == 0 and a[:12] in out and "└── " in out and png.exists()


def test_gc_and_verify_failures(env, capsys, tmp_path):
    ids = []
    for name in ("a", "b", "c"):
        code, out, _ = run(capsys, "store", "put", str(env[name]))
        ids.append(out.strip())
    code, out, _ = run(capsys, "store", "gc", "--keep-last", "1", "--dry-run", "--json")
    assert code == 0 and set(json.loads(out)["removed"]) == set(ids[:2]) and json.loads(out)["dry_run"]
    code, out, _ = run(capsys, "store", "gc", "--keep-last", "1", "--ttl", "7d")
    assert code == 0 and "removed 2 commit(s)" in out
    code, out, _ = run(capsys, "store", "log", "--json")
    assert [r["id"] for r in json.loads(out)] == [ids[2]]
    blob = next((tmp_path / "store" / "chunks").glob("*/??/*"))  # the commit's one chunk (#33)
    blob.write_bytes(blob.read_bytes()[:-1] + b"\x00")
    code, out, _ = run(capsys, "store", "verify", "--json")
    assert code == 1 and json.loads(out)["problems"][0]["commit"] == ids[2]


def test_errors_are_one_line_and_exit_2(env, capsys, tmp_path):
    code, _, err = run(capsys, "store", "show", "abcd")
    assert code == 2 and err.startswith("c2c: CommitNotFoundError:") and err.count("\n") == 1
    code, out, _ = run(capsys, "store", "gc", "--ttl", "soon", "--json")
    assert code == 2 and json.loads(out)["error"] == "ConfigError"
    bad = tmp_path / "bad.c2c"
    bad.write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{not json}      ")
    code, _, err = run(capsys, "store", "put", str(bad))
    assert code == 2 and "CorruptArtifactError" in err
    code, _, err = run(capsys, "store", "log", "--store", "ftp://nowhere")
    assert code == 2 and "ConfigError" in err


def test_get_writes_the_artifact_and_refuses_stale(env, capsys, tmp_path):
    code, out, _ = run(capsys, "store", "put", str(env["a"]))
    a = out.strip()
    dst = tmp_path / "got.c2c"
    code, out, _ = run(capsys, "store", "get", a[:8], "--out", str(dst), "--json")
    assert code == 0 and json.loads(out)["stale"] is False
    assert dst.read_bytes() == env["a"].read_bytes()
    run(capsys, "store", "invalidate", a, "--reason", "retracted")
    code, _, err = run(capsys, "store", "get", a, "--out", str(tmp_path / "x.c2c"))
    assert code == 2 and "StaleCommitError" in err and not (tmp_path / "x.c2c").exists()
    code, out, _ = run(capsys, "store", "get", a, "--out", str(tmp_path / "x.c2c"), "--allow-stale")
    assert code == 0 and "STALE: " in out and (tmp_path / "x.c2c").exists()


def test_domain_picks_the_trust_domain_acted_in(env, capsys):
    code, out, _ = run(capsys, "store", "put", str(env["a"]), "--domain", "research", "--json")
    mine = json.loads(out)
    assert code == 0 and mine["version"] == 1
    code, out, _ = run(capsys, "store", "put", str(env["b"]), "--stream", "analyst", "--json")  # domain 'default'
    assert json.loads(out)["version"] == 1  # another domain's stream of the same name
    code, out, _ = run(capsys, "store", "log", "--domain", "research", "--json")
    assert [c["id"] for c in json.loads(out)] == [mine["id"]]
    code, _, err = run(capsys, "store", "show", mine["id"])  # not in domain 'default'
    assert code == 2 and "no commit" in err
    code, _, err = run(capsys, "store", "log", "--domain", "bad domain!")
    assert code == 2 and "trust domain" in err


def test_stats_quota_and_retention(env, capsys, tmp_path):
    code, out, _ = run(capsys, "store", "put", str(env["a"]))
    code, out, _ = run(capsys, "store", "stats", "--json")
    stats = json.loads(out)
    [mine] = stats["domains"]
    size = env["a"].stat().st_size
    assert code == 0 and mine["domain"] == "default" and mine["commits"] == 1 and mine["logical_bytes"] == size
    assert 0 < mine["stored_bytes"] <= size and mine["quota_bytes"] is None and stats["total"]["commits"] == 1
    code, out, _ = run(capsys, "store", "quota", "1kB")
    assert code == 0 and "quota 1.0 kB" in out
    code, _, err = run(capsys, "store", "put", str(env["b"]))
    assert code == 2 and err.startswith("c2c: QuotaExceededError:") and "Nothing was written" in err
    code, out, _ = run(capsys, "store", "stats")
    assert code == 0 and "default" in out and "1.0 kB" in out and "dedup" in out.splitlines()[0]
    assert run(capsys, "store", "quota", "none")[0] == 0
    code, out, _ = run(capsys, "store", "retention", "--stream", "analyst", "--keep-last", "1")
    assert code == 0 and "keep last 1" in out
    for name in ("b", "c"):
        assert run(capsys, "store", "put", str(env[name]))[0] == 0
    code, out, _ = run(capsys, "store", "log", "--json")
    assert len(json.loads(out)) == 1  # retention ran on each put
    code, out, _ = run(capsys, "store", "retention", "--json")
    assert json.loads(out) == {"stream": None, "keep_last": None, "ttl_s": None}
    code, out, _ = run(capsys, "store", "retention", "--stream", "analyst", "--clear")
    assert code == 0 and "no retention" in out
    code, _, err = run(capsys, "store", "quota", "lots")
    assert code == 2 and "not a size" in err
