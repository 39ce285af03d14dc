"""Handoffs through the API: publish a session's cache, attach it elsewhere, and every refusal."""

from __future__ import annotations

from dataclasses import replace

import httpx
import openai
import pytest

from c2c.artifact import Artifact
from c2c.store import open_store
from serve_helpers import SYSTEM, c2c_field, chat

EVIDENCE = {"role": "user", "name": "evidence", "content": "Evidence: the outage began at 09:14 after deploy 7."}
QUESTION = {"role": "user", "content": "When did the outage begin?"}


def publish(server, agent="analyst", stream="analyst", labels=(), session=None, messages=None):
    client = server.client(agent)
    r = chat(client, messages or [SYSTEM, EVIDENCE], max_tokens=6,
             c2c={"session": session or f"pub-{stream}", "publish": {"stream": stream, "labels": list(labels)}})
    return r, c2c_field(r)["publish"]


def test_publish_then_attach_hands_over_the_cache_exactly(tiny_server):
    r1, pub = publish(tiny_server, stream="analyst-full")
    assert pub["kind"] == "full" and pub["version"] == 1 and pub["signed_by"]["domain"] == "research"
    writer = tiny_server.client("writer")
    r2 = chat(writer, [SYSTEM, QUESTION], c2c={"session": "writer-1", "attach": [pub["commit"]], "mode": "auto"})
    c = c2c_field(r2)
    [rec] = c["attach"]
    assert rec["path"] == "cache" and rec["used"] == "full" and rec["requested"] == "auto"
    assert {x["name"]: x["ok"] for x in rec["checks"]} == {
        "domain": True, "fingerprint": True, "prefix": True, "hops": True, "staleness": True, "exact": True,
        "advisor": None}
    assert rec["bytes"] == pub["bytes"] and rec["tokens"] == pub["tokens"] and "fetch_s" in rec["timings"]
    assert c["imported_tokens"] == pub["tokens"] and c["prefilled_tokens"] < r2.usage.prompt_tokens
    assert r2.usage.prompt_tokens_details.cached_tokens == pub["tokens"]
    # the writer continues from exactly the analyst's tokens: the same as reading them all itself
    inline = [SYSTEM, EVIDENCE, {"role": "assistant", "content": r1.choices[0].message.content}, QUESTION]
    cold = chat(writer, inline)
    assert r2.usage.prompt_tokens == cold.usage.prompt_tokens
    assert r2.choices[0].message.content == cold.choices[0].message.content
    # the attachment stays with the session: the next turn needs no attach and reuses everything
    r3 = chat(writer, [SYSTEM, QUESTION, {"role": "assistant", "content": r2.choices[0].message.content},
                       {"role": "user", "content": "And then?"}], c2c={"session": "writer-1"})
    assert c2c_field(r3)["attached"] == [pub["commit"]]
    assert r3.usage.prompt_tokens_details.cached_tokens >= r2.usage.prompt_tokens


def test_a_request_that_continues_the_commits_conversation_carries_its_cache(tiny_server):
    """The shape a vLLM server takes too: the writer's messages begin with the analyst's conversation (its messages
    and reply). The commit's K/V then lie on those messages (not a second copy after the prefix): nothing is
    prefilled of it, and the answer is the one of reading them all."""
    r1, pub = publish(tiny_server, stream="analyst-continued")
    conversation = [SYSTEM, EVIDENCE, {"role": "assistant", "content": r1.choices[0].message.content}]
    writer = tiny_server.client("writer")
    cold = chat(writer, conversation + [QUESTION])
    r = chat(writer, conversation + [QUESTION], c2c={"attach": [pub["commit"]], "mode": "full"})
    c = c2c_field(r)
    [rec] = c["attach"]
    assert rec["path"] == "cache" and rec["used"] == "full" and rec["tokens"] == pub["tokens"]
    assert (rec["imported_tokens"], rec["reused_tokens"], rec["prefilled_tokens"]) == (pub["tokens"], 0, 0)
    assert r.usage.prompt_tokens == cold.usage.prompt_tokens          # no second copy of the conversation
    assert r.usage.prompt_tokens_details.cached_tokens == pub["tokens"]
    assert r.choices[0].message.content == cold.choices[0].message.content
    # a reply sent back otherwise than it was given is no continuation: the commit is placed as a block
    other = [SYSTEM, EVIDENCE, {"role": "assistant", "content": "something else"}, QUESTION]
    r2 = chat(writer, other, c2c={"attach": [pub["commit"]], "mode": "full"})
    [rec2] = c2c_field(r2)["attach"]
    assert rec2["imported_tokens"] == pub["tokens"]
    assert r2.usage.prompt_tokens > chat(writer, other).usage.prompt_tokens       # the block, besides the messages
    # on the text path (a stale commit in auto) nothing is inserted: the conversation is prefilled as sent
    httpx.post(tiny_server.url(f"/v1/c2c/commits/{pub['commit']}/invalidate"), headers=tiny_server.headers("analyst"),
               json={"reason": "superseded"}).raise_for_status()
    r3 = chat(writer, conversation + [QUESTION], c2c={"attach": [pub["commit"]], "mode": "auto"})
    [rec3] = c2c_field(r3)["attach"]
    assert rec3["used"] == "text" and "prefilled as sent, nothing inserted" in rec3["reason"]
    assert r3.usage.prompt_tokens == cold.usage.prompt_tokens and rec3["imported_tokens"] == 0
    assert r3.choices[0].message.content == cold.choices[0].message.content


