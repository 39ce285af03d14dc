import json

import pytest

from c2c.errors import FuserDataError
from c2c.fuser import data as D


def write_arc(path, rows):
    with open(path, "w") as f:
        for r in rows:
            f.write(json.dumps(r) + "\n")


def arc(qid, labels, answer):
    return {"id": qid, "question": {"stem": "Q?", "choices": [{"text": f"t{l}", "label": l} for l in labels]},
            "answerKey": answer}


def test_arc_jsonl_any_number_of_options_and_labels(tmp_path):
    p = tmp_path / "a.jsonl"
    write_arc(p, [arc("x", "ABC", "C"), arc("y", "12345", "4")])
    qs = D.load_questions(p)
    assert [q.labels for q in qs] == [("A", "B", "C"), ("1", "2", "3", "4", "5")]
    assert [q.answer for q in qs] == ["C", "4"]
    assert "1. t1" in D.mc_messages(qs[1])[1]["content"] and "(1, 2, 3, 4, 5)" in D.mc_messages(qs[1])[1]["content"]


def test_answer_must_be_a_label(tmp_path):
    p = tmp_path / "a.jsonl"
    write_arc(p, [arc("x", "ABC", "D")])
    with pytest.raises(FuserDataError, match="not one of the labels"):
        D.load_questions(p)


def test_mmlu_and_ceval_csv_folders(tmp_path):
    m = tmp_path / "mmlu"
    m.mkdir()
    (m / "college_physics_val.csv").write_text('"What, exactly?",a,b,c,d,B\nQ2,a,b,c,d,e,E\n')
    qs = D.load_questions(m)
    assert qs[0].question == "What, exactly?" and qs[0].answer == "B" and qs[0].subject == "college_physics"
    assert qs[1].labels == ("A", "B", "C", "D", "E")
    c = tmp_path / "ceval"
    c.mkdir()
    (c / "law_val.csv").write_text("id,question,A,B,C,D,answer,explanation\n0,问题____。,甲,乙,丙,丁,C,因为\n")
    (q,) = D.load_questions(c)
    assert q.options == (("A", "甲"), ("B", "乙"), ("C", "丙"), ("D", "丁")) and q.answer == "C"
    with pytest.raises(FuserDataError):
        D.load_questions(tmp_path / "missing")


def test_subset_is_fixed_by_seed():
    qs = [D.Question(id=str(i), question="q", options=(("A", "a"), ("B", "b")), answer="A") for i in range(50)]
    a, b = D.subset(qs, 10, seed=3), D.subset(qs, 10, seed=3)
    assert a == b and len(a) == 10 and a != D.subset(qs, 10, seed=4)
    assert [int(q.id) for q in a] == sorted(int(q.id) for q in a)


def test_training_sources_and_the_reported_split_guard(data_root):
    ex = D.load_source("dolly")
    assert ex[0].messages[1][1] == "Name colour 0." and ex[0].response == "colour 0"
    arc_ex = D.load_source("arc_easy")
    assert arc_ex[0].response == "A" and "A. 1" in arc_ex[0].messages[1][1]
    with pytest.raises(FuserDataError, match="reported split"):
        D.check_not_reported(data_root / "eval" / "mmlu" / "val" / "toy_val.csv", data_root)
    with pytest.raises(FuserDataError, match="reported split"):
        D.check_not_reported(data_root / "eval", data_root)  # contains reported splits
    D.check_not_reported(data_root / "eval" / "mmlu" / "dev", data_root)
    with pytest.raises(FuserDataError, match="unknown training source"):
        D.load_source("mmlu_val")
    mix = D.mixture({"alpaca": 3, "arc_easy": 2}, seed=0)
    assert len(mix) == 5 and mix == D.mixture({"alpaca": 3, "arc_easy": 2}, seed=0)


def test_multiple_choice_response_styles():
    q = D.Question(id="x", question="q", options=(("A", "red"), ("B", "blue")), answer="B")
    assert D.mc_response(q) == "B" and D.mc_response(q, "label_text") == "B. blue"
    assert D.mc_example(q, "s", "label_text").response == "B. blue"
    with pytest.raises(FuserDataError):
        D.mc_response(q, "essay")


def test_held_out_is_what_no_run_drew(data_root):
    runs = [({"alpaca": 3, "arc_easy": 2, "lima": 1}, 0), ({"alpaca": 2, "dolly": 1}, 5)]
    def key(e):
        return e.source, e.messages, e.response

    drawn = {key(e) for counts, seed in runs for e in D.mixture(counts, seed=seed)}
    rest = D.held_out(["alpaca", "dolly", "lima"], runs)
    pool = {key(e) for name in ("alpaca", "dolly", "lima") for e in D.load_source(name)}
    assert not drawn & {key(e) for e in rest}                                   # nothing any run trained on
    assert {key(e) for e in rest} == pool - drawn and len(rest) == len(pool - drawn) > 0
    assert D.held_out(["alpaca"], []) == D.load_source("alpaca")                # no run: every example, file order
