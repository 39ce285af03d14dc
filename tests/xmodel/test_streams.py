"""c2c.xmodel.streams.instructions: distinct, bounded, in the corpora's seeded order; too few is said."""

from __future__ import annotations

import pytest

from c2c.errors import ConfigError
from c2c.xmodel import streams


def test_instructions_are_distinct_bounded_and_refused_when_too_few(monkeypatch):
    pairs = [("a", "1"), ("b", "2"), ("a", "3"), ("x" * 50, "4"), ("c", "5")]
    monkeypatch.setattr(streams, "examples", lambda seed=0: pairs)
    assert streams.instructions(3, max_chars=10) == ["a", "b", "c"]
    assert streams.instructions(4, max_chars=100) == ["a", "b", "x" * 50, "c"]
    with pytest.raises(ConfigError, match="only 3 distinct instructions of at most 10 characters"):
        streams.instructions(4, max_chars=10)