def test_a_labelled_slice_is_published_and_attached(tiny_server):
    messages = [SYSTEM, {"role": "user", "name": "scratch", "content": "my private notes"}, EVIDENCE]
    _, pub = publish(tiny_server, stream="analyst-slice", labels=["evidence"], messages=messages)
    assert pub["kind"] == "slice" and pub["labels"] == ["evidence"]
    r = chat(tiny_server.client("writer"), [SYSTEM, QUESTION], c2c={"attach": [pub["commit"]], "mode": "slice"})
    [rec] = c2c_field(r)["attach"]
    assert rec["path"] == "cache" and rec["used"] == "slice" and rec["tokens"] == pub["tokens"]
    commit = httpx.get(tiny_server.url(f"/v1/c2c/commits/{pub['commit']}"), headers=tiny_server.headers("writer"))
    assert commit.json()["summary"]["labels"] == {"span": "evidence", "isolation": "recompute"}


def test_a_published_commit_lists_what_the_session_attached_as_parents(tiny_server):
    _, first = publish(tiny_server, stream="chain-1")
    r = chat(tiny_server.client("writer"), [SYSTEM, QUESTION],
             c2c={"session": "chain-w", "attach": [first["commit"]], "publish": {"stream": "chain-2"}})
    second = c2c_field(r)["publish"]
    assert second["parents"] == [first["commit"]]
    shown = httpx.get(tiny_server.url(f"/v1/c2c/commits/{second['commit']}"), headers=tiny_server.headers("writer"))
    assert shown.json()["hops"]["depth"] == 1


def test_past_the_hop_limit_a_chain_goes_on_as_text_citing_its_commits(tiny_server):
    # the server runs with C2C_MAX_HOPS=2: c1 -> c2 -> c3 holds 2 hops; attaching c3 would make 3
    _, c1 = publish(tiny_server, stream="hops-1")
    ids = [c1["commit"]]
    for i in (2, 3):
        r = chat(tiny_server.client("writer"), [SYSTEM, QUESTION],
                 c2c={"session": f"hops-s{i}", "attach": [ids[-1]], "publish": {"stream": f"hops-{i}"}})
        assert c2c_field(r)["attach"][0]["path"] == "cache"
        ids.append(c2c_field(r)["publish"]["commit"])
    r = chat(tiny_server.client("writer"), [SYSTEM, QUESTION], c2c={"attach": [ids[-1]]})
    [rec] = c2c_field(r)["attach"]
    assert rec["used"] == "text" and rec["hops"] == 3 and "exceed the hop limit 2" in rec["reason"]
    with pytest.raises(openai.ConflictError) as e:
        chat(tiny_server.client("writer"), [SYSTEM, QUESTION], c2c={"attach": [ids[-1]], "mode": "full"})
    assert e.value.body["c2c_error"] == "HandoffError" and "hop limit" in e.value.body["message"]


def test_a_stale_commit_is_refused_as_a_cache_and_read_as_text_in_auto(tiny_server):
    _, pub = publish(tiny_server, stream="analyst-stale")
    inval = httpx.post(tiny_server.url(f"/v1/c2c/commits/{pub['commit']}/invalidate"),
                       headers=tiny_server.headers("analyst"), json={"reason": "deploy 7 was rolled back"})
    assert inval.status_code == 200 and inval.json()["events"][0]["commit"] == pub["commit"]
    writer = tiny_server.client("writer")
    with pytest.raises(openai.ConflictError) as e:
        chat(writer, [SYSTEM, QUESTION], c2c={"attach": [pub["commit"]], "mode": "full"})
    assert e.value.body["c2c_error"] == "StaleCommitError"
    r = chat(writer, [SYSTEM, QUESTION], c2c={"attach": [pub["commit"]]})
    [rec] = c2c_field(r)["attach"]
    assert rec["used"] == "text" and "stale" in rec["reason"] and rec["stale"] is True


