"""The fuser harness's record files (c2c.bench.fuser_records): resumable, tagged, joined per question."""

import json

from c2c.bench.fuser_records import Records, open_for_append, read_records, record_file


def test_a_cut_line_is_repaired_before_appending_and_later_records_count(tmp_path):
    path = tmp_path / "r.jsonl"
    path.write_text('{"id": "a", "cond": {}}\n{"id": "b", "co')  # a run killed mid-write
    with open_for_append(path) as f:
        f.write('{"id": "c", "cond": {}}\n')
    assert sorted(read_records(path)) == ["a", "c"]
    path.write_text('{"id": "a"}\nnot json\n{"id": "d"}\n')  # a bad line in the middle hides nothing after it
    assert sorted(read_records(path)) == ["a", "d"]


def test_passes_join_per_question_and_other_checkpoints_records_are_never_read(tmp_path):
    store = Records(folder=tmp_path, kind="general", base_tag={"receiver_w": "r"}, fuser_id="f", control_id="c")
    cond = lambda c, pick: {c: {"acc": pick, "norm": pick, "s": 0.1}}  # noqa: E731
    lines = {None: [{"id": "q1", "answer": 0, "cond": cond("receiver", 0), "receiver_w": "r"},
                    {"id": "q2", "answer": 1, "cond": cond("receiver", 1), "receiver_w": "r"},
                    {"id": "q3", "answer": 1, "cond": cond("receiver", 0), "receiver_w": "other model"}],
             "general": [{"id": "q1", "answer": 0, "cond": cond("c2c", 0), "fuser_id": "f", "delta": {"x": 1.0}},
                         {"id": "q2", "answer": 1, "cond": cond("c2c", 0), "fuser_id": "an old fuser"},
                         {"id": "q3", "answer": 1, "cond": cond("c2c", 1), "fuser_id": "f"}],
             "general.control": [{"id": "q2", "answer": 1, "cond": cond("control", 1), "control_id": "c"}]}
    for group, recs in lines.items():
        record_file(tmp_path, "OpenBookQA", group).write_text("".join(json.dumps(r) + "\n" for r in recs))
    assert [p.path.name for p in store.passes("OpenBookQA", ["receiver", "control"])] == [
        "openbookqa.base.jsonl", "openbookqa.general.control.jsonl"]
    # q2's fused record is another fuser's, q3's base record another model's: only q1 has both passes
    assert store.read("OpenBookQA", ["q3", "q2", "q1"], ["receiver", "c2c"]) == [
        {"id": "q1", "answer": 0, "cond": cond("receiver", 0) | cond("c2c", 0), "delta": {"x": 1.0}}]
    # the control joins where it was measured; its absence drops no question
    got = store.read("OpenBookQA", ["q1", "q2"], ["receiver", "control"])
    assert [r["id"] for r in got] == ["q1", "q2"] and "control" in got[1]["cond"] and "control" not in got[0]["cond"]
    assert store.missing("OpenBookQA", ["q1", "q2"], ["receiver", "control"])
    assert not store.missing("OpenBookQA", ["q1"], ["receiver", "c2c"])
