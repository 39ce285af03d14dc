import pytest
import torch

from c2c.errors import ConfigError
from c2c.fuser.align import render
from c2c.fuser.data import Question, mc_messages
from c2c.fuser.evaluate import CONDITIONS, GENERATE_TOKENS, Evaluator, choose, parse_choice
from c2c.fuser.infer import FusedReceiver

QUESTIONS = [Question(id=f"q{i}", question=f"Which number follows {i}?",
                      options=(("A", str(i + 1)), ("B", str(i + 3)), ("C", "none")), answer="A") for i in range(3)]


def test_single_and_multi_token_label_scoring_agree(make_link, tiny_rt):
    r = tiny_rt("qwen2")
    q = QUESTIONS[0]
    _, cache = r.prefill(list(render(r, mc_messages(q)).ids))
    gen = r.encode(r.generation_prompt())
    _, single = choose(r, gen, cache, q)  # byte tokenizer: "A" is one token
    multi_q = Question(id="m", question=q.question, options=q.options + (("DD", "both"),), answer="A")
    best, multi = choose(r, gen, cache, multi_q)  # "DD" is two tokens: per-option scoring
    for label in "ABC":
        assert multi[label] == pytest.approx(single[label], abs=1e-4)
    assert best == max(multi, key=multi.get)


def test_all_conditions_run_and_an_untrained_fuser_changes_nothing(make_link, tiny_rt):
    r, s = tiny_rt("qwen2"), tiny_rt("gemma3")
    ev = Evaluator(receiver=r, sharer=s, fused=FusedReceiver(r, [make_link(r, s)]),
                   control=FusedReceiver(r, [make_link(r, None)]), hint_tokens=6)
    rep = ev.evaluate(QUESTIONS, CONDITIONS, progress=False)
    assert rep.n == 3 and set(rep.accuracy) == set(CONDITIONS) == set(rep.latency_s)
    assert all(0.0 <= a <= 1.0 for a in rep.accuracy.values())
    assert all(t > 0 for t in rep.latency_s.values())
    for rec in rep.records:
        assert set(rec["pred"].values()) <= {"A", "B", "C"} and isinstance(rec["hint"], str)
        # zero-initialised fusers are the identity: same answers as the Receiver alone
        assert rec["pred"]["c2c"] == rec["pred"]["receiver"] == rec["pred"]["control"]
        assert all(t > 0 for t in rec["latency_s"].values())


def test_fused_answers_differ_once_the_fuser_is_trained(make_link, tiny_rt):
    r, s = tiny_rt("qwen2"), tiny_rt("gemma3")
    ev = Evaluator(receiver=r, sharer=s, fused=FusedReceiver(r, [make_link(r, s, perturb=5)]))
    rep = ev.evaluate(QUESTIONS, ["receiver", "c2c"], progress=False)
    msgs = mc_messages(QUESTIONS[0])
    fused = ev.fused.fuse(msgs)
    _, plain = r.prefill(list(fused.rendered.ids))
    assert fused.cache.max_abs_diff(plain) > 0 and rep.n == 3


def test_missing_parts_are_config_errors(make_link, tiny_rt):
    r = tiny_rt("qwen2")
    with pytest.raises(ConfigError, match="Sharer"):
        Evaluator(receiver=r).evaluate(QUESTIONS, ["c2c"], progress=False)
    with pytest.raises(ConfigError, match="unknown conditions"):
        Evaluator(receiver=r).evaluate(QUESTIONS, ["oracle"], progress=False)


def test_text_scoring_is_the_mean_log_likelihood_of_the_full_answer(tiny_rt):
    r = tiny_rt("qwen2")
    q = QUESTIONS[1]
    _, cache = r.prefill(list(render(r, mc_messages(q)).ids))
    gen = r.encode(r.generation_prompt())
    best, scores = choose(r, gen, cache, q, "text")
    ids = r.encode("B. 4")
    lp = torch.log_softmax(r.logits(gen + ids, cache), -1)
    want = sum(float(lp[len(gen) - 1 + k, t]) for k, t in enumerate(ids)) / len(ids)
    assert scores["B"] == pytest.approx(want, abs=1e-4) and best == max(scores, key=scores.get)
    with pytest.raises(ConfigError, match="scoring"):
        choose(r, gen, cache, q, "vibes")


@pytest.mark.parametrize("said, want", [
    ("B", "B"), (" (C) none of them", "C"), ("**A**. 1", "A"), ("A careful look: the answer is C.", "C"),
    ("答案是B。", "B"), ("It must be 4, obviously", "B"), ("I cannot tell", ""), ("Between A and C I pick", "A"),
])
def test_a_generated_answer_is_read_as_the_option_it_names(said, want):
    q = QUESTIONS[1]  # A: 2, B: 4, C: none
    assert parse_choice(said, q) == want


def test_generate_scoring_reads_the_receivers_own_greedy_answer(tiny_rt):
    r = tiny_rt("qwen2")
    q = Question(id="n", question="Pick one.", options=(("1", "red"), ("2", "blue"), ("10", "green")), answer="2")
    _, cache = r.prefill(list(render(r, mc_messages(q)).ids))
    gen = r.encode(r.generation_prompt())
    best, scores = choose(r, gen, cache, q, "generate")
    said = r.generate(gen, cache, max_new_tokens=GENERATE_TOKENS).text
    assert best == parse_choice(said, q)
    assert scores == {lab: float(lab == best) for lab in q.labels}
    # the shared cache is left as it was: text scoring after a generation gives the same scores
    _, before = choose(r, gen, cache, q, "text")
    choose(r, gen, cache, q, "generate")
    assert choose(r, gen, cache, q, "text")[1] == pytest.approx(before)
    # "10" is not read as "1"
    assert parse_choice("10", q) == "10" and parse_choice("1.", q) == "1"


def test_t2t_hint_is_written_after_the_sharers_generation_prompt(tiny_rt):
    r, s = tiny_rt("qwen2"), tiny_rt("gemma3")
    seen = []
    generate = s.generate
    s.generate = lambda ids, *a, **kw: (seen.append(list(ids)), generate(ids, *a, **kw))[1]
    try:
        Evaluator(receiver=r, sharer=s, hint_tokens=3).evaluate(QUESTIONS[:1], ["t2t"], progress=False)
    finally:
        del s.generate
    prompt = s.encode(s.generation_prompt())
    assert len(seen) == 1 and seen[0][-len(prompt):] == prompt


def test_an_interrupted_evaluation_resumes_from_its_records(make_link, tiny_rt):
    r, s = tiny_rt("qwen2"), tiny_rt("gemma3")
    ev = Evaluator(receiver=r, sharer=s, fused=FusedReceiver(r, [make_link(r, s)]), hint_tokens=4)
    conds = ["receiver", "c2c"]
    full = ev.evaluate(QUESTIONS, conds, progress=False)
    saved = []
    first = ev.evaluate(QUESTIONS[:2], conds, progress=False, on_record=saved.append)
    assert [rec["id"] for rec in saved] == [q.id for q in QUESTIONS[:2]]
    new = []
    resumed = ev.evaluate(QUESTIONS, conds, progress=False, done=saved, on_record=new.append)
    assert [rec["id"] for rec in new] == [QUESTIONS[2].id]      # only the question not asked before
    assert resumed.accuracy == full.accuracy and resumed.n == 3 and first.n == 2
    # records lacking a condition asked for now are not reused
    again = []
    ev.evaluate(QUESTIONS[:1], ["receiver", "sharer"], progress=False, done=saved, on_record=again.append)
    assert len(again) == 1
