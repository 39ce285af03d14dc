"""`c2c export`, `continue`, `import-slot`, `export-slot` and `inspect`: make, use and read cache artifacts."""

from __future__ import annotations

import argparse
from pathlib import Path

from c2c.cli.main import add_runtime_flags, add_json_flag, command, emit
from c2c.errors import ConfigError


def register(sub) -> None:
    p = command(sub, "export", help="prefill a prompt on a model and write its KV-cache as an artifact",
                example="c2c export --model Qwen2.5-Coder-0.5B-Instruct --prompt 'Hello' --out hello.c2c\n"
                        "c2c export --model SmolLM2-135M-Instruct --prompt-file notes.txt --slice 40:80 --out notes.c2c\n"
                        "c2c export --model Qwen2.5-Coder-0.5B-Instruct --prompt 'Hello' --out hi.c2c --sign-as lab",
                func=_export)
    p.add_argument("--model", required=True, help="zoo model name or local model directory")
    add_runtime_flags(p)
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--prompt", help="text to prefill")
    src.add_argument("--prompt-file", type=Path, help="file whose text to prefill")
    p.add_argument("--system", default="You are a helpful assistant.",
                   help="shared system prompt (the prefix receivers must share)")
    p.add_argument("--out", required=True, type=Path, help="artifact file to write (atomically)")
    p.add_argument("--slice", help="export only token positions START:END (absolute, end exclusive)")
    p.add_argument("--withhold-tokens", action="store_true", help="do not put token ids in the header")
    p.add_argument("--sign-as", metavar="DOMAIN", help="sign with this trust domain's key (see `c2c keys new`)")
    p.add_argument("--keyring", type=Path, default=None, help="keyring directory (default C2C_HOME/keys)")
    add_json_flag(p)

    p = command(sub, "continue", help="attach an artifact (after checking model and prefix) and generate from it",
                example="c2c continue hello.c2c --model Qwen2.5-Coder-0.5B-Instruct --prompt 'Summarize that.'\n"
                        "c2c continue signed.c2c --model Qwen2.5-Coder-0.5B-Instruct --prompt 'Go on.' --domain lab",
                func=_continue)
    p.add_argument("file", type=Path, help="artifact file (from `c2c export` or a handoff)")
    p.add_argument("--model", required=True, help="zoo model name or local model directory")
    add_runtime_flags(p)
    p.add_argument("--prompt", required=True, help="the instruction to answer after the attached cache")
    p.add_argument("--system", default="You are a helpful assistant.",
                   help="shared system prompt; must be the one the artifact was made after")
    p.add_argument("--max-new-tokens", type=int, default=64, help="tokens to generate")
    p.add_argument("--domain", help="check signature and KV per this trust domain's policy before attaching "
                                    "(a slice is checked after the --system prefix it must follow)")
    p.add_argument("--keyring", type=Path, default=None, help="keyring directory (default C2C_HOME/keys)")
    add_json_flag(p)

    p = command(sub, "import-slot", help="turn a llama.cpp slot file (llama-server --slot-save-path) into a "
                                        "c2c artifact, signed if asked, stored if asked",
                example="c2c import-slot slots/analyst.bin --model Qwen2.5-Coder-0.5B-Instruct --out analyst.c2c "
                        "--sign-as lab\n"
                        "c2c import-slot slots/analyst.bin --model Qwen2.5-Coder-0.5B-Instruct --out a.c2c "
                        "--system 'You are one agent of a team.' --store sqlite:///./store --stream analyst",
                func=_import_slot)
    p.add_argument("file", type=Path, help="the slot file llama-server saved")
    p.add_argument("--model", required=True, help="the zoo model (or .gguf) llama-server ran: its GGUF is loaded "
                                                  "in llama.cpp for the fingerprint")
    p.add_argument("--system", default=None, help="the system prompt the conversation starts with (its turn is "
                                                  "the shared prefix receivers must share; default: none)")
    p.add_argument("--out", required=True, type=Path, help="artifact file to write (atomically)")
    p.add_argument("--sign-as", metavar="DOMAIN", help="sign with this trust domain's key (see `c2c keys new`)")
    p.add_argument("--keyring", type=Path, default=None, help="keyring directory (default C2C_HOME/keys)")
    p.add_argument("--store", default=None, metavar="URL", help="also commit it to this store (see `c2c store`)")
    p.add_argument("--stream", default="llama-server", help="the store stream to commit to (default llama-server)")
    add_json_flag(p)

    p = command(sub, "export-slot", help="write a llama.cpp artifact as a slot file llama-server can restore",
                example="c2c export-slot analyst.c2c --out slots/analyst.bin\n"
                        "# then: curl -X POST 'http://127.0.0.1:8080/slots/0?action=restore' "
                        "-d '{\"filename\": \"analyst.bin\"}'",
                func=_export_slot)
    p.add_argument("file", type=Path, help="artifact file (a full cache made by the llama.cpp backend)")
    p.add_argument("--out", required=True, type=Path, help="slot file to write (atomically)")
    p.add_argument("--domain", help="verify its signature for this trust domain first")
    p.add_argument("--keyring", type=Path, default=None, help="keyring directory (default C2C_HOME/keys)")
    add_json_flag(p)

    p = command(sub, "inspect", help="validate an artifact and print its header",
                example="c2c inspect hello.c2c --json", func=_inspect)
    p.add_argument("file", type=Path, help="artifact file")
    add_json_flag(p)


