"""llama.cpp slot files (``llama-server --slot-save-path``) to c2c artifacts, and back.

A slot file holds a conversation's tokens and its KV cache in llama.cpp's own
layout (:mod:`c2c.runtime.llama_state`). :func:`artifact_from_slot` makes it an
ordinary artifact (per-layer f16 K/V, the llama.cpp runtime's fingerprint), so a
llama-server user can sign, store, verify and invalidate slot saves like any
other cache; :func:`slot_from_artifact` writes one back that llama-server restores.
Only llama.cpp caches go either way: a transformers cache has another layout and
other numerics, and is refused.
"""

from __future__ import annotations

from typing import Sequence

from c2c.artifact.codec import Artifact
from c2c.artifact.fingerprint import Fingerprint
from c2c.artifact.prefix import PrefixRef
from c2c.errors import CorruptArtifactError, FingerprintMismatchError, PrefixMismatchError
from c2c.runtime.kvcache import KVCache
from c2c.runtime.llama_state import build_seq_state, build_slot_file, parse_seq_state, parse_slot_file
from c2c.runtime.protocol import Runtime

LLAMA_CPP = "llama.cpp"  # the engine whose caches slot files hold


def artifact_from_slot(data: bytes | bytearray | memoryview, runtime: Runtime, *, prefix_ids: Sequence[int] = (),
                       producer: dict[str, str] | None = None) -> Artifact:
    """The slot file ``data`` as an (unsigned) artifact of ``runtime``, a llama.cpp runtime of the same GGUF.

    ``prefix_ids``: the shared prefix (BOS and system turn) the conversation must start with.

    Raises:
        CorruptArtifactError: not a slot file, or its cells do not match its tokens.
        PrefixMismatchError: the conversation does not start with ``prefix_ids``.
        FingerprintMismatchError: ``runtime`` is not a llama.cpp runtime.
    """
    engine = runtime.engine_id
    if engine.kind != LLAMA_CPP:
        raise FingerprintMismatchError("a llama.cpp slot file becomes an artifact of a llama.cpp runtime only "
                                       "(load the model with --backend llama.cpp)")
    tokens, state = parse_slot_file(data)
    f = runtime.facts
    seq = parse_seq_state(state, kv_heads=f.kv_heads, head_dim=f.head_dim, num_layers=f.num_layers)
    if seq.positions != tuple(range(len(tokens))):
        raise CorruptArtifactError(f"the slot file holds {len(tokens)} tokens but cells at positions "
                                   f"{seq.positions[:3]}...; c2c takes a plain conversation from position 0")
    if str(int(seq.v_trans)) != engine.option("v_trans"):
        raise CorruptArtifactError(f"the slot's V layout (v_trans {int(seq.v_trans)}) is not this runtime's "
                                   f"({engine.option('v_trans')}); save it with the same flash-attention setting")
    if tuple(tokens[:len(prefix_ids)]) != tuple(prefix_ids):
        raise PrefixMismatchError("the slot's conversation does not start with the shared prefix (system turn) "
                                  "given; pass the system prompt it was made with")
    cache = KVCache(keys=seq.keys, values=seq.values, token_ids=tuple(tokens), windows=f.windows)
    return Artifact.build(cache, fingerprint=Fingerprint.of(runtime), prefix=PrefixRef.of(tuple(prefix_ids)),
                          producer=producer or {"agent": "llama-server"}, labels={"source": "llama.cpp slot"})


def slot_from_artifact(artifact: Artifact) -> bytes:
    """A slot file llama-server (``/slots/{id}?action=restore``) reads, from a full llama.cpp artifact.

    Raises:
        FingerprintMismatchError: the artifact was not made by the llama.cpp backend.
        CorruptArtifactError: it is a slice, or withholds its tokens.
    """
    h = artifact.header
    engine = h.fingerprint.backend
    v_trans = engine.option("v_trans")
    if engine.kind != LLAMA_CPP or v_trans not in ("0", "1"):
        raise FingerprintMismatchError(f"this artifact was made by the {engine.kind} backend; only a "
                                       "llama.cpp cache can be written as a llama.cpp slot file")
    if h.kind != "full" or h.tokens is None:
        raise CorruptArtifactError("a slot file holds a whole conversation from position 0 with its tokens; this "
                                   "artifact is a slice or withholds its tokens")
    c = artifact.cache
    return build_slot_file(h.tokens, build_seq_state(c.keys, c.values, range(c.start, c.end),
                                                     v_trans=v_trans == "1"))
