"""A real model behind the server: analyst -> writer by cache through the API (SmolLM2-135M-Instruct),
on each runtime backend: transformers, and llama.cpp on the model's GGUF as shipped."""

from __future__ import annotations

import httpx
import openai
import pytest

from serve_helpers import ServeProcess, c2c_field, make_home, write_tokens

MODEL = "SmolLM2-135M-Instruct"
SYSTEM = {"role": "system", "content": "You are part of a two-agent incident team. Answer in one short sentence."}
EVIDENCE = {"role": "user", "name": "evidence",
            "content": "Incident log: at 09:14 deploy 7 shipped a bad config; the API returned 502 until 09:31, "
                       "when deploy 7 was rolled back. Summarize the cause."}
QUESTION = {"role": "user", "content": "What caused the outage, and when did it end?"}


@pytest.fixture(scope="module", params=["transformers", "llama.cpp"])
def zoo_server(request, tmp_path_factory):
    if request.param == "llama.cpp":
        pytest.importorskip("llama_cpp")
    root = tmp_path_factory.mktemp("serve-zoo")
    server = ServeProcess(make_home(root), "--model", MODEL, "--tokens", str(write_tokens(root / "tokens.json")),
                          "--default-max-tokens", "24", "--backend", request.param).start(timeout_s=180)
    server.backend = request.param
    yield server
    server.stop()


def ask(client, messages, **c2c):
    return client.chat.completions.create(model=MODEL, messages=messages, max_tokens=24, temperature=0,
                                          extra_body={"c2c": c2c} if c2c else None)


@pytest.mark.zoo
def test_analyst_hands_its_cache_to_the_writer(zoo_server):
    analyst, writer = zoo_server.client("analyst"), zoo_server.client("writer")
    r1 = ask(analyst, [SYSTEM, EVIDENCE], session="analyst-1", publish={"stream": "analyst"})
    pub = c2c_field(r1)["publish"]
    assert pub["kind"] == "full" and pub["tokens"] > r1.usage.prompt_tokens  # the reply's turn is in it

    r2 = ask(writer, [SYSTEM, QUESTION], session="writer-1", attach=[pub["commit"]], mode="auto")
    [rec] = c2c_field(r2)["attach"]
    assert rec["path"] == "cache" and rec["used"] == "full", rec["reason"]
    assert all(c["ok"] in (True, None) for c in rec["checks"])
    assert r2.usage.prompt_tokens_details.cached_tokens == pub["tokens"]  # nothing of the analyst's re-read
    assert c2c_field(r2)["prefilled_tokens"] == r2.usage.prompt_tokens - pub["tokens"]

    # exactly what the writer would answer had it read the analyst's whole conversation itself (transformers:
    # exact across prefill splits; llama.cpp rounds a split prefill differently, so only the tokens must agree)
    inline = [SYSTEM, EVIDENCE, {"role": "assistant", "content": r1.choices[0].message.content}, QUESTION]
    cold = ask(writer, inline)
    assert r2.usage.prompt_tokens == cold.usage.prompt_tokens
    if zoo_server.backend == "transformers":
        assert r2.choices[0].message.content == cold.choices[0].message.content
    else:
        assert r2.choices[0].message.content
        shown = httpx.get(zoo_server.url(f"/v1/c2c/commits/{pub['commit']}"), headers=zoo_server.headers("writer"))
        assert shown.json()["summary"]["dtype"] == "F16"  # llama.cpp's own f16 KV cache, as committed

    # another domain cannot see the commit at all, in any mode ...
    outsider = zoo_server.client("outsider")
    for mode in ("auto", "text"):
        with pytest.raises(openai.PermissionDeniedError):
            ask(outsider, [SYSTEM, QUESTION], attach=[pub["commit"]], mode=mode)
    # ... until the analyst's domain shares one with it: then it attaches as a cache there too
    shared = c2c_field(ask(analyst, [SYSTEM, EVIDENCE], session="analyst-2",
                           publish={"stream": "analyst-shared", "share": ["other"]}))["publish"]
    r3 = ask(outsider, [SYSTEM, QUESTION], attach=[shared["commit"]])
    [rec3] = c2c_field(r3)["attach"]
    assert rec3["path"] == "cache" and rec3["shared"] is True and "key_id" not in rec3["signer"], rec3["reason"]
    assert r3.usage.prompt_tokens_details.cached_tokens == shared["tokens"]
    if zoo_server.backend == "transformers":  # the same tokens from the same weights: the writer's answer
        assert r3.choices[0].message.content == r2.choices[0].message.content
