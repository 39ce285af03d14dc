"""The CLI: documented commands, JSON output, clear errors."""

import json


from c2c.cli.main import build_parser, main


def all_commands(parser, path=()):
    for action in parser._actions:
        if action.__class__.__name__ == "_SubParsersAction":
            for name, sub in action.choices.items():
                if any(a.__class__.__name__ == "_SubParsersAction" for a in sub._actions):
                    yield from all_commands(sub, path + (name,))
                else:
                    yield path + (name,), sub


def test_every_command_has_help_and_an_example():
    cmds = list(all_commands(build_parser()))
    assert len(cmds) >= 6
    for path, sub in cmds:
        assert sub.epilog and "Example:" in sub.epilog and "c2c " + path[0] in sub.epilog, path
        for action in sub._actions:
            if action.dest != "help":
                assert action.help, f"{' '.join(path)} {action.dest} has no help"


def test_models_list_json(capsys):
    assert main(["models", "list", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    names = {r["name"] for r in rows}
    assert {"Qwen2.5-Coder-0.5B-Instruct", "SmolLM2-135M-Instruct", "Gemma-3-270M",
            "Qwen2.5-Coder-1.5B-Instruct"} <= names


def test_export_then_inspect(tiny, tmp_path, capsys):
    model_dir = str(tiny("qwen2").path)
    out = tmp_path / "a.c2c"
    assert main(["export", "--model", model_dir, "--prompt", "hello agents", "--out", str(out), "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert out.stat().st_size == info["bytes"] and info["start"] == 0
    assert main(["inspect", str(out), "--json"]) == 0
    header = json.loads(capsys.readouterr().out)
    assert header["id"] == info["id"] and header["kind"] == "full" and header["signed"] is False
    sl = tmp_path / "s.c2c"
    assert main(["export", "--model", model_dir, "--prompt", "hello agents", "--out", str(sl),
                 "--slice", "5:9", "--json"]) == 2
    assert "shared prefix" in json.loads(capsys.readouterr().out)["message"]
    p = header["prefix"]["length"]
    assert main(["export", "--model", model_dir, "--prompt", "hello agents", "--out", str(sl),
                 "--slice", f"{p + 2}:{p + 6}", "--json"]) == 0
    capsys.readouterr()
    assert main(["inspect", str(sl), "--json"]) == 0
    h = json.loads(capsys.readouterr().out)
    assert (h["kind"], h["start"], h["end"]) == ("slice", p + 2, p + 6)


def test_corrupt_artifact_is_one_line_and_exit_2(tmp_path, capsys):
    bad = tmp_path / "bad.c2c"
    bad.write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{not json}      ")
    assert main(["inspect", str(bad)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("c2c: CorruptArtifactError:") and err.count("\n") == 1


def test_bad_flags_are_config_errors(tmp_path, capsys, tiny):
    code = main(["export", "--model", str(tiny("qwen2").path), "--prompt", "x", "--out",
                 str(tmp_path / "o"), "--slice", "a:b", "--json"])
    assert code == 2 and json.loads(capsys.readouterr().out)["error"] == "ConfigError"
    assert main(["export", "--model", "no-such-model", "--prompt", "x", "--out", str(tmp_path / "o")]) == 2
    assert "UnknownModelError" in capsys.readouterr().err


def test_export_sign_as_then_verify(tiny, tmp_path, capsys):
    from c2c.trust import Keyring

    ring = tmp_path / "keys"
    Keyring(ring).create_key("lab")
    out = tmp_path / "s.c2c"
    assert main(["export", "--model", str(tiny("qwen2").path), "--prompt", "signed hello", "--out", str(out),
                 "--sign-as", "lab", "--keyring", str(ring), "--json"]) == 0
    capsys.readouterr()
    assert main(["inspect", str(out), "--json"]) == 0
    h = json.loads(capsys.readouterr().out)
    assert h["signed"] and h["signature"]["domain"] == "lab"
    assert main(["export", "--model", str(tiny("qwen2").path), "--prompt", "x", "--out", str(out),
                 "--sign-as", "nodomain", "--keyring", str(ring)]) == 2
    assert "c2c keys new" in capsys.readouterr().err


def test_advise_uses_the_saved_calibration(tmp_path, monkeypatch, capsys):
    from c2c.advise import Calibration, save_calibration

    monkeypatch.setenv("C2C_HOME", str(tmp_path))
    save_calibration(Calibration(model="tiny-qwen2", decode_s_per_token=0.1, decode_s_per_position=0.0,
                                 prefill_s_fixed=0.01, prefill_s_per_token=0.005, prefill_s_per_pair=0.0,
                                 prefill_s_per_past=0.0, kv_bytes_per_token=1000, handoff_points=((10**6, 0.01),)))
    assert main(["advise", "--model", "tiny-qwen2", "--message-tokens", "200", "--context-tokens", "500",
                 "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["decision"] == "cache" and out["calibration"]["decode_s_per_token"] == 0.1
    assert main(["advise", "--model", "tiny-qwen2", "--message-tokens", "200", "--cross-domain"]) == 0
    text = capsys.readouterr().out
    assert text.startswith("decision: TEXT") and "trust domains" in text


def test_advise_with_a_map_decides_the_mapped_path_by_its_record(tmp_path, monkeypatch, capsys, small_to_big,
                                                                  map_offer):
    from c2c.advise import Calibration, save_calibration
    from c2c.xmodel.calibration import record_path

    monkeypatch.setenv("C2C_HOME", str(tmp_path))
    save_calibration(Calibration(model="tiny-qwen2", decode_s_per_token=0.1, decode_s_per_position=0.0,
                                 prefill_s_fixed=0.01, prefill_s_per_token=0.005, prefill_s_per_pair=0.0,
                                 prefill_s_per_past=0.0, kv_bytes_per_token=1000, handoff_points=((10**6, 0.01),)))
    path = tmp_path / "small--big.c2cmap"
    small_to_big.save(path)
    flags = ["advise", "--model", "tiny-qwen2", "--message-tokens", "200", "--map", str(path), "--json"]
    assert main(flags) == 0  # no record beside the map: not used
    out = json.loads(capsys.readouterr().out)
    assert out["decision"] == "text" and out["map_id"] is None and "no calibration record" in out["reason"]
    map_offer(small_to_big).calibration.save(record_path(path))
    assert main(flags) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["decision"] == "mapped" and out["map_id"] == small_to_big.id and "beats" in out["reason"]


def test_continue_from_an_exported_artifact(tiny, tmp_path, capsys):
    model_dir = str(tiny("qwen2").path)
    out = tmp_path / "a.c2c"
    assert main(["export", "--model", model_dir, "--prompt", "hello agents", "--out", str(out)]) == 0
    capsys.readouterr()
    assert main(["continue", str(out), "--model", model_dir, "--prompt", "go on", "--max-new-tokens", "3",
                 "--json"]) == 0
    res = json.loads(capsys.readouterr().out)
    assert res["kind"] == "full" and res["attached_tokens"] > 0 and isinstance(res["text"], str)
    # another shared prefix: refused, one line, exit 2
    assert main(["continue", str(out), "--model", model_dir, "--prompt", "go on", "--system", "Other."]) == 2
    assert "PrefixMismatchError" in capsys.readouterr().err
    # another model: refused
    assert main(["continue", str(out), "--model", str(tiny("llama").path), "--prompt", "go on"]) == 2
    assert "FingerprintMismatchError" in capsys.readouterr().err
