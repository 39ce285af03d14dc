"""Agent-managed context through a real `c2c serve` and the openai client: drop messages from a session's
cache, reposition, repair, bad instructions, eviction, and publishing an edited cache."""

from dataclasses import replace

import openai
import pytest

from c2c.artifact.codec import Artifact
from c2c.artifact.header import EDIT_KEY
from c2c.store import open_store

from serve_helpers import SYSTEM, c2c_field, chat


def u(text):
    return {"role": "user", "content": text}


def a(text):
    return {"role": "assistant", "content": text}


HISTORY = [SYSTEM, u("Tool result 1: the vault code is 4471."), a("Noted."),
           u("Tool result 2: the ferry leaves at noon from pier 9."), a("Noted."), u("What is the vault code?")]


def turn2(r1):
    return HISTORY + [a(r1.choices[0].message.content), u("When does the ferry leave?")]


def first_turn(client, session):
    """HISTORY's turn in ``session``, then the second turn's full history (what a client sends next)."""
    return turn2(chat(client, HISTORY, c2c={"session": session}, max_tokens=4))


def kept(messages, drop):
    return [m for i, m in enumerate(messages) if i not in drop]


def extra(usage, name):
    return usage.model_extra[name]


def edit(session, drop, **kw):
    return {"session": session, "edit": {"drop": drop, **kw}}


def test_drop_prefills_only_the_new_messages_and_counts_add_up(tiny_server):
    client = tiny_server.client("analyst")
    msgs = first_turn(client, "edit-counts")
    r2 = chat(client, msgs, c2c=edit("edit-counts", [1, 2]), max_tokens=4)
    e = c2c_field(r2)["edit"]
    # dropped + kept = before: the full history's prompt less the kept one's is what was dropped
    before = chat(client, msgs, max_tokens=1).usage.prompt_tokens
    text_drop = chat(client, kept(msgs, {1, 2}), max_tokens=4)
    assert r2.usage.prompt_tokens == text_drop.usage.prompt_tokens
    assert e["dropped_tokens"] == before - r2.usage.prompt_tokens > 0
    assert e["dropped_messages"] == [1, 2] and e["exact"] is False and e["rebuilt"] is False
    assert e["repositioned_tokens"] > 0 and e["recomputed_tokens"] == 0 and e["open_gaps"] == 0
    # only what is new is prefilled; everything kept came from the cache
    u_ = r2.usage
    assert extra(u_, "dropped_tokens") == e["dropped_tokens"] and extra(u_, "recomputed_tokens") == 0
    assert extra(u_, "prefilled_tokens") + u_.prompt_tokens_details.cached_tokens == u_.prompt_tokens
    assert u_.prompt_tokens_details.cached_tokens > extra(u_, "prefilled_tokens")
    # the edit is recorded in the session's cache: a third turn keeps it approximate and counts it in total
    r3 = chat(client, msgs + [a(r2.choices[0].message.content), u("Thanks.")], c2c=edit("edit-counts", [1, 2]),
              max_tokens=2)
    e3 = c2c_field(r3)["edit"]
    assert e3["dropped_tokens"] == 0 and e3["exact"] is False and e3["total"]["dropped_tokens"] == e["dropped_tokens"]


def test_a_full_repair_answers_as_the_text_drop_does(tiny_server):
    client = tiny_server.client("analyst")
    msgs = first_turn(client, "edit-repair")
    r2 = chat(client, msgs, c2c=edit("edit-repair", [3, 4], repair="ratio:1"), max_tokens=6)
    e = c2c_field(r2)["edit"]
    assert e["recomputed_tokens"] == e["repositioned_tokens"] > 0 and e["repair"] == "ratio:1"
    text_drop = chat(client, kept(msgs, {3, 4}), max_tokens=6)
    assert r2.choices[0].message.content == text_drop.choices[0].message.content


def test_drop_without_reposition_leaves_gaps_that_a_later_request_closes(tiny_server):
    client = tiny_server.client("analyst")
    msgs = first_turn(client, "edit-gaps")
    r2 = chat(client, msgs, c2c=edit("edit-gaps", [1, 2], reposition=False), max_tokens=3)
    e = c2c_field(r2)["edit"]
    assert e["open_gaps"] == 1 and e["repositioned_tokens"] == 0 and e["dropped_tokens"] > 0
    msgs3 = msgs + [a(r2.choices[0].message.content), u("And the pier?")]
    r3 = chat(client, msgs3, c2c=edit("edit-gaps", [1, 2], reposition=True), max_tokens=3)
    e3 = c2c_field(r3)["edit"]
    assert e3["open_gaps"] == 0 and e3["repositioned_tokens"] > 0 and e3["dropped_tokens"] == 0


