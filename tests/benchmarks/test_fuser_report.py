"""The fuser report: records joined per question, a new checkpoint never mixed with old records, bold only
where a paired interval clears, and a partial benchmark never pooled."""

import json
from pathlib import Path

import pytest

from bench_helpers import load_benchmark



def _report():
    return load_benchmark("fuser_report")


BASE_TAG = {"receiver_w": "r1", "sharer_w": "s1", "hint_tokens": 32}


def _cond(choice: int) -> dict:
    return {"acc": choice, "norm": choice, "s": 0.1, "loglik": [0.0, 0.0], "chars": [1, 1]}


def _write(path: Path, recs: list[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as f:
        for r in recs:
            f.write(json.dumps(r) + "\n")


def _setup(tmp_path, rep, n=60, c2c_right=lambda i: True, fuser_id="f1"):
    ids = [f"q{i}" for i in range(n)]
    bench = "OpenBookQA"
    base = [{"id": q, "answer": 0, "cond": {c: _cond(0 if i % 4 == 0 else 1) for c in rep.BASE}} | BASE_TAG
            for i, q in enumerate(ids)]
    fused = [{"id": q, "answer": 0, "fuser_id": fuser_id,
              "cond": {"c2c": _cond(0 if c2c_right(i) else 1), **{c: _cond(1) for c in rep.FUSED[1:]}}}
             for i, q in enumerate(ids)]
    control = [{"id": q, "answer": 0, "control_id": "c1", "cond": {"control": _cond(1)}} for q in ids]
    _write(rep.records_path(tmp_path, "b", bench, None), base)
    _write(rep.records_path(tmp_path, "b", bench, "general"), fused)
    _write(rep.records_path(tmp_path, "b", bench, "general.control"), control)
    run = {"pair": "b", "kind": "general", "fuser_id": fuser_id, "control_id": "c1", "base_tag": BASE_TAG,
           "receiver": "R",
           "sharer": "S", "step": 9, "checkpoint_name": "x", "limit": n, "seed": 0, "hint_tokens": 48,
           "questions": {bench: ids}}
    return {"runs": {"b/general": run}}


def test_a_clear_gain_is_bold_and_pooled(tmp_path):
    rep = _report()
    meta = _setup(tmp_path, rep)
    report = rep.write_all(tmp_path, meta)
    run = report["pairs"]["b/general"]
    ob = run["benchmarks"]["OpenBookQA"]
    assert ob["complete"] and ob["conditions"]["c2c"]["acc"] == 1.0 and ob["conditions"]["receiver"]["acc"] == 0.25
    assert run["pooled"]["benchmarks"] == 1 and run["pooled"]["paired"]["receiver"]["acc"]["clears"]
    md = (tmp_path / "fuser.md").read_text()
    assert "**100.0 (100–100)**" in md and (tmp_path / "fuser.png").is_file()
    assert "1 thread, nice" in md and "): receiver 100 ms · sharer 100 ms" in md  # each record took 0.1 s
    # the base conditions all pick what the Sharer picks; c2c picks option 0 everywhere, the Sharer's on a quarter
    assert "Agreement with the Sharer's choice (pooled, acc): receiver 100.0%" in md and "c2c 25.0%" in md
    shift = run["pooled"]["sharer_agreement_shift"]
    assert shift["receiver"]["diff"] == -0.75 and not shift["receiver"]["clears"] and "t2t_choice" not in shift
    assert report["acceptance"] == {"general_pair_a": "not measured yet"}


def test_no_gain_is_not_bold(tmp_path):
    rep = _report()
    meta = _setup(tmp_path, rep, c2c_right=lambda i: i % 4 == 0)  # c2c = receiver, question by question
    report = rep.write_all(tmp_path, meta)
    paired = report["pairs"]["b/general"]["pooled"]["paired"]["receiver"]["acc"]
    assert paired["diff"] == 0 and not paired["clears"]
    assert "**" not in (tmp_path / "fuser.md").read_text().split("pooled (")[1].split("\n")[0]


def test_records_of_another_checkpoint_are_not_used(tmp_path):
    rep = _report()
    _setup(tmp_path, rep, fuser_id="old", c2c_right=lambda i: False)  # the old fuser: always wrong
    meta = _setup(tmp_path, rep, n=60, fuser_id="new")                # the new one: always right
    run = rep.build_report(tmp_path, meta)["pairs"]["b/general"]
    assert run["benchmarks"]["OpenBookQA"]["conditions"]["c2c"]["acc"] == 1.0
    meta["runs"]["b/general"]["fuser_id"] = "other"
    run = rep.build_report(tmp_path, meta)["pairs"]["b/general"]
    assert run["benchmarks"]["OpenBookQA"]["n"] == 0 and run["pooled"]["benchmarks"] == 0


def test_base_records_of_other_models_or_hint_lengths_are_not_used(tmp_path):
    rep = _report()
    meta = _setup(tmp_path, rep)
    for k, v in (("sharer_w", "another sharer"), ("hint_tokens", 48)):
        m = json.loads(json.dumps(meta))
        m["runs"]["b/general"]["base_tag"][k] = v
        assert rep.build_report(tmp_path, m)["pairs"]["b/general"]["benchmarks"]["OpenBookQA"]["n"] == 0


def test_concurrent_runs_keep_each_others_entries(tmp_path):
    rep = _report()
    path = tmp_path / "runs.json"
    rep.update_meta(path, "b/general", {"fuser_id": "g"})
    rep.update_meta(path, "b/task-tuned", {"fuser_id": "t"})  # a second process, started before the first wrote
    rep.update_meta(path, "b/general", {"fuser_id": "g2"})
    assert json.loads(path.read_text())["runs"] == {"b/general": {"fuser_id": "g2"}, "b/task-tuned": {"fuser_id": "t"}}


def test_two_passes_of_one_pair_keep_each_others_benchmarks(tmp_path):
    rep = _report()
    path = tmp_path / "runs.json"
    same = {"fuser_id": "g", "limit": 200, "seed": 0, "base_tag": {"hint_tokens": 32}}
    rep.update_meta(path, "a/general", same | {"questions": {"MMLU val": ["m1"], "ARC-Challenge dev": ["a1"]}})
    # a --groups fused run, started before the base run wrote ARC, reaches C-Eval
    rep.update_meta(path, "a/general", same | {"questions": {"MMLU val": ["m1"], "C-Eval val": ["c1"]}})
    assert json.loads(path.read_text())["runs"]["a/general"]["questions"] == {
        "MMLU val": ["m1"], "ARC-Challenge dev": ["a1"], "C-Eval val": ["c1"]}
    # a new checkpoint starts over: the old fuser's benchmarks are not carried into it
    rep.update_meta(path, "a/general", same | {"fuser_id": "g2", "questions": {"OpenBookQA": ["o1"]}})
    assert json.loads(path.read_text())["runs"]["a/general"]["questions"] == {"OpenBookQA": ["o1"]}


def test_a_benchmark_without_its_control_is_not_complete(tmp_path):
    rep = _report()
    meta = _setup(tmp_path, rep)
    meta["runs"]["b/general"]["control_id"] = "not-trained-yet"
    run = rep.build_report(tmp_path, meta)["pairs"]["b/general"]
    ob = run["benchmarks"]["OpenBookQA"]
    assert ob["n"] == 60 and "control" not in ob["conditions"] and not ob["complete"]


def test_a_partial_benchmark_is_shown_but_not_pooled(tmp_path):
    rep = _report()
    meta = _setup(tmp_path, rep, n=40)
    meta["runs"]["b/general"]["questions"]["OpenBookQA"] += ["q98", "q99"]  # two not asked yet
    run = rep.build_report(tmp_path, meta)["pairs"]["b/general"]
    ob = run["benchmarks"]["OpenBookQA"]
    assert ob["n"] == 40 and ob["of"] == 42 and not ob["complete"]
    assert run["pooled"]["n"] == 0


def test_a_receiver_at_chance_is_marked_and_one_above_it_is_not(tmp_path):
    rep = _report()
    at_chance = rep.write_all(tmp_path, _setup(tmp_path, rep))  # the Receiver is right on every 4th: 25%
    assert at_chance["pairs"]["b/general"]["benchmarks"]["OpenBookQA"]["receiver_above_chance"] == {
        "acc": False, "norm": False}
    assert "| OpenBookQA † |" in (tmp_path / "fuser.md").read_text()

    other = tmp_path / "other"
    ids = [f"q{i}" for i in range(80)]
    meta = _setup(other, rep, n=80)
    base = rep.records_path(other, "b", "OpenBookQA", None)
    base.write_text("".join(json.dumps({"id": q, "answer": 0, "cond": {c: _cond(0 if i % 4 else 1)
                                                                          for c in rep.BASE}} | BASE_TAG) + "\n"
                            for i, q in enumerate(ids)))  # now right on 3 of 4: 75%
    above = rep.write_all(other, meta)["pairs"]["b/general"]
    assert above["benchmarks"]["OpenBookQA"]["receiver_above_chance"] == {"acc": True, "norm": True}
    assert above["pooled"]["receiver_above_chance"]["acc"]
    assert "| OpenBookQA |" in (other / "fuser.md").read_text()


def test_the_cache_audit_joins_fused_and_control_deltas(tmp_path):
    rep = _report()
    meta = _setup(tmp_path, rep, n=8)
    for group, delta in (("general", {"c2c~receiver": 0.2, "c2c~c2c_other": 0.01, "c2c~c2c_zero": 0.05}),
                         ("general.control", {"control~receiver": 0.1})):
        path = rep.records_path(tmp_path, "b", "OpenBookQA", group)
        recs = [json.loads(line) | {"delta": delta} for line in path.read_text().splitlines()]
        path.write_text("".join(json.dumps(r) + "\n" for r in recs))
    run = rep.write_all(tmp_path, meta)["pairs"]["b/general"]
    d = run["pooled"]["cache_delta"]
    assert d["c2c~c2c_other"] == {"mean": pytest.approx(0.01), "n": 8} and d["control~receiver"]["mean"] == 0.1
    md = (tmp_path / "fuser.md").read_text()
    assert ("moves the Receiver's cache by 20.0% of its norm; the control by 10.0%; feeding another question's "
            "Sharer cache moves c2c's fused cache by 1.0%; feeding a zeroed one moves c2c's fused cache by 5.0%") in md


def test_unknown_groups_are_refused_before_any_model_loads(tmp_path, capsys):
    rep = _report()
    with pytest.raises(SystemExit) as e:
        rep.main(["--pair", "b", "--kind", "general", "--checkpoint", str(tmp_path / "none"), "--groups", "fused,x",
                  "--results", str(tmp_path)])
    assert e.value.code == 2 and "--groups takes base, fused and/or control" in capsys.readouterr().err


def test_the_training_audit_pairs_the_fuser_and_control_losses_step_by_step(tmp_path, monkeypatch):
    rep = _report()
    monkeypatch.setattr(rep, "ROOT", tmp_path)
    for name, fid, losses in (("f", "F1", [2.0, 1.8, 1.6, 1.5]), ("c", "C1", [2.1, 1.9, 1.6, 1.4])):
        d = tmp_path / "checkpoints" / "fuser" / name
        d.mkdir(parents=True)
        (d / "config.json").write_text(json.dumps({"fuser_id": fid}))
        lines = [{"step": i + 1, "loss": x} for i, x in enumerate(losses)]
        lines.insert(2, {"step": 3, "loss": 9.0})  # logged before a resume, then redone: the last one counts
        (d / "train_log.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    t = rep.training_audit("F1", "C1")
    assert t["steps"] == 4 and t["diff"] == pytest.approx((-0.1 - 0.1 + 0.0 + 0.1) / 4)
    assert t["second_half"] == {"steps": 2, "diff": pytest.approx(0.05), "ci95": pytest.approx((0.0, 0.1))}
    assert rep.training_audit("F1", "nobody") is None and rep.training_audit(None, "C1") is None


def test_audit_pairs_two_uncommitted_logs_and_refuses_logs_without_a_common_step(tmp_path, capsys):
    rep = _report()
    f, c, other = tmp_path / "f.jsonl", tmp_path / "c.jsonl", tmp_path / "o.jsonl"
    f.write_text("".join(json.dumps({"step": i + 1, "loss": x}) + "\n" for i, x in enumerate([1.0, 0.8, 0.5, 0.4])))
    c.write_text("".join(json.dumps({"step": i + 1, "loss": x}) + "\n" for i, x in enumerate([1.0, 0.9, 0.7, 0.7])))
    other.write_text(json.dumps({"step": 9, "loss": 1.0}) + "\n")
    assert rep.main(["--audit", str(f), str(c)]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["steps"] == 4 and out["diff"] == pytest.approx((0.0 - 0.1 - 0.2 - 0.3) / 4)
    assert out["second_half"]["diff"] == pytest.approx(-0.25) and out["ci95"][1] <= 0.0
    with pytest.raises(SystemExit) as e:
        rep.main(["--audit", str(f), str(other)])
    assert e.value.code == 2 and "share no step" in capsys.readouterr().err
    with pytest.raises(SystemExit) as e:
        rep.main(["--audit", str(f), str(tmp_path / "missing.jsonl")])
    assert e.value.code == 2 and "two train_log.jsonl files" in capsys.readouterr().err


def test_arc_easy_is_reported_only_where_not_trained_on():
    rep = _report()
    assert "ARC-Easy test" in rep.benchmarks_for({"alpaca": 800, "dolly": 700, "lima": 500})
    assert "ARC-Easy test" not in rep.benchmarks_for({"arc_easy": 420, "lima": 21})
    assert rep.benchmarks_for(None)[:4] == rep.POOLED


def test_the_held_out_benchmark_is_shown_but_never_pooled(tmp_path):
    rep = _report()
    meta = _setup(tmp_path, rep)
    run = meta["runs"]["b/general"]
    ids = run["questions"]["OpenBookQA"]
    for group in (None, "general", "general.control"):  # the same records again, as ARC-Easy's
        src = rep.records_path(tmp_path, "b", "OpenBookQA", group)
        dst = rep.records_path(tmp_path, "b", "ARC-Easy test", group)
        dst.write_text(src.read_text())
    run["questions"]["ARC-Easy test"] = ids
    report = rep.write_all(tmp_path, meta)
    r = report["pairs"]["b/general"]
    assert r["benchmarks"]["ARC-Easy test"]["complete"] and r["benchmarks"]["ARC-Easy test"]["n"] == 60
    assert r["pooled"]["benchmarks"] == 1 and r["pooled"]["n"] == 60  # OpenBookQA alone
    md = (tmp_path / "fuser.md").read_text()
    assert "| ARC-Easy test † ‡ |" in md  # at chance here, and held out
    assert "Agreement with the Sharer's choice (ARC-Easy test, acc)" in md  # shown apart from the pooled one
    titles = [t for t, _ in rep.plot_panels(report)]  # the pooled panel, then the held-out one apart
    assert titles == ["pair b, general, pooled over 1 of 4 benchmarks (n=60)", "pair b, general, ARC-Easy test (n=60, held out)"]


def test_the_agreement_verdict_claims_a_carried_choice_only_where_every_shift_clears():
    rep = _report()
    agree = {c: {"rate": 0.6} for c in ("receiver", "c2c", "control", "c2c_other", "c2c_zero")}

    def shift(clears_other: bool) -> dict:
        return {c: {"diff": 0.05, "ci95": (0.01 if c != "c2c_other" or clears_other else -0.01, 0.09),
                    "clears": c != "c2c_other" or clears_other}
                for c in ("receiver", "control", "c2c_other", "c2c_zero")}

    carried = rep.agreement_lines({"sharer_agreement": agree, "sharer_agreement_shift": shift(True)}, "pooled")[0]
    not_carried = rep.agreement_lines({"sharer_agreement": agree, "sharer_agreement_shift": shift(False)}, "pooled")[0]
    assert "c2c moves toward the Sharer beyond all of them" in carried
    assert "does not move toward the Sharer" in not_carried and "c2c_other +5.0 (-1.0, +9.0)" in not_carried
    assert rep.agreement_lines({}, "pooled") == []
    bare = rep.agreement_lines({"sharer_agreement": agree, "sharer_agreement_shift": {}}, "pooled")[0]
    assert "Against" not in bare and "move toward" not in bare  # no shift measured: no verdict
