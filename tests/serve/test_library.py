"""The serve library without HTTP: rendering and reuse, decoding and sampling, sessions, workers, tokens."""

from __future__ import annotations

import asyncio
import json
import threading

import pytest
import torch

from c2c.errors import AuthError, ConfigError, QueueFullError, RequestTimeoutError
from c2c.runtime.sampling import sample_next
from c2c.runtime.kvcache import KVCache
from c2c.runtime.transformers import tokenizer as hf_tokenizer
from c2c.serve.auth import OPEN, Principal, TokenTable
from c2c.serve.config import ServeConfig
from c2c.runtime.pace import Pace
from c2c.conversation.decode import Sampling, generate
from c2c.conversation.render import Message, render
from c2c.conversation.reuse import prepare
from c2c.serve.sessions import Session, SessionKey, SessionPool
from c2c.serve.worker import Cancelled, Channel, Job, ModelWorker

CONVO = [Message(role="system", content="sys"), Message(role="user", content="one"),
         Message(role="assistant", content="two"), Message(role="user", content="three", name="evidence")]


# ------------------------------------------------------------ render / reuse
def test_the_tokens_of_a_conversation_start_with_those_of_its_beginning(tiny):
    rt = tiny("qwen2")
    for k in range(1, len(CONVO)):
        short = render(rt, CONVO[:k], generation_prompt=False).token_ids
        assert render(rt, CONVO[: k + 1]).token_ids[: len(short)] == short
    r = render(rt, CONVO)
    assert [s.label for s in r.context().spans] == ["user", "assistant", "evidence", "prompt"]
    assert r.context().prefix_len == len(r.prefix_ids) > 0


def test_prepare_reuses_the_common_prefix_and_matches_a_cold_prefill(tiny):
    rt = tiny("qwen2")
    first = render(rt, CONVO[:2])
    _, held = rt.prefill(list(first.token_ids))
    full = render(rt, CONVO)
    p = prepare(rt, held, full)
    # all of it: its generation prompt is how the assistant turn that follows begins
    assert p.reused == len(first) and p.imported == 0 and p.prefilled == 0
    assert p.cache.seq_len + len(p.pending) == len(full)
    logits, cache = rt.prefill(list(p.pending), p.cache)
    cold_logits, cold = rt.prefill(list(full.token_ids))
    assert cache.token_ids == cold.token_ids and cache.max_abs_diff(cold) < 1e-4
    assert int(torch.argmax(logits)) == int(torch.argmax(cold_logits))
    # the same rendering again: everything but the last token comes from the cache
    assert prepare(rt, cache, full).reused == len(full) - 1


