"""Graph: the DAG as a text tree and a PNG, and dependency queries on one snapshot."""

from __future__ import annotations

from store_helpers import artifact_bytes

from c2c.store import Graph, open_store


def build(tmp_path):
    store = open_store(f"sqlite:///{tmp_path / 's'}")
    a = store.put(artifact_bytes(1), stream="analyst")
    b = store.put(artifact_bytes(2), stream="writer", parents=[a.id])
    c = store.put(artifact_bytes(3), stream="critic", parents=[a.id])
    d = store.put(artifact_bytes(4), stream="editor", parents=[b.id, c.id])
    lone = store.put(artifact_bytes(5), stream="other")
    store.invalidate(c.id, reason="critic was wrong")
    return store, a, b, c, d, lone


def test_text_tree_draws_each_commit_once(tmp_path):
    store, a, b, c, d, lone = build(tmp_path)
    text = Graph.load(store).text()
    lines = text.splitlines()
    assert lines[0].startswith(a.id[:12]) and "analyst v1" in lines[0]
    assert sum(d.id[:12] in ln for ln in lines) == 2 and "(shown above)" in text
    assert any(c.id[:12] in ln and "STALE: invalidated: critic was wrong" in ln for ln in lines)
    assert any(ln.startswith(lone.id[:12]) for ln in lines)
    assert "├── " in text and "└── " in text
    assert Graph.load(open_store(f"sqlite:///{tmp_path / 'empty'}")).text() == "(empty store)"


def test_png_is_written_with_agg(tmp_path):
    store, *_ = build(tmp_path)
    out = Graph.load(store).png(tmp_path / "out" / "dag.png")
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and out.stat().st_size > 2000


def test_deps_and_stream_filter(tmp_path):
    store, a, b, c, d, lone = build(tmp_path)
    g = Graph.load(store)
    deps = g.deps(b.id, max_hops=1)
    assert deps.parents == (a.id,) and deps.children == (d.id,)
    assert deps.ancestors == (a.id,) and deps.dependents == (d.id,)
    assert g.deps(d.id, max_hops=1).hops.exceeded and g.deps(d.id).hops.depth == 2
    assert set(g.deps(a.id).dependents) == {b.id, c.id, d.id}
    assert g.depths()[d.id] == 2 and set(g.roots()) == {a.id, lone.id}
    sub = Graph.load(store, stream="critic")
    assert set(sub.records) == {a.id, c.id, d.id}