def _parse_slice(text: str) -> tuple[int, int]:
    try:
        a, b = (int(x) for x in text.split(":"))
    except ValueError:
        raise ConfigError(f"--slice must look like START:END, got {text!r}") from None
    return a, b


def _export(args: argparse.Namespace) -> int:
    from c2c.artifact.prefix import SharedPrefix
    from c2c.runtime import zoo
    from c2c.team.agent import Agent, Team

    prompt = args.prompt if args.prompt is not None else _read_text(args.prompt_file)
    runtime = zoo.load(args.model, dtype=args.dtype, backend=args.backend)
    agent = Agent("cli", runtime, Team(shared=SharedPrefix.build(args.system)))
    agent.read(prompt, label="evidence", private=False)
    artifact = agent.export(withhold_tokens=args.withhold_tokens)
    if args.slice:
        from c2c.artifact import Artifact

        start, end = _parse_slice(args.slice)
        plen = agent.context.prefix_len
        if not plen <= start < end <= agent.cache.end:
            raise ConfigError(f"--slice {start}:{end} must lie within positions {plen}:{agent.cache.end}; "
                              f"0:{plen} is the shared prefix every receiver already has")
        artifact = Artifact.build(agent.cache.slice(start, end), fingerprint=artifact.header.fingerprint,
                                  prefix=artifact.header.prefix, withhold_tokens=args.withhold_tokens,
                                  producer=artifact.header.producer)
    if args.sign_as:
        from c2c.trust import Keyring, sign

        artifact = sign(artifact, Keyring(args.keyring).signing_key(args.sign_as))
    n = artifact.write(args.out)
    info = {"id": artifact.id, "path": str(args.out), "bytes": n, "start": artifact.header.start,
            "end": artifact.header.end, "model": runtime.name}
    emit(args, info, f"wrote {args.out} ({n:,} bytes, positions {info['start']}:{info['end']}, id {artifact.id[:16]})")
    return 0


def _continue(args: argparse.Namespace) -> int:
    from c2c.artifact import Artifact
    from c2c.artifact.prefix import SharedPrefix
    from c2c.runtime import zoo
    from c2c.team.agent import Agent, Team

    artifact = Artifact.read(args.file)
    runtime = zoo.load(args.model, dtype=args.dtype, backend=args.backend)
    agent = Agent("cli", runtime, Team(shared=SharedPrefix.build(args.system)))
    report = None
    if args.domain:
        from c2c.trust import Keyring, check_received, slice_context

        prefix_ids = agent.context.token_ids[:agent.context.prefix_len]
        report = check_received(artifact, Keyring(args.keyring), args.domain, runtime=runtime, prefix_ids=prefix_ids,
                       context=slice_context(artifact.header.start, prefix_ids, agent.team.prefix_cache)).to_dict()
    agent.attach(artifact)
    gen = agent.respond(args.prompt, max_new_tokens=args.max_new_tokens)
    info = {"id": artifact.id, "attached_tokens": artifact.header.seq_len, "kind": artifact.header.kind,
            "text": gen.text, "prefill_s": gen.prefill_s, "decode_s": gen.decode_s, "trust": report}
    emit(args, info, gen.text)
    return 0


