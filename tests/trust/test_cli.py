"""`c2c keys ...` and `c2c verify`: thin commands over the library, with exit codes that mean something."""

import json

from c2c.artifact import Artifact
from c2c.cli.main import build_parser, main
from c2c.testing.synthetic import synthetic_artifact

from .conftest import DOMAIN


def run(capsys, *argv):
    code = main([str(a) for a in argv])
    out = capsys.readouterr()
    return code, out.out, out.err


def jrun(capsys, *argv):
    code, out, err = run(capsys, *argv, "--json")
    return code, json.loads(out)


def test_every_trust_command_has_an_example():
    parser = build_parser()
    sub = next(a for a in parser._actions if a.dest == "command")
    keys = next(a for a in sub.choices["keys"]._actions if a.dest == "keys_command")
    for name, p in list(keys.choices.items()) + [("verify", sub.choices["verify"])]:
        assert "Example:" in (p.epilog or ""), name
        assert all(a.help for a in p._actions if a.dest != "help"), name


def test_keys_life_cycle(capsys, tmp_path):
    ring, other = tmp_path / "ring", tmp_path / "other"
    code, new = jrun(capsys, "keys", "new", "--domain", DOMAIN, "--label", "alice", "--keyring", ring)
    assert code == 0 and len(new["key_id"]) == 64
    code, listed = jrun(capsys, "keys", "list", "--keyring", ring)
    assert [(k["domain"], k["key_id"], k["private_key_here"]) for k in listed["keys"]] == [(DOMAIN, new["key_id"], True)]
    code, t = jrun(capsys, "keys", "trust", new["public_key_file"], "--keyring", other)
    assert code == 0 and t == {"key_id": new["key_id"], "domain": DOMAIN}
    code, p = jrun(capsys, "keys", "policy", "--domain", DOMAIN, "--kv", "strict", "--keyring", other)
    assert p["kv"] == "strict" and p["allow_partial"] is False
    code, p = jrun(capsys, "keys", "policy", "--domain", DOMAIN, "--allow-partial", "yes", "--keyring", other)
    assert code == 0 and p["kv"] == "strict" and p["allow_partial"] is True
    code, r = jrun(capsys, "keys", "revoke", new["key_id"][:12], "--reason", "test", "--keyring", other)
    assert code == 0 and r["key_id"] == new["key_id"]
    code, listed = jrun(capsys, "keys", "list", "--keyring", other)
    assert listed["keys"][0]["revoked"] and listed["policies"][DOMAIN]["kv"] == "strict"
    code, out, err = run(capsys, "keys", "trust", tmp_path / "missing.json", "--keyring", other)
    assert code == 2 and "KeyringError" in err


def test_sign_verify_seal_unseal(capsys, tmp_path):
    ring = tmp_path / "ring"
    jrun(capsys, "keys", "new", "--domain", DOMAIN, "--keyring", ring)
    path = tmp_path / "a.c2c"
    synthetic_artifact().write(path)
    code, res = jrun(capsys, "verify", path, "--keyring", ring)
    assert code == 1 and res["error"] == "UnsignedArtifactError" and not res["ok"]
    assert jrun(capsys, "keys", "sign", path, "--domain", DOMAIN, "--keyring", ring)[0] == 0
    code, res = jrun(capsys, "verify", path, "--keyring", ring, "--domain", DOMAIN)
    assert code == 0 and res["ok"] and res["signer"]["domain"] == DOMAIN
    code, res = jrun(capsys, "verify", path, "--keyring", ring, "--domain", "ops")
    assert code == 1 and res["error"] == "DomainMismatchError"
    sealed = tmp_path / "a.sealed"
    assert jrun(capsys, "keys", "seal", path, "--domain", DOMAIN, "--out", sealed, "--keyring", ring)[0] == 0
    code, res = jrun(capsys, "verify", sealed, "--keyring", ring)  # sealed files are opened first
    assert code == 0 and res["sealed_for"] == DOMAIN
    data = bytearray(sealed.read_bytes())
    data[-5] ^= 1
    sealed.write_bytes(bytes(data))
    code, out, err = run(capsys, "verify", sealed, "--keyring", ring)
    assert code == 1 and "SealError" in out
    opened = tmp_path / "b.c2c"
    code, out, err = run(capsys, "keys", "unseal", sealed, "--domain", DOMAIN, "--out", opened, "--keyring", ring)
    assert code == 2 and not opened.exists()
    # tampered bytes in the artifact itself
    data = bytearray(path.read_bytes())
    data[-1] ^= 0x40
    path.write_bytes(bytes(data))
    code, out, err = run(capsys, "verify", path, "--keyring", ring)
    assert code == 1 and out.startswith("REFUSED") and "CorruptArtifactError" in out


