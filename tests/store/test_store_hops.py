"""Hop depth: the longest chain of parents, the limit, and the refs a text fallback cites."""

from __future__ import annotations

import pytest

from c2c.errors import ConfigError
from c2c.store.hops import default_max_hops, hop_report_from


def graph(edges: dict[str, str]):
    full = {k * 64: tuple(p * 64 for p in v) for k, v in edges.items()}
    return lambda c: full[c]


def test_depth_is_the_longest_chain_and_refs_are_nearest_first():
    #   a -> b -> c -> e      and a shortcut a -> e
    #        d ------> e
    parents = graph({"a": "", "b": "a", "c": "b", "d": "", "e": "cad"})
    rep = hop_report_from("e" * 64, parents, max_hops=3)
    assert rep.depth == 3 and not rep.exceeded
    assert rep.chain == tuple(x * 64 for x in "abce")
    assert rep.refs == tuple(x * 64 for x in "eacdb")  # e, then its parents a c d, then b
    assert hop_report_from("e" * 64, parents, max_hops=2).exceeded
    root = hop_report_from("a" * 64, parents, max_hops=0)
    assert (root.depth, root.exceeded, root.chain) == (0, False, ("a" * 64,))
    assert "3 cache hops (limit 2)" in hop_report_from("e" * 64, parents, max_hops=2).fallback_text()


def test_limit_comes_from_the_environment(monkeypatch):
    monkeypatch.delenv("C2C_MAX_HOPS", raising=False)
    assert default_max_hops() == 3
    monkeypatch.setenv("C2C_MAX_HOPS", "5")
    assert default_max_hops() == 5
    for bad in ("-1", "many"):
        monkeypatch.setenv("C2C_MAX_HOPS", bad)
        with pytest.raises(ConfigError):
            default_max_hops()