def _import_slot(args: argparse.Namespace) -> int:
    from c2c._io import read_bounded
    from c2c.artifact.prefix import prefix_token_ids
    from c2c.artifact.slots import artifact_from_slot
    from c2c.config import settings
    from c2c.runtime import zoo

    data = read_bounded(args.file, settings().max_artifact_bytes)
    runtime = zoo.load(args.model, backend="llama.cpp")
    artifact = artifact_from_slot(data, runtime, prefix_ids=prefix_token_ids(runtime, args.system))
    if args.sign_as:
        from c2c.trust import Keyring, sign

        artifact = sign(artifact, Keyring(args.keyring).signing_key(args.sign_as))
    payload = artifact.encode()
    from c2c._io import write_atomic

    write_atomic(args.out, payload)
    info = {"id": artifact.id, "path": str(args.out), "bytes": len(payload), "tokens": artifact.header.seq_len,
            "signed": artifact.signature is not None, "backend": str(artifact.header.fingerprint.backend)}
    if args.store:
        from c2c.store import open_store

        with open_store(args.store) as store:
            commit = store.put(payload, stream=args.stream)
        info["commit"] = commit.id
    emit(args, info, f"wrote {args.out} ({len(payload):,} bytes, {info['tokens']} tokens, id {artifact.id[:16]})"
         + (f"; committed {info['commit'][:16]} to {args.stream}" if args.store else ""))
    return 0


def _export_slot(args: argparse.Namespace) -> int:
    from c2c._io import write_atomic
    from c2c.artifact import Artifact
    from c2c.artifact.slots import slot_from_artifact

    if args.domain:
        from c2c.trust import Keyring
        from c2c.trust.signing import load_signed

        artifact, _ = load_signed(args.file, Keyring(args.keyring), domain=args.domain)
    else:
        artifact = Artifact.read(args.file)
    data = slot_from_artifact(artifact)
    write_atomic(args.out, data)
    info = {"path": str(args.out), "bytes": len(data), "tokens": artifact.header.seq_len, "id": artifact.id}
    emit(args, info, f"wrote {args.out} ({len(data):,} bytes, {info['tokens']} tokens)")
    return 0


def _read_text(path: Path) -> str:
    try:
        return path.read_text()
    except OSError as e:
        raise ConfigError(f"cannot read --prompt-file {path}: {e.strerror}") from None


def _inspect(args: argparse.Namespace) -> int:
    from c2c.artifact import Artifact

    a = Artifact.read(args.file)
    h = a.header
    d = h.to_dict()
    d.update(id=a.id, kind=h.kind, bytes=args.file.stat().st_size, kv_bytes=a.cache.nbytes,
             signed=a.signature is not None, signature=a.signature)
    fp = h.fingerprint
    text = "\n".join([
        f"id          {a.id}",
        f"kind        {h.kind}  positions {h.start}:{h.end} ({h.seq_len} tokens)",
        f"model       {fp.model_name} ({fp.architecture}, {fp.num_layers} layers, {fp.kv_heads}×{fp.head_dim}, {fp.dtype})",
        f"prefix      {h.prefix.length} tokens, {len(h.prefix.hashes)} block hashes",
        f"tokens      {'withheld' if h.tokens is None else 'included'} (digest {h.token_digest[:16]})",
        f"producer    {h.producer}",
        f"created     {h.created}",
        f"parents     {list(h.parents) or '-'}",
        f"signed      {'yes (' + str(a.signature.get('domain')) + ')' if a.signature else 'no'}",
        f"size        {d['bytes']:,} bytes ({a.cache.nbytes:,} of K/V)",
    ])
    emit(args, d, text)
    return 0