def test_a_superseded_version_goes_stale(tiny_server):
    _, v1 = publish(tiny_server, stream="analyst-versions", session="ver-1")
    _, v2 = publish(tiny_server, stream="analyst-versions", session="ver-2",
                    messages=[SYSTEM, {"role": "user", "content": "Newer evidence."}])
    assert v2["version"] == 2
    with pytest.raises(openai.ConflictError) as e:
        chat(tiny_server.client("writer"), [SYSTEM, QUESTION], c2c={"attach": [v1["commit"]], "mode": "full"})
    assert e.value.body["c2c_error"] == "StaleCommitError" and "superseded" in e.value.body["message"]


def test_a_tampered_commit_is_refused_in_every_mode(tiny_server):
    _, pub = publish(tiny_server, stream="analyst-tamper")
    with open_store(tiny_server.store_url() + "?domain=research") as store:
        art = Artifact.decode(store.get(pub["commit"]).data)
        # the same signature on a changed header (here: its labels): a forgery
        forged = replace(art, header=replace(art.header, labels={"note": "trust me"}))
        bad = store.put(forged.encode(), stream="mallory").id
    for mode in ("auto", "full", "text"):
        with pytest.raises(openai.UnprocessableEntityError) as e:
            chat(tiny_server.client("writer"), [SYSTEM, QUESTION], c2c={"attach": [bad], "mode": mode})
        assert e.value.body["c2c_error"] == "BadSignatureError", mode


def test_an_unknown_or_malformed_commit_id(tiny_server):
    writer = tiny_server.client("writer")
    with pytest.raises(openai.PermissionDeniedError) as e:  # the answer for another domain's commit too
        chat(writer, [SYSTEM, QUESTION], c2c={"attach": ["ab" * 32]})
    assert e.value.body["c2c_error"] == "CommitNotVisibleError"
    with pytest.raises(openai.BadRequestError) as e:
        chat(writer, [SYSTEM, QUESTION], c2c={"attach": ["not-an-id"]})
    assert e.value.body["c2c_error"] == "ConfigError"


def test_an_attach_with_another_system_message_falls_back_to_text(tiny_server):
    _, pub = publish(tiny_server, stream="analyst-prefix")
    other = {"role": "system", "content": "A different team prompt."}
    r = chat(tiny_server.client("writer"), [other, QUESTION], c2c={"attach": [pub["commit"]]})
    [rec] = c2c_field(r)["attach"]
    assert rec["used"] == "text" and "shared prefixes differ" in rec["reason"]
    with pytest.raises(openai.ConflictError) as e:
        chat(tiny_server.client("writer"), [other, QUESTION], c2c={"attach": [pub["commit"]], "mode": "full"})
    assert e.value.body["c2c_error"] == "PrefixMismatchError"


def test_publish_with_an_unknown_label_is_a_bad_request_before_any_work(tiny_server):
    with pytest.raises(openai.BadRequestError) as e:
        publish(tiny_server, stream="analyst-badlabel", labels=["nonexistent"], session="badlabel")
    assert e.value.body["c2c_error"] == "ConfigError" and "nonexistent" in e.value.body["message"]
    with pytest.raises(openai.BadRequestError):  # streamed: refused before the stream starts
        chat(tiny_server.client("analyst"), [SYSTEM, EVIDENCE], stream=True,
             c2c={"publish": {"stream": "x", "labels": ["nonexistent"]}})
    r = chat(tiny_server.client("analyst"), [SYSTEM, EVIDENCE], c2c={"session": "badlabel"})
    assert c2c_field(r)["session"]["state"] == "new"  # the refused request left nothing behind


def test_a_parent_read_as_text_is_no_cache_hop(tiny_server):
    _, c1 = publish(tiny_server, stream="texthop-1")
    r = chat(tiny_server.client("writer"), [SYSTEM, QUESTION],
             c2c={"session": "texthop-s2", "attach": [c1["commit"]], "mode": "text", "publish": {"stream": "texthop-2"}})
    c2 = c2c_field(r)["publish"]
    assert c2["parents"] == [c1["commit"]]  # still its parent: provenance, invalidation
    shown = httpx.get(tiny_server.url(f"/v1/c2c/commits/{c2['commit']}"), headers=tiny_server.headers("writer")).json()
    assert shown["summary"]["labels"] == {"text_parents": "0"}
    assert shown["hops"]["depth"] == 0 and shown["hops"]["refs"] == [c2["commit"], c1["commit"]]
    r = chat(tiny_server.client("writer"), [SYSTEM, QUESTION],
             c2c={"session": "texthop-s3", "attach": [c2["commit"]], "publish": {"stream": "texthop-3"}})
    assert c2c_field(r)["attach"][0]["path"] == "cache" and c2c_field(r)["attach"][0]["hops"] == 1
    c3 = c2c_field(r)["publish"]["commit"]
    shown = httpx.get(tiny_server.url(f"/v1/c2c/commits/{c3}"), headers=tiny_server.headers("writer")).json()
    assert shown["hops"]["depth"] == 1  # one cache edge (c2 -> c3); the text edge c1 -> c2 adds none
    # invalidating the text parent still reaches the whole chain
    events = httpx.post(tiny_server.url(f"/v1/c2c/commits/{c1['commit']}/invalidate"),
                        headers=tiny_server.headers("analyst"), json={"reason": "retracted"}).json()["events"]
    assert {e["commit"] for e in events} == {c1["commit"], c2["commit"], c3}