@pytest.mark.parametrize("messages, drop, match", [
    (None, [99], "out of range"),
    (None, [0], "system message"),
    ("contradict", [1], "differs from the one this session holds"),
    (None, [1, 1], "twice"),
    (None, [3], "re-positioned places"),   # with repair and reposition false (below)
])
def test_bad_instructions_get_a_400_and_leave_the_session_as_it_was(tiny_server, messages, drop, match):
    client = tiny_server.client("analyst")
    name = "edit-bad-" + match.split()[0]
    msgs = first_turn(client, name)
    bad = msgs
    if messages == "contradict":
        bad = [dict(m) for m in msgs]
        bad[1]["content"] = "Tool result 1: the vault code is 9999."
    spec = {"reposition": False, "repair": "first:2"} if "re-positioned" in match else {}
    with pytest.raises(openai.BadRequestError) as err:
        chat(client, bad, c2c=edit(name, drop, **spec), max_tokens=2)
    body = err.value.body
    assert body["code"] == "invalid_edit" and body["c2c_error"] == "ContextEditError" and match in body["message"]
    # the session is as it was: the valid drop now does what it does on a session that never saw the bad one
    good = chat(client, msgs, c2c=edit(name, [1, 2]), max_tokens=4)
    ref_name = name + "-ref"
    chat(client, HISTORY, c2c={"session": ref_name}, max_tokens=4)
    ref = chat(client, msgs, c2c=edit(ref_name, [1, 2]), max_tokens=4)
    assert c2c_field(good)["edit"]["dropped_tokens"] == c2c_field(ref)["edit"]["dropped_tokens"] > 0
    assert good.usage.prompt_tokens_details.cached_tokens == ref.usage.prompt_tokens_details.cached_tokens
    assert good.choices[0].message.content == ref.choices[0].message.content


def test_drops_are_cumulative_and_need_a_session(tiny_server):
    client = tiny_server.client("analyst")
    msgs = first_turn(client, "edit-cumul")
    chat(client, msgs, c2c=edit("edit-cumul", [1, 2]), max_tokens=2)
    with pytest.raises(openai.BadRequestError) as err:
        chat(client, msgs, c2c=edit("edit-cumul", [2]), max_tokens=2)
    assert "dropped on an earlier turn" in err.value.body["message"]
    with pytest.raises(openai.BadRequestError) as err:
        chat(client, msgs, c2c={"edit": {"drop": [1]}}, max_tokens=2)
    assert err.value.body["code"] == "invalid_edit" and "session" in err.value.body["message"]


def test_a_session_without_a_cache_rebuilds_from_text_exactly_and_says_so(tiny_server):
    client = tiny_server.client("analyst")
    msgs = first_turn(client, "edit-fresh-src")
    r = chat(client, msgs, c2c=edit("edit-never-seen", [1, 2]), max_tokens=4)
    e = c2c_field(r)["edit"]
    assert e["rebuilt"] is True and e["exact"] is True and e["dropped_tokens"] == 0 and "exactly" in e["reason"]
    assert r.choices[0].message.content == chat(client, kept(msgs, {1, 2}), max_tokens=4).choices[0].message.content
    # evicted: the server holds 0.5 MB of sessions (a tenant half of it) and tiny-qwen2 1 KiB of K/V per token:
    # a ~330-token tool result puts this session's cache over the tenant's share
    big = HISTORY[:1] + [u("Tool result 0: " + "lorem ipsum dolor sit amet " * 12), a("Noted.")] + HISTORY[1:]
    r1 = chat(client, big, c2c={"session": "edit-evicted"}, max_tokens=2)
    msgs3 = big + [a(r1.choices[0].message.content), u("Again?")]
    r3 = chat(client, msgs3, c2c=edit("edit-evicted", [1, 2]), max_tokens=3)
    e3 = c2c_field(r3)
    assert e3["session"]["state"] == "rebuilt" and e3["edit"]["rebuilt"] is True and e3["edit"]["exact"] is True
    assert r3.usage.prompt_tokens_details.cached_tokens == 0
    assert r3.choices[0].message.content == chat(client, kept(msgs3, {1, 2}),
                                                 max_tokens=3).choices[0].message.content


