"""The llama.cpp engine beyond the conformance suite (test_engine_conformance.py), on real zoo models.

Its context keeps a cache resident and continues the same however it got there; its caches never
cross to transformers (the fingerprints differ); it refuses what it cannot do with a specific error;
and llama-server's slot files round-trip through signed artifacts.
"""

from __future__ import annotations

import ctypes
from dataclasses import replace

import pytest

from c2c.artifact import Artifact
from c2c.artifact.fingerprint import Fingerprint
from c2c.artifact.prefix import PrefixRef
from c2c.errors import FingerprintMismatchError, IncompatibleCacheError, RuntimeUnsupportedError
from c2c.runtime.facts import EngineId

pytestmark = [pytest.mark.zoo]
llama_cpp = pytest.importorskip("llama_cpp")

DOC = ("The build failed because the test runner ran out of memory while loading a 2 GB fixture. "
       "Splitting the fixture into four parts fixed it, and the suite now runs in 6 minutes.")


def prompt(rt) -> list[int]:
    text = rt.render_turn("system", "You are brief.") + rt.render_turn("user", DOC + " What fixed it?")
    return list(rt.bos_ids) + rt.encode(text + rt.generation_prompt())


@pytest.mark.parametrize("name", ["SmolLM2-135M-Instruct", "Qwen2.5-Coder-0.5B-Instruct"])
def test_a_llama_cpp_cache_continues_the_same_whatever_the_context_held_before(zoo_model, name):
    """A cache continued while it is still in llama.cpp's context (the fast path: later cells dropped), right after
    other work grew that context, or restored from bytes after another conversation: the same head K/V, bit for
    bit, and the same next-token argmax with logits within 0.1% (one 5-token batch at the same positions each time)."""
    rt = zoo_model(name, backend="llama.cpp")
    ids = prompt(rt)
    _, head = rt.prefill(ids[:-5])
    first, grown = rt.prefill(ids[-5:], head)                      # (vocab,); head still resident
    again, _ = rt.prefill(ids[-5:], head)                          # resident, 5 stale cells after it
    rt.generate(rt.encode(" and then"), grown, max_new_tokens=6)   # the context grows past the head
    after_growth, _ = rt.prefill(ids[-5:], head)
    rt.generate(rt.encode("Another conversation entirely."), None, max_new_tokens=6)
    restored, cache = rt.prefill(ids[-5:], head)                   # the head comes back from bytes
    n = head.seq_len
    assert cache.token_ids == grown.token_ids
    assert all(k[:, :, :n].equal(h) for k, h in zip(cache.keys, head.keys))
    assert all(v[:, :, :n].equal(h) for v, h in zip(cache.values, head.values))
    for logits in (again, after_growth, restored):
        assert int(logits.argmax()) == int(first.argmax())
        assert (logits.float() - first.float()).abs().max() < 1e-3 * first.float().abs().max()


@pytest.mark.parametrize("name", ["SmolLM2-135M-Instruct"])
def test_caches_never_cross_backends(zoo_model, name):
    hf, lc = zoo_model(name, backend="transformers"), zoo_model(name, backend="llama.cpp")
    fh, fl = Fingerprint.of(hf), Fingerprint.of(lc)
    assert fl.backend.kind == "llama.cpp" and fl.backend.option("gguf") == lc.facts.quantization
    assert fl.backend.option("kv") == "f16" and fl.backend.numerics.startswith("cpu/")
    assert fh.backend.kind == "transformers" and fh.backend.numerics.endswith("linear-dense")
    assert {"backend", "weights_digest"} <= set(fh.diff(fl))
    # a header made before engines named their numerics ("transformers", left out) still reads, as another engine
    old = {k: v for k, v in fh.to_dict().items() if k != "backend"}
    assert Fingerprint.from_dict(old).backend == EngineId(kind="transformers") and "backend" in fh.diff(
        Fingerprint.from_dict(old))
    with pytest.raises(FingerprintMismatchError):
        fh.require_same(fl)
    _, cache = lc.prefill(prompt(lc)[:12])
    with pytest.raises(IncompatibleCacheError):  # f16 llama.cpp K/V into an fp32 transformers model
        hf.prefill([5], cache)
    art = Artifact.decode(Artifact.build(cache, fingerprint=fl, prefix=PrefixRef.of(cache.token_ids[:2])).encode())
    assert art.header.fingerprint == fl


