"""Hostile input: a corpus of bad artifacts, each with its specific error, and a fuzz of the parser."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings

from c2c.artifact import Artifact
from c2c.errors import C2CError
from c2c.testing import hostile
from c2c.testing.hostile import DOMAIN
from c2c.trust.signing import load_signed


@pytest.fixture(scope="module")
def keys(tmp_path_factory):
    return hostile.keys_for_corpus(tmp_path_factory.mktemp("keys"))


@pytest.fixture(scope="module")
def corpus(keys):
    _, key, other, revoked = keys
    return hostile.corpus(key, other, revoked)


def test_corpus_is_broad(corpus):
    assert len(corpus) >= 60
    assert len({err for _, _, err, _ in corpus}) >= 9


def test_every_corpus_entry_gets_its_specific_error(corpus, keys):
    ring = keys[0]
    wrong = []
    for name, data, err, stage in corpus:
        try:
            if stage == "decode":
                Artifact.decode(data)
            elif stage == "decode-small":
                Artifact.decode(data, max_bytes=len(data) - 1)
            elif stage in ("signature", "valid"):
                art, _ = load_signed(data, ring, domain=DOMAIN)
                if stage == "valid":
                    assert art.header.labels["span"] == '","tokens":[1,2],"x":"'
                    assert art.header.tokens == tuple(range(100, 106))
                    continue
            wrong.append((name, "accepted"))
        except C2CError as e:
            if not isinstance(e, err):
                wrong.append((name, f"{type(e).__name__} instead of {err.__name__}: {e}"))
        except Exception as e:  # noqa: BLE001 - a crash is what this test looks for
            wrong.append((name, f"CRASH {type(e).__name__}: {e}"))
    assert not wrong, wrong


@pytest.fixture(scope="module")
def bases(keys):
    _, key, _, _ = keys
    return hostile.base_artifacts(key)


def test_fuzzed_artifacts_get_c2c_errors_never_crashes(bases, keys):
    ring = keys[0]
    raw = [a.encode() for _, a in bases]
    signed = [name.startswith("signed") for name, _ in bases]
    seen = {"inputs": 0, "accepted": 0}

    @settings(max_examples=500, deadline=None, database=None, derandomize=True,
              suppress_health_check=list(HealthCheck))
    @given(hostile.fuzz_inputs(raw))
    def run(case):
        i, data = case
        seen["inputs"] += 1
        try:
            Artifact.decode(data)
            seen["accepted"] += 1
        except C2CError:
            pass
        if i >= 0 and signed[i] and data != raw[i]:
            with pytest.raises(C2CError):
                load_signed(data, ring, domain=DOMAIN)

    run()
    assert seen["inputs"] >= 500


def test_field_level_fuzz_signed_by_a_trusted_key_never_crashes_a_consumer(keys, tmp_path):
    """Hostile header fields, signed by a compromised but trusted key, reach parse, signature,
    prefix, slicing and a store commit; every outcome is a C2CError or a consumed artifact."""
    from c2c.store import open_store

    ring, key, _, _ = keys
    bases = [a for _, a in hostile.base_artifacts(key)]
    outcomes: dict[str, int] = {}
    with open_store(f"sqlite:///{tmp_path / 'store'}") as store:
        @settings(max_examples=400, deadline=None, database=None, derandomize=True,
                  suppress_health_check=list(HealthCheck))
        @given(hostile.field_fuzz_inputs(key, bases))
        def run(data):
            got = hostile.consume(data, ring, store)  # raises on a crash
            outcomes[got] = outcomes.get(got, 0) + 1

        run()
    assert sum(outcomes.values()) >= 400
    assert outcomes.get("consumed", 0) >= 3, outcomes           # the fuzz reaches the consumers
    assert sum(v for k, v in outcomes.items() if k.startswith("refused")) >= 200, outcomes