def test_an_edited_cache_publishes_as_approximate(tiny_server):
    analyst, writer = tiny_server.client("analyst"), tiny_server.client("writer")
    msgs = first_turn(analyst, "edit-pub")
    r2 = chat(analyst, msgs, max_tokens=4, c2c={**edit("edit-pub", [1, 2]), "publish": {"stream": "edited"}})
    pub = c2c_field(r2)["publish"]
    with open_store(tiny_server.store_url() + "?domain=research") as store:
        art = Artifact.decode(store.get(pub["commit"]).data)
        record = art.header.extra[EDIT_KEY]
        assert record["dropped_tokens"] == c2c_field(r2)["edit"]["dropped_tokens"]
        assert "vault" not in str(art.header.extra[EDIT_KEY])          # spans and counts, never the text
        # a forged record (claiming nothing was dropped) under the same signature is refused
        forged = replace(art, header=replace(art.header, extra={k: v for k, v in art.header.extra.items()
                                                                if k != EDIT_KEY}))
        bad = store.put(forged.encode(), stream="mallory").id
    question = [SYSTEM, u("What did the analyst find?")]
    with pytest.raises(openai.ConflictError) as err:
        chat(writer, question, c2c={"attach": [pub["commit"]], "mode": "full"})
    assert err.value.body["c2c_error"] == "EditedCacheError" and "approximate" in err.value.body["message"]
    r = chat(writer, question, c2c={"attach": [pub["commit"]], "mode": "auto"})
    [rec] = c2c_field(r)["attach"]
    assert rec["path"] == "cache" and "approximate" in rec["reason"]
    assert {c["name"]: c["ok"] for c in rec["checks"]}["exact"] is False
    with pytest.raises(openai.UnprocessableEntityError) as err:
        chat(writer, question, c2c={"attach": [bad], "mode": "auto"})
    assert err.value.body["c2c_error"] == "BadSignatureError"


def test_an_edited_commit_shared_with_another_domain_is_read_as_text_there(tiny_server):
    analyst = tiny_server.client("analyst")
    r2 = chat(analyst, first_turn(analyst, "edit-share"), max_tokens=4,
              c2c={**edit("edit-share", [1, 2]), "publish": {"stream": "edited-shared", "share": ["other"]}})
    commit = c2c_field(r2)["publish"]["commit"]
    r = chat(tiny_server.client("outsider"), [SYSTEM, u("What did they find?")], c2c={"attach": [commit]})
    [rec] = c2c_field(r)["attach"]
    # past its first drop no K/V check covers it, so another domain reads its text; the record says only that
    assert rec["path"] == "text" and rec["used"] == "text"
    assert {c["name"]: c["ok"] for c in rec["checks"]}["exact"] is False
    assert "tokens dropped" not in str(rec) and "edited without a prefill" in rec["reason"]


def test_a_turn_without_edit_on_a_session_with_drops_gets_a_400_and_the_session_keeps_them(tiny_server):
    """Probe 3, item 3: a request that sends no edit would re-prefill the dropped messages (the model reads them
    again), forget the drops and keep their edit steps; it is refused, and the session stays as it was."""
    client = tiny_server.client("analyst")
    msgs = first_turn(client, "edit-forget")
    r2 = chat(client, msgs, c2c=edit("edit-forget", [1, 3]), max_tokens=3)
    dropped = c2c_field(r2)["edit"]["dropped_tokens"]
    msgs3 = msgs + [a(r2.choices[0].message.content), u("And the pier?")]
    with pytest.raises(openai.BadRequestError) as err:
        chat(client, msgs3, c2c={"session": "edit-forget"}, max_tokens=2)
    body = err.value.body
    assert body["code"] == "invalid_edit" and body["c2c_error"] == "ContextEditError"
    assert "[1, 3]" in body["message"] and "new session" in body["message"]
    # the drops still hold: a list that leaves one out is still refused, the full list goes on from the cache
    with pytest.raises(openai.BadRequestError):
        chat(client, msgs3, c2c=edit("edit-forget", [3]), max_tokens=2)
    r3 = chat(client, msgs3, c2c=edit("edit-forget", [1, 3]), max_tokens=2)
    e3 = c2c_field(r3)["edit"]
    assert e3["dropped_tokens"] == 0 and e3["total"]["dropped_tokens"] == dropped
    assert r3.usage.prompt_tokens == chat(client, kept(msgs3, {1, 3}), max_tokens=1).usage.prompt_tokens


def _signed_edit(server, commit):
    with open_store(server.store_url() + "?domain=research") as store:
        return Artifact.decode(store.get(commit).data).header.extra.get(EDIT_KEY)


