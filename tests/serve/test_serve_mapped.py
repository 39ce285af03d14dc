"""`c2c serve --map`: a commit of one served model attached by a request to another goes through decide() and,
with a map for the pair whose record earns it, is mapped into the request's model; otherwise text or the refusal."""

from __future__ import annotations

import httpx
import openai
import pytest

from c2c.errors import ConfigError
from c2c.serve.mapped import load_maps
from c2c.xmodel import FitConfig, fit
from c2c.xmodel.calibration import record_path
from serve_helpers import SYSTEM, ServeProcess, c2c_field, make_home, write_tokens

EVIDENCE = {"role": "user", "name": "evidence", "content": "Evidence: the outage began at 09:14 after deploy 7."}
QUESTION = {"role": "user", "content": "When did the outage begin?"}


@pytest.fixture(scope="module")
def maps(tiny_models, small_to_big, streams, map_offer, tmp_path_factory):
    """small -> big with a record that earns it; small -> big_other with one that does not."""
    root = tmp_path_factory.mktemp("serve-maps")
    small_to_other = fit(tiny_models["small"], tiny_models["big_other"],
                         FitConfig(tokens=400, seq_len=48, layer_window=2), streams=streams, progress=False)
    paths = {}
    for name, xmap, earned in (("small--big", small_to_big, True), ("small--big_other", small_to_other, False)):
        paths[name] = root / f"{name}.c2cmap"
        xmap.save(paths[name])
        map_offer(xmap, earned).calibration.save(record_path(paths[name]))
    return paths


@pytest.fixture(scope="module")
def mapped_server(tiny_models, maps, tmp_path_factory):
    """The three tiny models of the maps (served as "small", "big" and "big_other") and both maps."""
    root = tmp_path_factory.mktemp("serve-mapped")
    tokens = write_tokens(root / "tokens.json")
    models = [a for name in ("small", "big", "big_other") for a in ("--model", str(tiny_models[name].path))]
    server = ServeProcess(make_home(root), *models, "--map", str(maps["small--big"]),
                          "--map", str(maps["small--big_other"]), "--tokens", str(tokens),
                          "--default-max-tokens", "4").start()
    yield server
    server.stop()


def ask(server, agent, model, messages, **c2c):
    return server.client(agent).chat.completions.create(model=model, messages=messages, max_tokens=3, temperature=0,
                                                        extra_body={"c2c": c2c} if c2c else None)


def publish(server, model, stream):
    r = ask(server, "analyst", model, [SYSTEM, EVIDENCE], session=f"pub-{stream}", publish={"stream": stream})
    return c2c_field(r)["publish"]


def test_another_models_commit_is_mapped_into_the_requests_model(mapped_server, small_to_big):
    pub = publish(mapped_server, "small", "analyst-small")
    r = ask(mapped_server, "writer", "big", [SYSTEM, QUESTION], session="writer-big", attach=[pub["commit"]])
    c = c2c_field(r)
    [rec] = c["attach"]
    assert (rec["path"], rec["used"], rec["requested"]) == ("mapped", "full", "auto")
    assert rec["map"]["id"] == small_to_big.id and (rec["map"]["source"], rec["map"]["target"]) == ("small", "big")
    assert rec["map"]["calibration"]["earned"] is True and "beats the source alone" in rec["reason"]
    assert {x["name"]: x["ok"] for x in rec["checks"]}["fingerprint"] is False
    assert rec["trust"]["signer"]["domain"] == "research"
    # the commit's tokens after the shared prefix arrive as the big model's K/V; the prefix is the big model's
    # own (prefilled in this fresh session, so counted as prefilled, not imported)
    assert c["imported_tokens"] == rec["tokens"] and 0 < rec["tokens"] < pub["tokens"] and c["reused_tokens"] == 0
    assert c["imported_tokens"] + c["prefilled_tokens"] == r.usage.prompt_tokens
    assert r.usage.prompt_tokens_details.cached_tokens == c["imported_tokens"]
    raw = httpx.post(mapped_server.url("/v1/chat/completions"), headers=mapped_server.headers("writer"),
                     json={"model": "big", "messages": [SYSTEM, QUESTION], "max_tokens": 2, "temperature": 0,
                           "c2c": {"attach": [pub["commit"]]}})
    assert raw.headers["x-c2c-handoffs"] == f"{pub['commit'][:12]}:mapped"


def test_without_an_earned_map_for_the_pair_the_commit_is_read_as_text(mapped_server):
    pub = publish(mapped_server, "small", "analyst-small-2")
    r = ask(mapped_server, "writer", "big_other", [SYSTEM, QUESTION], attach=[pub["commit"]])
    [rec] = c2c_field(r)["attach"]
    assert rec["path"] == rec["used"] == "text" and "does not clearly beat the source alone" in rec["reason"]
    assert "map" not in rec
    back = publish(mapped_server, "big", "analyst-big")  # no map from the big model down
    r = ask(mapped_server, "writer", "small", [SYSTEM, QUESTION], attach=[back["commit"]])
    [rec] = c2c_field(r)["attach"]
    assert rec["path"] == "text" and "none of the 2 maps offered fits this pair" in rec["reason"]
    with pytest.raises(openai.ConflictError) as e:  # an explicit cache mode is refused, map or not
        ask(mapped_server, "writer", "big", [SYSTEM, QUESTION], attach=[pub["commit"]], mode="full")
    assert e.value.body["c2c_error"] == "FingerprintMismatchError"


