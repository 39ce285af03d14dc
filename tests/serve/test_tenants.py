"""Trust domains at every door of `c2c serve`: streams, commit ids, sharing, and what a record tells.

Two domains' tokens (research: analyst, writer; other: outsider) against one real server.
"""

from __future__ import annotations

import json

import httpx
import openai
import pytest

from serve_helpers import SYSTEM, c2c_field, chat

from c2c.artifact.codec import Artifact
from c2c.store import open_store
from c2c.trust.keys import Keyring

EVIDENCE = {"role": "user", "name": "evidence", "content": "Evidence: the outage began at 09:14 after deploy 7."}
QUESTION = {"role": "user", "content": "When did the outage begin?"}


def publish(server, agent: str, stream: str, *, session: str, share=(), messages=None) -> dict:
    r = chat(server.client(agent), messages or [SYSTEM, EVIDENCE], max_tokens=6,
             c2c={"session": session, "publish": {"stream": stream, "share": list(share)}})
    return c2c_field(r)["publish"]


def refusal(server, agent: str, commit: str, mode: str) -> httpx.Response:
    body = {"model": "tiny-qwen2", "messages": [SYSTEM, QUESTION], "max_tokens": 2,
            "c2c": {"attach": [commit], "mode": mode}}
    return httpx.post(server.url("/v1/chat/completions"), json=body, headers=server.headers(agent), timeout=60)


def test_a_stream_name_is_per_domain(tiny_server):
    mine = publish(tiny_server, "analyst", "findings-t", session="t-streams-1")
    theirs = publish(tiny_server, "outsider", "findings-t", session="t-streams-2")
    assert (mine["version"], theirs["version"]) == (1, 1)  # the same name: two streams
    shown = httpx.get(tiny_server.url(f"/v1/c2c/commits/{mine['commit']}"), headers=tiny_server.headers("writer"))
    assert shown.json()["stale"] is False and shown.json()["superseded_by"] is None
    # research's own full attach still takes the cache (it was a 409 once another domain published)
    r = chat(tiny_server.client("writer"), [SYSTEM, QUESTION], c2c={"attach": [mine["commit"]], "mode": "full"})
    assert c2c_field(r)["attach"][0]["path"] == "cache"


def test_a_foreign_commit_answers_exactly_as_no_commit_at_every_door(tiny_server):
    commit = publish(tiny_server, "analyst", "private-t", session="t-private")["commit"]
    absent = "cd" * 32
    httpx.post(tiny_server.url(f"/v1/c2c/commits/{commit}/invalidate"), headers=tiny_server.headers("analyst"),
               json={"reason": "retracted: see ticket RES-4471"})

    def same(a: httpx.Response, b: httpx.Response) -> None:
        assert a.status_code == b.status_code == 403
        assert a.text.replace(commit[:12], "ID") == b.text.replace(absent[:12], "ID")
        assert "RES-4471" not in a.text and "research" not in a.text and "store" not in a.json()["error"]["message"]

    for mode in ("auto", "text", "full", "slice"):  # text was readable by id once
        same(refusal(tiny_server, "outsider", commit, mode), refusal(tiny_server, "outsider", absent, mode))
    h = tiny_server.headers("outsider")
    same(httpx.get(tiny_server.url(f"/v1/c2c/commits/{commit}"), headers=h),
         httpx.get(tiny_server.url(f"/v1/c2c/commits/{absent}"), headers=h))
    same(httpx.post(tiny_server.url(f"/v1/c2c/commits/{commit}/invalidate"), headers=h, json={"reason": "x"}),
         httpx.post(tiny_server.url(f"/v1/c2c/commits/{absent}/invalidate"), headers=h, json={"reason": "x"}))