def test_the_signed_edit_record_is_what_the_cache_holds_after_each_edit_sequence(tiny_server):
    """Probe 3, item 3: a publish signs the edits the cache holds, never steps a re-prefill took out."""
    client = tiny_server.client("analyst")
    msgs = first_turn(client, "edit-record")
    rb = chat(client, msgs, c2c=edit("edit-record", [1]), max_tokens=2)
    first = c2c_field(rb)["edit"]["dropped_tokens"]
    msgs_c = msgs + [a(rb.choices[0].message.content), u("Noted?")]
    rc = chat(client, msgs_c, c2c=edit("edit-record", [1, 3]), max_tokens=2)
    second = c2c_field(rc)["edit"]["dropped_tokens"]
    assert first > 0 and second > 0
    # both edits held: the record says both
    msgs_d = msgs_c + [a(rc.choices[0].message.content), u("Go on.")]
    rd = chat(client, msgs_d, max_tokens=2, c2c={**edit("edit-record", [1, 3]), "publish": {"stream": "rec-both"}})
    both = _signed_edit(tiny_server, c2c_field(rd)["publish"]["commit"])
    assert both["dropped_tokens"] == first + second and len(both["steps"]) == 2
    assert c2c_field(rd)["edit"]["total"]["dropped_tokens"] == first + second
    # message 2 sent otherwise: everything from it on is re-prefilled (its template's opening tokens still match:
    # they sit after the first gap); the second drop no longer touches a token the cache holds
    msgs_e = [dict(m) for m in msgs_d] + [a(rd.choices[0].message.content), u("Last one.")]
    msgs_e[2]["content"] = "Understood."
    re_ = chat(client, msgs_e, max_tokens=2, c2c={**edit("edit-record", [1, 3]), "publish": {"stream": "rec-one"}})
    one = _signed_edit(tiny_server, c2c_field(re_)["publish"]["commit"])
    assert one["dropped_tokens"] == first and len(one["steps"]) == 1
    assert c2c_field(re_)["edit"]["total"]["dropped_tokens"] == first and c2c_field(re_)["edit"]["exact"] is False
    # the system message sent otherwise: everything after it is re-prefilled, before the first gap; exact again
    msgs_f = [dict(m) for m in msgs_e] + [a(re_.choices[0].message.content), u("Done.")]
    msgs_f[0]["content"] = msgs_f[0]["content"] + " Be brief."
    rf = chat(client, msgs_f, max_tokens=2, c2c={**edit("edit-record", [1, 3]), "publish": {"stream": "rec-none"}})
    assert _signed_edit(tiny_server, c2c_field(rf)["publish"]["commit"]) is None
    assert c2c_field(rf)["edit"]["exact"] is True and c2c_field(rf)["edit"]["total"] is None


def test_a_dropped_message_never_comes_back_through_a_continued_commit_that_went_stale(tiny_server):
    """Probe 3, item 4: a session continues a commit, drops a message the commit covers (a secret), and the
    commit goes stale: nothing of it is inserted again; the prompt is the kept messages, re-prefilled."""
    import httpx

    analyst = tiny_server.client("analyst")
    secret = u("Tool result: the root password is swordfish-42.")
    convo = [SYSTEM, secret, a("Noted."), u("Tool result: the ferry leaves at noon from pier 9.")]
    r1 = chat(analyst, convo, max_tokens=4, c2c={"session": "cont-src", "publish": {"stream": "cont-stale"}})
    pub = c2c_field(r1)["publish"]
    history = convo + [a(r1.choices[0].message.content), u("When does the ferry leave?")]
    writer = tiny_server.client("writer")
    r2 = chat(writer, history, max_tokens=3, c2c={"session": "cont-w", "attach": [pub["commit"]]})
    assert c2c_field(r2)["attach"][0]["path"] == "cache"
    h3 = history + [a(r2.choices[0].message.content), u("Thanks.")]
    r3 = chat(writer, h3, max_tokens=3, c2c=edit("cont-w", [1, 2]))
    assert c2c_field(r3)["edit"]["dropped_tokens"] > 0
    httpx.post(tiny_server.url(f"/v1/c2c/commits/{pub['commit']}/invalidate"), headers=tiny_server.headers("analyst"),
               json={"reason": "superseded"}).raise_for_status()
    h4 = h3 + [a(r3.choices[0].message.content), u("Anything else?")]
    r4 = chat(writer, h4, max_tokens=3, c2c=edit("cont-w", [1, 2]))
    [rec] = c2c_field(r4)["attach"]
    assert rec["used"] == "text" and "nothing is inserted" in rec["reason"] and rec["imported_tokens"] == 0
    assert r4.usage.prompt_tokens == chat(writer, kept(h4, {1, 2}), max_tokens=1).usage.prompt_tokens
    assert c2c_field(r4)["edit"]["exact"] is True     # its K/V were re-prefilled from the kept messages
    # and the next turn goes on from the session's cache, still without the secret
    h5 = h4 + [a(r4.choices[0].message.content), u("Bye.")]
    r5 = chat(writer, h5, max_tokens=2, c2c=edit("cont-w", [1, 2]))
    assert c2c_field(r5)["attach"] == [] and r5.usage.prompt_tokens == chat(
        writer, kept(h5, {1, 2}), max_tokens=1).usage.prompt_tokens
    assert r5.usage.prompt_tokens_details.cached_tokens >= r4.usage.prompt_tokens - 2