def test_a_map_whose_models_are_not_both_served_stops_the_start(tiny_models, maps):
    with pytest.raises(ConfigError, match="does not serve both"):
        load_maps([maps["small--big"]], {"small": tiny_models["small"], "big_other": tiny_models["big_other"]})
    [served] = load_maps([maps["small--big"]], dict(tiny_models))
    assert (served.source, served.target) == (tiny_models["small"], tiny_models["big"])


def test_a_server_that_recomputes_kv_reads_another_models_commit_as_text(tiny_models, small_to_big, map_offer,
                                                                        tmp_path):
    # in process: --verify-kv sample|strict would run the source model outside its turn (c2c.serve.mapped)
    from c2c.artifact.prefix import SharedPrefix
    from c2c.serve.auth import Principal
    from c2c.commit.author import TEXT_KEY
    from c2c.serve.exchange import Exchange
    from c2c.serve.mapped import ServedMap
    from c2c.store import open_store
    from c2c.team.agent import Agent, Team
    from c2c.trust.keys import Keyring
    from c2c.trust.signing import sign

    ring = Keyring(tmp_path / "keys")
    key = ring.create_key("lab")
    small, big = tiny_models["small"], tiny_models["big"]
    a = Agent("analyst", small, Team(shared=SharedPrefix.build("A team."), domain="lab"))
    a.read("The deploy is on Friday.")
    art = sign(a.commit(), key)  # as every front-end publishes: made by commit_of, signed, with its text
    assert art.header.extra[TEXT_KEY]["text"] == "evidence: The deploy is on Friday."
    prefix_ids = a.context.token_ids[:a.context.prefix_len]
    with open_store(f"sqlite:///{tmp_path / 'store'}?domain=lab") as store:
        cid = store.put(art.encode(), stream="a").id
        served = [ServedMap(offer=map_offer(small_to_big), source=small, target=big)]
        who = Principal(agent="w", domain="lab")
        ok = Exchange(store, ring, maps=served).attach(cid, runtime=big, principal=who, prefix_ids=prefix_ids,
                                                       mode="auto")
        assert ok.path == "mapped" and ok.record["map"]["id"] == small_to_big.id
        [part] = ok.parts
        assert part.kv.start == len(prefix_ids) and part.kv.num_layers == 5 and ok.prefix_kv is None
        got = Exchange(store, ring, verify_kv="sample", maps=served).attach(cid, runtime=big, principal=who,
                                                                            prefix_ids=prefix_ids, mode="auto")
        assert got.path == "text" and "UnverifiableError" in got.record["reason"] and "map" not in got.record


def test_advise_from_another_served_model_offers_the_map_the_server_holds(mapped_server, small_to_big, monkeypatch):
    from c2c.advise import Calibration, calibration_name, save_calibration

    monkeypatch.setenv("C2C_HOME", str(mapped_server.home))  # the server's calibrations, read per request
    for name in ("big", "big_other"):  # as the server names its fp32 runtimes of these served models
        save_calibration(Calibration(model=calibration_name(name), decode_s_per_token=0.1,
                                     decode_s_per_position=0.0, prefill_s_fixed=0.01, prefill_s_per_token=0.005,
                                     prefill_s_per_pair=0.0, prefill_s_per_past=0.0, kv_bytes_per_token=1000,
                                     handoff_points=((10**6, 0.01),)))

    def advise(**body):
        return httpx.post(mapped_server.url("/v1/c2c/advise"), headers=mapped_server.headers("writer"),
                          json={"message_tokens": 64, "context_tokens": 256, **body})

    up = advise(model="big", from_model="small")
    assert up.status_code == 200, up.text
    assert (up.json()["decision"], up.json()["map_id"]) == ("mapped", small_to_big.id)
    assert "beats the source alone" in up.json()["reason"]
    unearned = advise(model="big_other", from_model="small").json()  # a map whose record does not earn it
    assert unearned["decision"] == "text" and unearned["map_id"] is None
    assert "does not clearly beat the source alone" in unearned["reason"]
    same = advise(model="big", from_model="BIG").json()  # the same served model (names match as in requests)
    assert same["decision"] == "cache" and same["map_id"] is None
    unknown = advise(model="big", from_model="huge")
    assert unknown.status_code == 404 and unknown.json()["error"]["c2c_error"] == "UnknownModelError"
    both = advise(model="big", from_model="small", same_model=False)
    assert both.status_code == 400 and "not both" in both.json()["error"]["message"]