def test_seal_key_export_import(capsys, tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    jrun(capsys, "keys", "new", "--domain", DOMAIN, "--keyring", a)
    f = tmp_path / "lab.seal"
    code, exp = jrun(capsys, "keys", "seal-key", "--domain", DOMAIN, "--export", f, "--keyring", a)
    assert code == 0 and (f.stat().st_mode & 0o077) == 0
    code, imp = jrun(capsys, "keys", "seal-key", "--domain", DOMAIN, "--import", f, "--keyring", b)
    assert imp["seal_key_id"] == exp["seal_key_id"]
    code, out, err = run(capsys, "keys", "seal-key", "--domain", "ops", "--import", f, "--keyring", b)
    assert code == 2 and "ConfigError" in err


def test_verify_kv_modes_with_a_tiny_model(capsys, tmp_path, qwen, qwen_art):
    ring = tmp_path / "ring"
    jrun(capsys, "keys", "new", "--domain", DOMAIN, "--keyring", ring)
    path = tmp_path / "q.c2c"
    qwen_art.write(path)
    jrun(capsys, "keys", "sign", path, "--domain", DOMAIN, "--keyring", ring)
    for mode in ("sample", "strict"):
        code, res = jrun(capsys, "verify", path, "--mode", mode, "--samples", "5", "--keyring", ring, "--seed", "1")
        assert code == 0 and res["kv"]["mode"] == mode and res["kv"]["max_error"] < 1e-3, res
    # a compromised signer re-signs a cache whose tokens were swapped in the header
    c = qwen_art.cache
    from dataclasses import replace

    from c2c.artifact.prefix import PrefixRef
    bad = Artifact.build(replace(c, token_ids=c.token_ids[::-1]), fingerprint=qwen_art.header.fingerprint,
                         prefix=PrefixRef.of(list(c.token_ids[::-1][:8])))
    bad.write(path)
    jrun(capsys, "keys", "sign", path, "--domain", DOMAIN, "--keyring", ring)
    assert jrun(capsys, "verify", path, "--keyring", ring)[0] == 0  # the signature alone cannot tell
    code, res = jrun(capsys, "verify", path, "--mode", "sample", "--keyring", ring)
    assert code == 1 and res["error"] == "VerificationFailedError" and res["kv"]["max_error"] > 1e-3
    code, out, err = run(capsys, "verify", path, "--mode", "sample", "--samples", "0", "--keyring", ring)
    assert code == 2


def signed_slices(tmp_path, qwen):
    """(keyring dir, key, honest recomputed slice file, same slice with layers 1.. replaced by noise)."""
    from c2c.trust.keys import Keyring

    from .conftest import noised_above_layer0, slice_sender

    ring_dir = tmp_path / "ring"
    ring = Keyring(ring_dir)
    key = ring.create_key(DOMAIN, label="alice")
    honest = slice_sender(qwen, ring).export(labels=("evidence",))
    good, bad = tmp_path / "good.c2c", tmp_path / "bad.c2c"
    honest.write(good)
    noised_above_layer0(honest, key).write(bad)
    return ring_dir, key, good, bad


def test_verify_checks_a_slice_after_its_context_or_refuses(capsys, tmp_path, qwen):
    from .conftest import SYSTEM

    ring, _, good, bad = signed_slices(tmp_path, qwen)
    base = ("--mode", "sample", "--keyring", ring, "--seed", "0")
    code, out, err = run(capsys, "verify", bad, *base)
    assert code == 1 and out.startswith("REFUSED") and "UnverifiableError" in out
    assert "not verified beyond layer 0" in out and "--context" in out
    code, res = jrun(capsys, "verify", bad, *base, "--context", SYSTEM)
    assert code == 1 and res["error"] == "VerificationFailedError" and res["kv"]["layers"] == "all"
    assert res["kv"]["worst"]["layer"] >= 1
    code, res = jrun(capsys, "verify", bad, *base, "--allow-partial")
    assert code == 0 and res["kv"]["layers"] == "0" and res["kv"]["deep_positions"] == 0
    assert "only layer 0" in res["kv"]["note"] and res["policy"]["allow_partial"] is True
    code, out, err = run(capsys, "verify", bad, *base, "--allow-partial")
    assert code == 0 and "note: partial check" in out
    code, res = jrun(capsys, "verify", good, *base, "--context", SYSTEM)
    assert code == 0 and res["kv"]["layers"] == "all" and res["kv"]["deep_positions"] > 0
    code, res = jrun(capsys, "verify", good, "--mode", "strict", "--keyring", ring, "--context", SYSTEM)
    assert code == 0 and res["kv"]["mode"] == "strict" and res["kv"]["deep_positions"] > 0
    code, res = jrun(capsys, "verify", good, *base, "--context", "You are a pirate.")
    assert code == 1 and res["error"] == "PrefixMismatchError"


def test_verify_never_loads_a_model_the_header_names(capsys, tmp_path, qwen, monkeypatch):
    from dataclasses import replace

    from c2c.runtime import zoo
    from c2c.runtime.transformers import TransformersRuntime, loading
    from c2c.trust.signing import sign

    ring, key, good, _ = signed_slices(tmp_path, qwen)
    evil = tmp_path / "evil-model"  # a local model directory the attacker wants loaded
    evil.mkdir()
    (evil / "config.json").write_text("{}")
    honest = Artifact.read(good)
    h = honest.header
    art = Artifact.build(honest.cache, fingerprint=replace(h.fingerprint, model_name=str(evil)), prefix=h.prefix)
    calls = []
    monkeypatch.setattr(zoo, "load", lambda *a, **k: calls.append(("zoo.load", a)))
    monkeypatch.setattr(TransformersRuntime, "load",
                        classmethod(lambda cls, *a, **k: calls.append(("TransformersRuntime.load", a))))
    monkeypatch.setattr(loading, "load", lambda *a, **k: calls.append(("loading.load", a)))
    path = tmp_path / "evil.c2c"
    art.with_signature(sign(honest, key).signature).write(path)  # a signature that is not this header's
    for mode in ("sample", "strict"):
        code, res = jrun(capsys, "verify", path, "--mode", mode, "--keyring", ring, "--domain", DOMAIN)
        assert code == 1 and res["error"] == "BadSignatureError", res
    assert calls == []
    sign(art, key).write(path)  # even a trusted signer cannot make verify load a directory
    code, out, err = run(capsys, "verify", path, "--mode", "sample", "--keyring", ring)
    assert code == 2 and "ConfigError" in err and "not a zoo model" in err and "--model" in err
    assert calls == []


def test_continue_checks_a_slice_against_the_shared_prefix(capsys, tmp_path, qwen):
    ring, _, good, bad = signed_slices(tmp_path, qwen)
    args = ("--model", "tiny-qwen2", "--prompt", "Go on.", "--max-new-tokens", "2", "--domain", DOMAIN,
            "--keyring", ring)
    code, res = jrun(capsys, "continue", good, *args)
    assert code == 0 and res["trust"]["kv"]["layers"] == "all" and res["trust"]["kv"]["deep_positions"] > 0
    code, out, err = run(capsys, "continue", bad, *args)
    assert code == 2 and "VerificationFailedError" in err