def test_what_llama_cpp_cannot_do_is_refused_by_name(zoo_model):
    with pytest.raises(RuntimeUnsupportedError, match="sliding-window"):
        zoo_model("Gemma-3-270M", backend="llama.cpp")
    lc = zoo_model("SmolLM2-135M-Instruct", backend="llama.cpp")
    _, cache = lc.prefill(prompt(lc)[:16])
    with pytest.raises(RuntimeUnsupportedError, match="re-position"):
        lc.reposition(cache.slice(4, 16), 2)
    from c2c.mc.score import score_options
    from c2c.runtime.protocol import CAPABILITIES, Gradients, Scoring, require

    assert not any(isinstance(lc, cap) for cap in CAPABILITIES)  # none of them, not half of one
    with pytest.raises(RuntimeUnsupportedError, match="transformers backend"):
        require(lc, Scoring).logits([1, 2, 3])
    with pytest.raises(RuntimeUnsupportedError, match="score options"):  # what a user calls: scoring, by name
        score_options(lc, "Q: 1+1? A:", [" 2", " 3"])
    with pytest.raises(RuntimeUnsupportedError, match="position 0"):
        lc.prefill([5], replace(cache.slice(4, 16)))
    with pytest.raises(RuntimeUnsupportedError, match="fuser"):
        require(lc, Gradients)
    from c2c.runtime import adapters

    with pytest.raises(RuntimeUnsupportedError, match="LoRA"):
        adapters.train(lc, ["some text"], "unused-dir", steps=1)


def test_a_llama_server_slot_file_round_trips_through_a_signed_store_and_continues(zoo_model, tmp_path):
    """Slot saved by llama.cpp itself -> signed artifact -> store -> slot file -> restored -> same tokens."""
    from c2c.artifact.slots import artifact_from_slot, slot_from_artifact
    from c2c.store import open_store
    from c2c.trust import Keyring, sign
    from c2c.trust.signing import load_signed

    lc = zoo_model("Qwen2.5-Coder-0.5B-Instruct", backend="llama.cpp")
    ids = prompt(lc)
    _, cache = lc.prefill(ids)  # the context now holds the conversation, as a llama-server slot would
    slot = tmp_path / "slot0.bin"
    toks = (ctypes.c_int32 * len(ids))(*ids)
    assert llama_cpp.llama_state_seq_save_file(lc._ctx, str(slot).encode(), 0, toks, len(ids)) > 0
    # A restored slot re-feeds its last token to get logits (llama.cpp keeps none in the file), so the
    # reference is the same computation on the original K/V: all but the last token, then the last alone.
    # (A one-token decode rounds differently from the batched prefill, so it is not compared with that.)
    expected = lc.generate([ids[-1]], cache.slice(0, len(ids) - 1), max_new_tokens=8).token_ids

    ring = Keyring(tmp_path / "keys")
    key = ring.create_key("lab")
    art = sign(artifact_from_slot(slot.read_bytes(), lc, prefix_ids=ids[:3]), key)
    with open_store(f"sqlite:///{tmp_path / 'store'}") as store:
        commit = store.put(art.encode(), stream="llama-server")
        back, signer = load_signed(store.get(commit.id).data, ring, domain="lab")
    assert signer.domain == "lab" and back.header.tokens == tuple(ids)
    out = tmp_path / "restored.bin"
    out.write_bytes(slot_from_artifact(back))
    assert out.read_bytes() == slot.read_bytes()  # byte for byte what llama.cpp wrote

    # a fresh llama.cpp context restores the file (as llama-server's slot restore does) and continues
    fresh = llama_cpp.Llama(model_path=str(lc.path), n_ctx=2048, n_threads=2, verbose=False)
    buf, n = (ctypes.c_int32 * 4096)(), ctypes.c_size_t(0)
    assert llama_cpp.llama_state_seq_load_file(fresh._ctx.ctx, str(out).encode(), 0, buf, 4096,
                                               ctypes.byref(n)) > 0
    assert list(buf[: n.value]) == ids
    fresh.n_tokens = len(ids) - 1  # re-feed the last prompt token to get its logits
    fresh.input_ids[: len(ids)] = ids
    got = []
    for tok in fresh.generate([ids[-1]], top_k=1, temp=0.0, reset=False):
        got.append(int(tok))
        if len(got) == 8 or int(tok) in lc.eos_ids:
            break
    fresh.close()
    assert tuple(got) == expected


