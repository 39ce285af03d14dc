"""Fitting: the layer mapping, R² in the report, identity on a model paired with itself."""

from __future__ import annotations

import json

import pytest

from c2c.errors import ConfigError
from c2c.runtime import zoo
from c2c.xmodel import FitConfig, fit
from c2c.xmodel.streams import CORPORA, token_streams
from c2c.xmodel.fit import candidates, group, split


def test_a_model_mapped_to_itself_recovers_the_identity(tiny_models, streams):
    big = tiny_models["big"]
    m = fit(big, big, FitConfig(tokens=400, seq_len=48, layer_window=1, span=0), streams=streams, progress=False)
    assert m.layer_sources("k") == m.layer_sources("v") == list(range(5))  # chosen among 2-3 candidates each
    assert min(m.r2("k") + m.r2("v")) > 0.999
    assert all(lf["k"].r2_calib > 0.999 for lf in m.layers)
    # with neighbours read too (the default), the layer itself is among them and the fit stays exact
    m1 = fit(big, big, FitConfig(tokens=400, seq_len=48, layer_window=1), streams=streams, progress=False)
    assert all(t in lf["k"].sources and len(lf["k"].sources) >= 2 for t, lf in enumerate(m1.layers))
    assert min(m1.r2("k") + m1.r2("v")) > 0.999


def test_the_report_names_the_split_and_the_choices(small_to_big):
    m = small_to_big
    assert len(m.layers) == 5 and all(0 <= s < 3 for s in m.layer_sources("k") + m.layer_sources("v"))
    assert all(lf[k].source in lf[k].sources for lf in m.layers for k in "kv")
    f = m.fit
    assert f["streams"]["train"] >= 1 and f["streams"]["calib"] >= 1 and f["streams"]["test"] >= 1
    assert sum(f["streams"].values()) == 12 and f["tokens"]["test"] == 47 * f["streams"]["test"]
    assert all(lf["k"].alpha in f["config"]["alphas"] for lf in m.layers)
    # unrelated random models: nothing to predict, and the held-out R² says so
    assert all(r < 0.5 for r in m.r2("k"))


def test_candidates_follow_proportional_depth_and_groups_clip():
    assert group(0, 1, 24) == (0, 1) and group(5, 1, 24) == (4, 5, 6) and group(23, 2, 24) == (21, 22, 23)
    assert candidates(24, 28, 1)[0] == [0, 1] and candidates(24, 28, 1)[27] == [22, 23]
    assert candidates(24, 28, 0)[14] == [12]
    assert candidates(5, 5, 0) == [[0], [1], [2], [3], [4]]


def test_splits_are_disjoint_and_cover_every_stream():
    parts = split(20, 3, 0.25, seed=0)
    every = parts["train"] + parts["calib"] + parts["test"]
    assert sorted(every) == list(range(20)) and len(parts["test"]) == 3 and len(parts["calib"]) == 4
    with pytest.raises(ConfigError):
        split(2, 1, 0.25, seed=0)


def test_models_with_other_vocabularies_are_refused(tiny_models, streams):
    other = zoo.load("tiny-llama", dtype="float32")  # the same bytes, another tokenizer class
    with pytest.raises(ConfigError, match="vocabulary"):
        fit(tiny_models["small"], other, FitConfig(tokens=400, seq_len=48), streams=streams, progress=False)


@pytest.mark.needs_data  # the training corpora under train/
def test_streams_come_from_the_training_corpora_never_lima(tiny_models):
    rt = tiny_models["small"]
    streams = token_streams(rt, 300, seq_len=64)
    head = rt.encode(rt.render_turn("system", "You are a helpful assistant."))
    assert len(streams) == 5 and all(len(s) == 64 and s[:len(head)] == head for s in streams)
    assert len({tuple(s) for s in streams}) == 5
    assert not any("lima" in c for c in CORPORA)


@pytest.mark.needs_data  # `c2c map fit` reads its streams from the training corpora
def test_cli_map_fit_writes_a_map_that_loads(tiny_models, tmp_path, capsys):
    from c2c.cli.main import main
    from c2c.xmodel import load

    out = tmp_path / "cli.c2cmap"
    assert main(["map", "fit", "--source", str(tiny_models["small"].path), "--target", str(tiny_models["big"].path),
                 "--tokens", "256", "--seq-len", "32", "--out", str(out), "--quiet", "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    m = load(out, expect_id=shown["id"])
    assert len(m.layers) == 5 and m.fit["corpora"] and m.fit["tokens"]["train"] > 0