def test_a_shared_commit_is_attached_by_the_named_domain_with_verdicts_only(tiny_server):
    pub = publish(tiny_server, "analyst", "shared-t", session="t-shared", share=["other"])
    assert pub["share"] == ["other"]
    outsider = tiny_server.client("outsider")
    r = chat(outsider, [SYSTEM, QUESTION], c2c={"attach": [pub["commit"]]})
    [rec] = c2c_field(r)["attach"]
    assert rec["path"] == "cache" and rec["shared"] is True, rec["reason"]
    assert rec["signer"] == {"domain": "research"} and "hops" not in rec  # no key id, no chain depth
    assert c2c_field(r)["imported_tokens"] == pub["tokens"]
    # a prefix mismatch is a verdict, not a measurement of research's system prompt
    guess = {"role": "system", "content": "You are one agent of a two-agent team."}
    r = chat(outsider, [guess, QUESTION], c2c={"attach": [pub["commit"]]})
    [rec] = c2c_field(r)["attach"]
    prefix = next(c for c in rec["checks"] if c["name"] == "prefix")
    assert rec["used"] == "text" and prefix == {"name": "prefix", "ok": False, "detail": "shared prefixes differ"}
    assert not any(ch.isdigit() for ch in rec["reason"])
    with pytest.raises(openai.ConflictError) as e:
        chat(outsider, [guess, QUESTION], c2c={"attach": [pub["commit"]], "mode": "full"})
    assert not any(ch.isdigit() for ch in e.value.body["message"].replace(pub["commit"][:12], ""))
    # the owner's invalidation reason stays the owner's
    httpx.post(tiny_server.url(f"/v1/c2c/commits/{pub['commit']}/invalidate"),
               headers=tiny_server.headers("analyst"), json={"reason": "retracted: see ticket RES-9"})
    r = chat(outsider, [SYSTEM, QUESTION], c2c={"attach": [pub["commit"]]})
    [rec] = c2c_field(r)["attach"]
    assert rec["used"] == "text" and rec["stale"] is True and "RES-9" not in json.dumps(rec)
    # the grant is the owner's to give: the outsider cannot see research's unshared commits, nor re-share this one
    with pytest.raises(openai.BadRequestError):
        chat(tiny_server.client("analyst"), [SYSTEM, EVIDENCE], c2c={"publish": {"share": ["not a domain!"]}})


def test_a_reattach_in_a_warm_session_imports_the_whole_commit(tiny_server):
    first = publish(tiny_server, "analyst", "acct-1", session="t-acct-1")
    second = publish(tiny_server, "analyst", "acct-2", session="t-acct-2",
                     messages=[SYSTEM, {"role": "user", "name": "evidence", "content": "Evidence: deploy 8 at 10:02."}])
    writer = tiny_server.client("writer")
    for turn, pub in enumerate((first, second)):  # the session holds the first commit's cache when the second comes
        r = chat(writer, [SYSTEM, QUESTION], c2c={"session": "t-acct-w", "attach": [pub["commit"]], "mode": "full"})
        [rec] = c2c_field(r)["attach"]
        # every token of the commit is accounted for, and none after the shared prefix is computed again
        assert rec["imported_tokens"] + rec["reused_tokens"] + rec["prefilled_tokens"] == rec["tokens"] == pub["tokens"]
        assert rec["path"] == "cache" and rec["prefilled_tokens"] == 0, json.dumps(rec)
        # the second turn reuses the session's own shared prefix (the same system message), imports the rest
        assert rec["reused_tokens"] == 0 if turn == 0 else 0 < rec["reused_tokens"] < rec["tokens"]
        assert c2c_field(r)["imported_tokens"] == rec["imported_tokens"] > 0


def test_a_shared_commit_names_its_signer_by_domain_alone_and_its_share_in_the_reason(tiny_server):
    """The cache path of a shared commit: no key id, key label or signing time of research's signer anywhere
    in the reply (the record's ``signer``, its ``trust`` report), and a reason that names the share."""
    pub = publish(tiny_server, "analyst", "signer-t", session="t-signer", share=["other"])
    with open_store(tiny_server.store_url() + "?domain=research") as store:
        signature = Artifact.decode(store.get(pub["commit"]).data).signature
    [key] = [e for e in Keyring(tiny_server.home / "keys").entries() if e.key_id == signature["key_id"]]
    assert key.domain == "research" and key.label  # what must not leak: its id, label and signing time
    secrets = {signature["key_id"], signature["key_id"][:16], key.label, signature["signed_at"]}

    r = chat(tiny_server.client("outsider"), [SYSTEM, QUESTION], c2c={"attach": [pub["commit"]]})
    reply = r.model_dump()
    [rec] = c2c_field(r)["attach"]
    assert rec["path"] == "cache" and rec["shared"] is True, rec["reason"]
    assert rec["trust"] is not None and rec["trust"]["signer"] == {"domain": "research"}, rec["trust"]
    text = json.dumps(reply)  # the whole reply, every nested field
    assert not [f for f in ('"key_id":', '"label":', '"signed_at":') if f in text], rec
    assert not [s for s in secrets if s in text], rec
    assert "same trust domain" not in rec["reason"]
    assert "shared with 'other' by 'research'" in rec["reason"], rec["reason"]
    # the owner's own domain still sees its key, and is told it is its own domain
    r = chat(tiny_server.client("writer"), [SYSTEM, QUESTION], c2c={"attach": [pub["commit"]]})
    [own] = c2c_field(r)["attach"]
    assert own["path"] == "cache" and own["trust"]["signer"]["key_id"] == signature["key_id"]
    assert "same trust domain" in own["reason"]
