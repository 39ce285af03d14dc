"""Format version 2: caches cut into chunks keyed by their tokens, each chunk checked on its own."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from c2c.artifact import Artifact, chunks
from c2c.artifact.codec import chunk_geometry
from c2c.artifact.prefix import PrefixRef
from c2c.errors import CorruptArtifactError
from c2c.runtime.kvcache import KVCache
from c2c.testing.synthetic import as_version_1, synthetic_cache, synthetic_fingerprint

C = chunks.CHUNK_TOKENS


def _artifact(cache: KVCache, **kw) -> Artifact:
    fp = replace(synthetic_fingerprint(sliding=cache.windows[0] is not None), dtype="float32")
    return Artifact.build(cache, fingerprint=fp, prefix=PrefixRef.of(cache.token_ids[:3]), **kw)


def _grown(base: KVCache, extra: int, seed: int) -> KVCache:
    """``base`` followed by ``extra`` more tokens of other K/V (another agent's continuation)."""
    more = synthetic_cache(extra, start=base.end, seed=seed)
    return base.append(replace(more, token_ids=tuple(range(5000 + seed, 5000 + seed + extra))))


def test_caches_that_share_a_prefix_share_its_chunks_and_no_other():
    shared = synthetic_cache(2 * C + 10)                    # 2 whole chunks, then 10 tokens
    a, b = _artifact(_grown(shared, 100, 1)).header.chunks, _artifact(_grown(shared, 100, 2)).header.chunks
    assert a.keys[:2] == b.keys[:2] and a.digests[:2] == b.digests[:2]
    assert a.keys[2] != b.keys[2] and a.digests[2] != b.digests[2]  # chunk 2 holds the 10 shared tokens and more
    assert len(a) == chunks.count(2 * C + 110) == 4 and a.tokens == C


def test_a_key_names_the_model_the_dtype_and_the_start():
    cache = synthetic_cache(C)
    base = _artifact(cache).header
    seeds = {base.chunk_seed(),
             replace(base, dtype="BF16").chunk_seed(),
             replace(base, fingerprint=replace(base.fingerprint, head_dim=16)).chunk_seed(),
             replace(base, start=3).chunk_seed()}
    assert len(seeds) == 4
    # the same bytes under another key are another chunk
    assert chunks.digest("0" * 64, [b"kv"]) != chunks.digest("1" * 64, [b"kv"])


def test_every_byte_of_the_data_section_is_in_exactly_one_chunk_or_the_tail():
    for sliding in (False, True):
        art = _artifact(synthetic_cache(3 * C + 5, sliding=sliding))
        geo = chunk_geometry(art.header)
        covered = sorted(r for i in range(geo.count) for r in geo.runs(i)) + sorted(geo.tail)
        pos = 0
        for off, n in sorted(covered):
            assert off == pos
            pos += n
        head_len = len(art.encode_head())
        assert pos == len(art.encode()) - head_len and geo.has_tail == sliding


def test_swapped_chunks_are_refused_naming_the_chunk():
    art = _artifact(synthetic_cache(3 * C))
    data = bytearray(art.encode())
    geo, head = chunk_geometry(art.header), len(art.encode_head())
    (o0, n), (o1, _) = geo.runs(0)[0], geo.runs(1)[0]
    data[head + o0: head + o0 + n], data[head + o1: head + o1 + n] = \
        data[head + o1: head + o1 + n], data[head + o0: head + o0 + n]
    with pytest.raises(CorruptArtifactError, match=r"chunk 0 \(tokens 0\.\.63\)"):
        Artifact.decode(bytes(data))


def test_a_tampered_tail_is_refused():
    art = _artifact(synthetic_cache(2 * C, sliding=True))
    data = bytearray(art.encode())
    off, _ = chunk_geometry(art.header).tail[0]
    data[len(art.encode_head()) + off] ^= 0x40
    with pytest.raises(CorruptArtifactError, match="tail"):
        Artifact.decode(bytes(data))


def test_a_header_whose_keys_or_digests_were_edited_is_refused():
    art = _artifact(synthetic_cache(2 * C))
    c = art.header.chunks
    swapped = replace(art, header=replace(art.header, chunks=replace(c, keys=c.keys[::-1])))
    with pytest.raises(CorruptArtifactError, match="chunk keys do not match"):
        Artifact.decode(swapped.encode())
    edited = replace(art, header=replace(art.header, chunks=replace(c, digests=c.digests[::-1])))
    with pytest.raises(CorruptArtifactError, match="tensor_digest does not match its chunk digests"):
        Artifact.decode(edited.encode())


def test_withheld_tokens_keep_the_keys_the_producer_computed():
    cache = synthetic_cache(C + 1)
    full, withheld = _artifact(cache).header, _artifact(cache, withhold_tokens=True).header
    assert full.chunks.keys == withheld.chunks.keys and withheld.tokens is None
    assert Artifact.decode(_artifact(cache, withhold_tokens=True).encode()).header.chunks == withheld.chunks


def test_version_1_artifacts_are_still_read_unchanged():
    art = _artifact(synthetic_cache(10))
    old = as_version_1(art)
    back = Artifact.decode(old)
    assert back.header.version == 1 and back.header.chunks is None and "chunks" not in back.header.to_dict()
    assert back.encode() == old                       # the same bytes, so the same id and signature
    assert torch.equal(back.cache.keys[0], art.cache.keys[0])
    bad = bytearray(old)
    bad[-1] ^= 1
    with pytest.raises(CorruptArtifactError, match="tensor_digest"):
        Artifact.decode(bytes(bad))