def test_a_session_stops_reusing_an_attached_cache_once_its_commit_goes_stale(tiny_server):
    _, pub = publish(tiny_server, stream="stale-session")
    writer = tiny_server.client("writer")
    r1 = chat(writer, [SYSTEM, QUESTION], c2c={"session": "stale-w", "attach": [pub["commit"]]})
    assert c2c_field(r1)["attach"][0]["path"] == "cache"
    turn2 = [SYSTEM, QUESTION, {"role": "assistant", "content": r1.choices[0].message.content},
             {"role": "user", "content": "And then?"}]
    r2 = chat(writer, turn2, c2c={"session": "stale-w"})
    assert c2c_field(r2)["attach"] == []  # fresh: the held cache is reused, nothing re-fetched
    httpx.post(tiny_server.url(f"/v1/c2c/commits/{pub['commit']}/invalidate"), headers=tiny_server.headers("analyst"),
               json={"reason": "the evidence was wrong"}).raise_for_status()
    r3 = chat(writer, turn2, c2c={"session": "stale-w"})
    [rec] = c2c_field(r3)["attach"]
    assert rec["used"] == "text" and "stale" in rec["reason"] and "the evidence was wrong" in rec["reason"]
    assert c2c_field(r3)["imported_tokens"] == 0
    # a session that attached with an explicit cache mode is refused instead
    _, pub2 = publish(tiny_server, stream="stale-session-2")
    chat(writer, [SYSTEM, QUESTION], c2c={"session": "stale-full", "attach": [pub2["commit"]], "mode": "full"})
    httpx.post(tiny_server.url(f"/v1/c2c/commits/{pub2['commit']}/invalidate"),
               headers=tiny_server.headers("analyst"), json={"reason": "gone"}).raise_for_status()
    with pytest.raises(openai.ConflictError) as e:
        chat(writer, [SYSTEM, QUESTION], c2c={"session": "stale-full"})
    assert e.value.body["c2c_error"] == "StaleCommitError"


def test_a_warm_session_fetches_only_the_chunks_after_what_it_holds(roomy_server):
    # #33: the session holds the shared prefix; the commit's chunks of it are not fetched
    system = {"role": "system", "content": "You are a careful analyst who checks every claim twice. " * 24}
    _, pub = publish(roomy_server, stream="held-prefix", messages=[system, EVIDENCE])
    writer = roomy_server.client("writer")
    chat(writer, [system, QUESTION], max_tokens=2, c2c={"session": "held-warm"})  # now it holds the prefix
    r = chat(writer, [system, QUESTION], c2c={"session": "held-warm", "attach": [pub["commit"]]})
    [warm] = c2c_field(r)["attach"]
    assert warm["path"] == "cache" and warm["bytes_referenced"] == pub["bytes"] == warm["bytes"]
    assert warm["bytes_fetched"] < warm["bytes_referenced"] / 2
    assert warm["imported_tokens"] + warm["reused_tokens"] + warm["prefilled_tokens"] == warm["tokens"]
    r = chat(writer, [system, QUESTION], c2c={"session": "held-cold", "attach": [pub["commit"]]})
    [cold] = c2c_field(r)["attach"]  # a new session holds nothing: the whole commit
    assert cold["path"] == "cache" and cold["bytes_fetched"] == cold["bytes_referenced"] == pub["bytes"]


def test_a_publish_past_the_domains_quota_is_refused_with_its_own_error(roomy_server):
    with open_store(roomy_server.store_url() + "?domain=research") as store:
        store.set_quota(store.usage().stored_bytes + 1000)  # less than any new cache
        before = store.usage()
    client = roomy_server.client("analyst")
    with pytest.raises(openai.RateLimitError) as e:
        chat(client, [SYSTEM, EVIDENCE], max_tokens=2, c2c={"publish": {"stream": "over-quota"}})
    err = e.value.body
    assert err["code"] == "quota_exceeded" and err["c2c_error"] == "QuotaExceededError" and "quota" in err["message"]
    with open_store(roomy_server.store_url() + "?domain=research") as store:
        assert store.usage() == before and "over-quota" not in store.streams()
        store.set_quota(None)
    _, pub = publish(roomy_server, stream="over-quota")
    assert pub["version"] == 1
