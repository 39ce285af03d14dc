"""c2c.serve.render.continuation: where a request's messages begin with a commit's own tokens."""

from __future__ import annotations

from c2c.errors import RuntimeUnsupportedError
from c2c.serve.render import Part, Rendering, continuation


class KV:
    """Stands for a KVCache: records the absolute positions it is cut at (or refuses, as a sliding layer does)."""

    def __init__(self, token_ids: tuple[int, ...], start: int = 2, refuse: bool = False):
        self.token_ids, self.start, self.refuse = token_ids, start, refuse

    def slice(self, start: int, end: int):
        if self.refuse:
            raise RuntimeUnsupportedError("layer 3 (sliding window 4) no longer holds positions 2..5")
        return (start, end)


def own(*messages: tuple[int, ...]) -> Rendering:
    return Rendering(parts=(Part(label="prefix", token_ids=(1, 2)),
                            *(Part(label=f"m{i}", token_ids=m) for i, m in enumerate(messages)),
                            Part(label="prompt", token_ids=(9,))))


def test_the_commits_kv_lie_on_the_messages_it_covers_at_their_positions():
    r = own((3, 4), (5,), (6, 7, 8))
    c = continuation(r, (1, 2, 3, 4, 5), Part(label="from:a", token_ids=(3, 4, 5), kv=KV((3, 4, 5))))
    assert c.messages == 2 and c.carried
    assert [p.kv for p in c.rendering.parts] == [None, (2, 4), (4, 5), None, None]
    assert c.rendering.token_ids == r.token_ids


def test_no_continuation_unless_the_messages_begin_with_the_commit_on_a_boundary():
    r = own((3, 4), (5,))
    part = Part(label="from:a", token_ids=(3,), kv=KV((3,)))
    assert continuation(r, (1, 2, 3), part) is None            # ends inside a message
    assert continuation(r, (1, 2, 4, 4), part) is None         # another first message
    assert continuation(r, (1, 7, 3, 4), part) is None         # another prefix
    assert continuation(r, (1, 2), part) is None               # the prefix alone
    assert continuation(r, (1, 2, 3, 4, 5, 9), part) is None   # never the generation prompt


def test_on_the_text_path_or_where_the_kv_cannot_be_cut_the_messages_are_prefilled_as_sent():
    r = own((3, 4), (5,))
    for attached in (None, Part(label="from:a", token_ids=(3, 4)), Part(label="from:a", token_ids=(3, 4),
                                                                         kv=KV((3, 4), refuse=True)),
                     Part(label="from:a", token_ids=(3, 4), kv=KV((8, 8)))):   # K/V of other tokens (mapped)
        c = continuation(r, (1, 2, 3, 4), attached)
        assert c.messages == 1 and not c.carried and c.rendering is r
