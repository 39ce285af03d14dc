import pytest
import torch

from c2c.errors import IncompatibleCacheError, RuntimeUnsupportedError
from c2c.runtime.kvcache import KVCache


def make(T: int, windows=(None, None), start: int = 0, H: int = 2, D: int = 4) -> KVCache:
    # keys[l][0, h, t, d] encodes the absolute position so slices can be checked by value
    keys, values = [], []
    for w in windows:
        n = KVCache.layer_length(T, w)
        pos = torch.arange(start + T - n, start + T, dtype=torch.float32)
        k = pos.view(1, 1, n, 1).expand(1, H, n, D).clone()
        keys.append(k)
        values.append(-k)
    return KVCache(keys=tuple(keys), values=tuple(values), token_ids=tuple(range(100, 100 + T)), start=start,
                   windows=tuple(windows))


def test_shapes_are_checked():
    c = make(5)
    with pytest.raises(IncompatibleCacheError, match="layer 0 holds"):
        KVCache(keys=(c.keys[0][:, :, :3],), values=(c.values[0][:, :, :3],), token_ids=c.token_ids)
    with pytest.raises(IncompatibleCacheError):
        KVCache(keys=c.keys, values=c.values[:1], token_ids=c.token_ids)


def test_slice_keeps_absolute_positions_and_tokens():
    c = make(10)
    s = c.slice(3, 7)
    assert (s.start, s.end, s.seq_len) == (3, 7, 4)
    assert s.token_ids == (103, 104, 105, 106)
    assert s.keys[1][0, 0, :, 0].tolist() == [3.0, 4.0, 5.0, 6.0]
    with pytest.raises(IncompatibleCacheError, match="outside"):
        c.slice(8, 12)


def test_sliding_layer_holds_last_window_minus_one():
    c = make(10, windows=(None, 4))
    assert c.keys[1].shape[2] == 3
    tail = c.slice(6, 10)  # the sliding layer needs only positions 7..9
    assert tail.keys[1][0, 0, :, 0].tolist() == [7.0, 8.0, 9.0]
    with pytest.raises(RuntimeUnsupportedError, match="sliding window 4"):
        c.slice(2, 5)  # the sliding layer no longer holds positions 2..4


def test_append_requires_contiguous_positions_and_trims_windows():
    a, b = make(4, windows=(None, 4)), make(3, windows=(None, 4), start=4)
    ab = a.append(b)
    assert ab.seq_len == 7 and ab.token_ids == a.token_ids + b.token_ids
    assert ab.keys[0][0, 0, :, 0].tolist() == list(range(7))
    assert ab.keys[1][0, 0, :, 0].tolist() == [4.0, 5.0, 6.0]
    with pytest.raises(IncompatibleCacheError, match="re-position"):
        a.append(make(3, windows=(None, 4), start=9))


def test_nbytes_and_diff():
    c = make(6)
    assert c.nbytes == 2 * 2 * (1 * 2 * 6 * 4) * 4
    assert c.max_abs_diff(c) == 0.0
    other = make(6, start=1)
    assert c.max_abs_diff(other) == 1.0