def test_a_transformers_artifact_is_never_written_as_a_slot(zoo_model):
    from c2c.artifact.slots import artifact_from_slot, slot_from_artifact

    hf = zoo_model("SmolLM2-135M-Instruct", backend="transformers")
    _, cache = hf.prefill(prompt(hf)[:8])
    art = Artifact.build(cache, fingerprint=Fingerprint.of(hf), prefix=PrefixRef.of(cache.token_ids[:2]))
    with pytest.raises(FingerprintMismatchError, match="only a llama.cpp cache"):
        slot_from_artifact(art)
    with pytest.raises(FingerprintMismatchError, match="llama.cpp runtime only"):
        artifact_from_slot(b"", hf)


def test_the_slot_commands_import_sign_store_and_export_a_llama_server_slot(zoo_model, tmp_path, capsys):
    import json

    from c2c.cli.main import main
    from c2c.store import open_store
    from c2c.trust import Keyring

    lc = zoo_model("SmolLM2-135M-Instruct", backend="llama.cpp")
    system = "You are brief."
    ids = list(lc.bos_ids) + lc.encode(lc.render_turn("system", system) + lc.render_turn("user", DOC))
    lc.prefill(ids)
    slot = tmp_path / "slot.bin"
    assert llama_cpp.llama_state_seq_save_file(lc._ctx, str(slot).encode(), 0, (ctypes.c_int32 * len(ids))(*ids),
                                                len(ids)) > 0
    Keyring(tmp_path / "keys").create_key("lab")
    store = f"sqlite:///{tmp_path / 'store'}"
    art = tmp_path / "slot.c2c"
    assert main(["import-slot", str(slot), "--model", "SmolLM2-135M-Instruct", "--system", system, "--out", str(art),
                 "--sign-as", "lab", "--keyring", str(tmp_path / "keys"), "--store", store, "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["signed"] and info["tokens"] == len(ids) and info["backend"].startswith("llama.cpp")
    with open_store(store) as s:
        assert s.show(info["commit"]).commit.summary["dtype"] == "F16"
    back = tmp_path / "back.bin"
    assert main(["export-slot", str(art), "--out", str(back), "--domain", "lab", "--keyring",
                 str(tmp_path / "keys")]) == 0
    assert back.read_bytes() == slot.read_bytes()
    capsys.readouterr()
    # the wrong system prompt is refused by name (the prefix must match), and so is another domain
    assert main(["import-slot", str(slot), "--model", "SmolLM2-135M-Instruct", "--system", "Other.",
                 "--out", str(tmp_path / "x.c2c")]) == 2
    assert "PrefixMismatchError" in capsys.readouterr().err and not (tmp_path / "x.c2c").exists()
    assert main(["export-slot", str(art), "--out", str(tmp_path / "y.bin"), "--domain", "ops", "--keyring",
                 str(tmp_path / "keys")]) == 2
    assert not (tmp_path / "y.bin").exists()


def test_the_handoff_bench_runs_on_llama_cpp(zoo_model, capsys):
    """Its slice is re-prefilled after the shared prefix (isolation recompute) and lands right after the
    writer's prefix, where it was computed: no re-positioning is needed, so llama.cpp takes it too."""
    from c2c.cli.main import main

    zoo_model("SmolLM2-135M-Instruct", backend="llama.cpp")  # pulled and its GGUF assembled
    assert main(["bench", "handoff", "--model", "SmolLM2-135M-Instruct", "--backend", "llama.cpp",
                 "--message-tokens", "8", "--context-tokens", "48", "--answer-tokens", "4", "--json"]) == 0
    r = __import__("json").loads(capsys.readouterr().out)
    assert r["exact"] is True and r["machine"]["dtype"] == "float16" and r["cache_pipeline_s"] > 0
    assert r["slice_pipeline_s"] > 0 and "slice_unsupported" not in r


def test_export_and_import_slot_agree_on_the_shared_prefix_of_one_system_prompt(zoo_model, tmp_path, capsys):
    """`c2c export --system S` and `c2c import-slot --system S` bind their artifacts to one shared prefix,
    whitespace and all: llama-server writes the system text as it was sent, so both take it verbatim."""
    from c2c.cli.main import main

    lc = zoo_model("SmolLM2-135M-Instruct", backend="llama.cpp")
    system = "You are brief.\n"
    verbatim = lambda text: tuple(lc.bos_ids) + tuple(lc.encode(lc.render_turn("system", text)))
    ids = list(verbatim(system)) + lc.encode(lc.render_turn("user", DOC))
    lc.prefill(ids)
    slot = tmp_path / "slot.bin"
    assert llama_cpp.llama_state_seq_save_file(lc._ctx, str(slot).encode(), 0, (ctypes.c_int32 * len(ids))(*ids),
                                                len(ids)) > 0
    exported, imported = tmp_path / "export.c2c", tmp_path / "import.c2c"
    assert main(["export", "--model", "SmolLM2-135M-Instruct", "--backend", "llama.cpp", "--system", system,
                 "--prompt", DOC, "--out", str(exported), "--json"]) == 0
    assert main(["import-slot", str(slot), "--model", "SmolLM2-135M-Instruct", "--system", system,
                 "--out", str(imported), "--json"]) == 0
    capsys.readouterr()
    a, b = Artifact.read(exported).header.prefix, Artifact.read(imported).header.prefix
    assert a == b == PrefixRef.of(verbatim(system)) != PrefixRef.of(verbatim(system.strip()))


def test_steppers_interleaved_on_one_context_keep_their_own_sequences(zoo_model):
    """A served turn grows its sequence inside llama.cpp and exports it once (``LlamaCppRuntime.stepper``). When
    another sequence takes the context between two passes (the model's turn passed to another tenant, or a plain
    prefill), the holder is exported first and restored after: each stepper ends as it would alone."""
    rt = zoo_model("SmolLM2-135M-Instruct", backend="llama.cpp")
    a, b = prompt(rt), list(rt.bos_ids) + rt.encode("Another conversation entirely, about ships and the sea.")

    def alone(ids):
        s = rt.stepper(None)
        logits = [s.feed(ids[:-3]), s.feed(ids[-3:-1]), s.feed(ids[-1:])]
        return logits, s.cache()

    (la, ca), (lb, cb) = alone(a), alone(b)
    sa, sb = rt.stepper(None), rt.stepper(None)
    got_a, got_b = [sa.feed(a[:-3])], [sb.feed(b[:-3])]
    rt.prefill(rt.encode("A third sequence."))          # a plain prefill takes the context too
    got_a.append(sa.feed(a[-3:-1]))
    got_b.append(sb.feed(b[-3:-1]))
    got_b.append(sb.feed(b[-1:]))                         # sb holds the context: no export between these two
    got_a.append(sa.feed(a[-1:]))
    for got, ref, cache, ref_cache in ((got_a, la, sa.cache(), ca), (got_b, lb, sb.cache(), cb)):
        assert cache.token_ids == ref_cache.token_ids
        assert cache.max_abs_diff(ref_cache) < 1e-2     # f16 K/V, restored from bytes between passes
        for x, y in zip(got, ref):
            assert int(x.argmax()) == int(y.argmax())
            assert (x.float() - y.float()).abs().max() < 1e-3 * y.float().abs().max()
    with pytest.raises(RuntimeUnsupportedError, match="at least one token"):
        rt.stepper(None).cache()
    with pytest.raises(RuntimeUnsupportedError, match="at least one token"):
        rt.stepper(None).feed([])