def test_prepare_imports_a_part_that_brings_its_kv(tiny):
    rt = tiny("qwen2")
    base = render(rt, CONVO[:3], generation_prompt=False)
    _, cache = rt.prefill(list(base.token_ids))
    P = len(base.prefix_ids)
    from c2c.conversation import Part

    att = Part(label="from:x", token_ids=base.token_ids[P:], kv=cache.slice(P, cache.end))
    r = render(rt, [CONVO[0], CONVO[3]], attachments=[att])
    p = prepare(rt, None, r)
    assert p.imported == len(att.token_ids) and p.reused == 0
    assert p.cache.token_ids == r.token_ids[: p.cache.seq_len]

    # the prefix before the import is prefilled at the pace given: passes of at most 4 tokens, a call before each
    fed, calls = [], []
    real = rt.stepper

    def stepper(past):
        s = real(past)
        feed = s.feed
        s.feed = lambda ids: (fed.append(len(ids)), feed(ids))[1]
        return s
    rt.stepper = stepper
    paced = prepare(rt, None, r, Pace(chunk=4, between=lambda: calls.append(1)))
    assert sum(fed) == P > 4 and max(fed) <= 4 and len(calls) == len(fed) == -(-P // 4)
    assert paced.imported == p.imported and paced.cache.token_ids == p.cache.token_ids
    assert paced.cache.max_abs_diff(p.cache) < 1e-4


# ------------------------------------------------------------ decode / sampling
def test_sample_next_is_greedy_at_zero_and_seeded_otherwise():
    logits = torch.tensor([0.1, 3.0, 2.9, -1.0])
    assert sample_next(logits) == 1
    draws = [[sample_next(logits, temperature=1.0, generator=torch.Generator().manual_seed(s)) for _ in range(1)]
             for s in (5, 5)]
    assert draws[0] == draws[1]
    g = torch.Generator().manual_seed(0)
    assert {sample_next(logits, temperature=1.0, top_p=0.5, generator=g) for _ in range(50)} <= {1, 2}
    with pytest.raises(ConfigError):
        Sampling(max_tokens=1, temperature=-0.1)
    with pytest.raises(ConfigError):
        Sampling(max_tokens=1, top_p=0)


def test_sample_next_takes_extreme_but_valid_settings():
    """A temperature or top_p of 1e-320 passed every check and then failed inside torch.multinomial."""
    logits = torch.tensor([0.1, 3.0, 2.9, -1.0])
    g = torch.Generator().manual_seed(0)
    assert sample_next(logits, temperature=1e-320, generator=g) == 1        # logits / 1e-320 are inf
    assert sample_next(logits, temperature=1.0, top_p=1e-320, generator=g) == 1  # 1e-320 is 0 in float32
    with pytest.raises(ConfigError):
        Sampling(max_tokens=1, temperature=float("inf"))


def test_runtime_generate_samples_with_a_generator(tiny):
    rt = tiny("qwen2")
    ids = list(render(rt, CONVO).token_ids)
    a = rt.generate(ids, max_new_tokens=6, temperature=0.8, top_p=0.95, generator=torch.Generator().manual_seed(3))
    b = rt.generate(ids, max_new_tokens=6, temperature=0.8, top_p=0.95, generator=torch.Generator().manual_seed(3))
    assert a.token_ids == b.token_ids
    assert rt.generate(ids, max_new_tokens=6).token_ids == rt.generate(ids, max_new_tokens=6).token_ids


def test_generate_gives_each_tokens_logprobs_with_the_delta_that_completes_it(tiny):
    rt = tiny("qwen2")
    ids = render(rt, CONVO).token_ids
    deltas = []
    d = generate(rt, None, ids, Sampling(max_tokens=10, temperature=0, logprobs=3), on_delta=deltas.append)
    streamed = [e for x in deltas for e in x.logprobs]
    assert len(d.logprobs) == len(d.token_ids) and streamed == list(d.logprobs)
    full, past = rt.prefill(list(ids))
    for t, e in zip(d.token_ids, d.logprobs):   # the model's own distribution, token by token
        lp = torch.log_softmax(full.float(), dim=-1)
        assert e["logprob"] == pytest.approx(float(lp[t]), abs=1e-4) and e["token"] == rt.decode([t])
        assert len(e["top_logprobs"]) == 3 and e["top_logprobs"][0]["logprob"] >= e["logprob"] - 1e-6  # greedy
        assert [x["logprob"] for x in e["top_logprobs"]] == sorted((x["logprob"] for x in e["top_logprobs"]),
                                                                    reverse=True)
        assert e["bytes"] == list(e["token"].encode())
        full, past = rt.prefill([t], past)
    with pytest.raises(ConfigError):
        Sampling(max_tokens=1, logprobs=21)


def test_generate_streams_deltas_that_add_up_and_stops_when_told(tiny):
    rt = tiny("qwen2")
    ids = render(rt, CONVO).token_ids
    deltas: list[str] = []
    d = generate(rt, None, ids, Sampling(max_tokens=12, temperature=0), on_delta=lambda x: deltas.append(x.text))
    assert "".join(deltas) == d.text and d.cache.token_ids[: len(ids)] == ids and d.logprobs is None
    assert d.cache.seq_len == len(ids) + len(d.token_ids) - (d.finish_reason == "length")
    calls = []

    def check():
        calls.append(1)
        if len(calls) > 3:
            raise Cancelled()

    with pytest.raises(Cancelled):
        generate(rt, None, ids, Sampling(max_tokens=50, temperature=0), pace=Pace(between=check))
    assert len(calls) == 4


def test_min_tokens_bans_the_end_of_turn_until_that_many_tokens_are_out(tiny):
    """Sampling.min_tokens (vLLM's): with the end of turn pushed to the top, a reply stops at once without it, and
    is exactly min_tokens long with it (the Agent's min_new_tokens, through the same loop)."""
    rt = tiny("qwen2")
    ids = render(rt, CONVO).token_ids
    eos = sorted(rt.eos_ids)[0]
    push = ((eos, 100.0),)
    assert generate(rt, None, ids, Sampling(max_tokens=8, temperature=0, logit_bias=push)).token_ids == ()
    d = generate(rt, None, ids, Sampling(max_tokens=8, min_tokens=5, temperature=0, logit_bias=push))
    assert len(d.token_ids) == 5 and d.finish_reason == "stop" and eos not in d.token_ids
    with pytest.raises(ConfigError, match="min_tokens"):
        Sampling(max_tokens=4, min_tokens=5)


# ------------------------------------------------------------ sessions
def _cache(tokens: int) -> KVCache:  # 1 layer, 1 head, dim 2, fp32: 16 bytes a token
    k = torch.zeros(1, 1, tokens, 2)
    return KVCache(keys=(k,), values=(k.clone(),), token_ids=tuple(range(tokens)))


def test_the_pool_evicts_least_recently_used_caches_but_keeps_their_records():
    pool = SessionPool(budget_bytes=16 * 100)
    keys = [SessionKey("d", "a", f"s{i}", "m") for i in range(3)]
    for k in keys:
        s = pool.take(k)
        s.cache, s.state = _cache(40), "warm"
        pool.put(s)
    assert pool.stats.held_bytes <= 1600 and pool.stats.evictions == 1
    first = pool.take(keys[0])
    assert first.state == "evicted" and first.cache is None  # the record stays
    pool.put(first)
    s = pool.take(keys[2])
    assert s.state == "warm" and s.cache is not None
    pool.put(s)
    huge = pool.take(SessionKey("d", "a", "huge", "m"))
    huge.cache = _cache(1000)
    pool.put(huge)
    assert pool.take(huge.key).cache is None  # bigger than the whole budget: not kept
    small = SessionPool(budget_bytes=10**9, max_sessions=2)
    for i in range(3):
        small.put(Session(key=SessionKey("d", "a", f"x{i}", "m")))
    assert small.stats.sessions == 2 and small.stats.forgotten == 1


def test_a_tenant_over_its_share_loses_its_own_sessions_never_anothers():
    pool = SessionPool(budget_bytes=16 * 200, max_sessions=10, tenant_bytes=16 * 100, tenant_sessions=3)
    b = pool.take(SessionKey("blue", "b", "keep", "m"))
    b.cache, b.state = _cache(40), "warm"
    pool.put(b)
    for i in range(6):  # red: 6 caches of 640 bytes against a share of 1600 bytes and 3 records
        s = pool.take(SessionKey("red", "r", f"s{i}", "m"))
        s.cache, s.state = _cache(40), "warm"
        pool.put(s)
    assert pool.held_bytes("red") <= 1600 and pool.stats.sessions == 4 and pool.stats.forgotten == 3
    assert pool.get_state(SessionKey("blue", "b", "keep", "m")) == "warm"
    assert pool.get_state(SessionKey("red", "r", "s3", "m")) == "evicted"  # its own oldest went first
    assert pool.get_state(SessionKey("red", "r", "s0", "m")) is None       # forgotten
    # shares that add up to more than the whole: the tenant holding the most pays
    over = SessionPool(budget_bytes=16 * 100, tenant_bytes=16 * 100)
    for tenant, n in (("blue", 1), ("red", 2)):
        for i in range(n):
            s = over.take(SessionKey(tenant, "x", f"s{i}", "m"))
            s.cache, s.state = _cache(40), "warm"
            over.put(s)
    assert over.get_state(SessionKey("blue", "x", "s0", "m")) == "warm"
    assert over.get_state(SessionKey("red", "x", "s0", "m")) == "evicted"


# ------------------------------------------------------------ worker
def test_forward_passes_run_one_at_a_time_and_another_tenants_short_job_goes_first():
    loop = asyncio.new_event_loop()
    worker = ModelWorker("m", max_queue=8, half_life_s=5.0)
    lock, active, peak, log = threading.Lock(), [0], [0], []

    def passes(tag: str, n: int):
        def run(job):
            for i in range(n):
                job.between_passes()
                with lock:
                    active[0] += 1
                    peak[0] = max(peak[0], active[0])
                threading.Event().wait(0.002)  # a forward pass
                with lock:
                    active[0] -= 1
                log.append((tag, i))
            return tag
        return run

    def job(tag, n, domain, agent):
        return Job(passes(tag, n), Channel(loop), timeout_s=30, owner=Principal(agent=agent, domain=domain))

    try:
        a1 = worker.submit(job("a1", 150, "red", "x"))
        a2 = worker.submit(job("a2", 150, "red", "y"))
        a1_again = worker.submit(job("a1-again", 3, "red", "x"))
        while len(log) < 20:  # the red jobs are under way
            threading.Event().wait(0.005)
        b = worker.submit(job("b", 5, "blue", "z"))
        while worker.size:
            threading.Event().wait(0.01)
    finally:
        worker.close(10)
        loop.close()
    done = {tag: max(k for k, (t, _) in enumerate(log) if t == tag) for tag in ("a1", "a2", "a1-again", "b")}
    first = {tag: min(k for k, (t, _) in enumerate(log) if t == tag) for tag in ("a1", "a2", "a1-again", "b")}
    assert peak[0] == 1                                   # never two forward passes at once
    assert done["b"] < done["a1"] and done["b"] < done["a2"]  # blue's short job did not wait for red's long ones
    assert first["a2"] < done["a1"]                       # red's two agents took turns
    assert first["a1-again"] > done["a1"]                 # one agent's own jobs go oldest first


def test_a_full_queue_refuses_and_a_job_past_its_deadline_times_out():
    loop = asyncio.new_event_loop()
    release = threading.Event()
    worker = ModelWorker("m", max_queue=1)
    try:
        busy = worker.submit(Job(lambda job: release.wait(10), Channel(loop), timeout_s=30))
        waiting = Job(lambda job: "ran", Channel(loop), timeout_s=30)
        for _ in range(100):  # until the worker took the first job
            if busy.started is not None:
                break
            threading.Event().wait(0.01)
        worker.submit(waiting)
        with pytest.raises(QueueFullError) as e:
            worker.submit(Job(lambda job: None, Channel(loop), timeout_s=30))
        assert e.value.retry_after_s > 0 and worker.depth == 1
        late = Job(lambda job: job.between_passes(), Channel(loop), timeout_s=0.0)
        release.set()
    finally:
        worker.close(5)
    with pytest.raises(RequestTimeoutError):
        late.between_passes()
    loop.close()


def test_a_job_that_gave_up_the_turn_does_not_hold_up_the_next_but_its_agent_waits():
    loop = asyncio.new_event_loop()
    release, other_ran, same_ran = threading.Event(), threading.Event(), threading.Event()
    worker = ModelWorker("m", max_queue=4)

    def storing(job):  # its forward passes are done; it only stores now
        job.release_turn()
        release.wait(10)

    try:
        worker.submit(Job(storing, Channel(loop), timeout_s=30))
        worker.submit(Job(lambda job: same_ran.set(), Channel(loop), timeout_s=30))  # the same agent (OPEN)
        worker.submit(Job(lambda job: other_ran.set(), Channel(loop), timeout_s=30,
                          owner=Principal(agent="b", domain="blue")))
        assert other_ran.wait(5) and not same_ran.is_set()  # the same agent's next one waits for it to end
        release.set()
        assert same_ran.wait(5)
    finally:
        worker.close(5)
        loop.close()


def test_a_tenant_holding_its_share_is_refused_while_another_is_admitted():
    loop = asyncio.new_event_loop()
    release = threading.Event()
    worker = ModelWorker("m", max_queue=8, tenant_queue=2)
    red = Principal(agent="a", domain="red")
    try:
        for _ in range(2):
            worker.submit(Job(lambda job: release.wait(10), Channel(loop), timeout_s=30, owner=red))
        with pytest.raises(QueueFullError, match="'red'"):
            worker.submit(Job(lambda job: None, Channel(loop), timeout_s=30, owner=red))
        worker.submit(Job(lambda job: None, Channel(loop), timeout_s=30, owner=Principal(agent="b", domain="blue")))
        assert worker.size == 3
        release.set()
    finally:
        worker.close(5)
        loop.close()


# ------------------------------------------------------------ the size check before tokenizing
def test_no_text_is_fewer_tokens_than_its_characters_over_chars_per_token(tiny):
    rt = tiny("qwen2")
    per, longest = rt.chars_per_token, max(len(t) for t in rt.tokenizer.get_vocab())
    assert per == 1.5 * longest  # a byte-level vocabulary behind an NFC normalizer
    for text in ("<|endoftext|>" * 50, "plain words and more words " * 20, "e\u0301\u0302" * 30,
                 "\U0001F600 \u4e2d\u6587 " * 40, " " * 500):
        assert len(rt.encode(text)) * per >= len(text), text[:20]
    assert len(rt.encode("<|endoftext|>" * 50)) * longest == len("<|endoftext|>" * 50)  # no token is longer


def test_normalizers_that_can_drop_text_give_no_bound():
    assert hf_tokenizer._composes(None) is False and hf_tokenizer._composes({"type": "NFC"}) is True
    assert hf_tokenizer._composes({"type": "Sequence", "normalizers": [{"type": "Prepend", "prepend": "_"},
                                                             {"type": "NFKC"}]}) is True
    for dropping in ({"type": "Strip"}, {"type": "StripAccents"}, {"type": "BertNormalizer"},
                     {"type": "Replace", "pattern": {"String": "  "}, "content": " "},
                     {"type": "Replace", "pattern": {"Regex": "\\s+"}, "content": " "}):
        assert hf_tokenizer._composes(dropping) is None


# ------------------------------------------------------------ tokens and config
def test_tokens_file_is_private_and_tokens_are_checked(tmp_path):
    path = tmp_path / "tokens.json"
    path.write_text(json.dumps({"t" * 20: {"agent": "analyst", "domain": "research"}}))
    path.chmod(0o644)
    with pytest.raises(ConfigError, match="chmod 600"):
        TokenTable.load(path)
    path.chmod(0o600)
    table = TokenTable.load(path)
    assert table.authenticate("Bearer " + "t" * 20).domain == "research"
    for bad in (None, "", "Basic abc", "Bearer " + "u" * 20):
        with pytest.raises(AuthError) as e:
            table.authenticate(bad)
        assert "t" * 20 not in str(e.value)
    assert TokenTable.open().authenticate(None) == OPEN
    path.write_text(json.dumps({"short": {"agent": "a", "domain": "d"}}))
    with pytest.raises(ConfigError, match="16 characters"):
        TokenTable.load(path)


def test_open_access_is_refused_off_loopback():
    with pytest.raises(ConfigError, match="--tokens"):
        ServeConfig(host="0.0.0.0")
    assert ServeConfig(host="0.0.0.0", allow_open=True).open_access
    assert ServeConfig(host="::1").host == "::1"
