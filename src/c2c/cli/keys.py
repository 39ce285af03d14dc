"""`c2c keys ...`: signing keys, trust domains, revocation, domain policy and seal keys."""

from __future__ import annotations

import argparse
import base64
import json
from pathlib import Path

from c2c.cli.main import add_json_flag, command, emit
from c2c.errors import ConfigError, KeyringError


def _keyring_flag(p: argparse.ArgumentParser) -> None:
    p.add_argument("--keyring", type=Path, default=None,
                   help="keyring folder (default: $C2C_HOME/keys)")


def register(sub) -> None:
    p = sub.add_parser("keys", help="signing keys, trust domains, revocation and seal keys",
                       description="Manage the keyring: which keys each trust domain trusts, revocations, "
                                   "the domain's verification policy and its seal key.")
    s = p.add_subparsers(dest="keys_command", metavar="ACTION", required=True)

    c = command(s, "new", help="create a signing key for a trust domain (and the domain's seal key if missing)",
                example="c2c keys new --domain research", func=_new)
    c.add_argument("--domain", required=True, help="trust domain the key signs for")
    c.add_argument("--label", default="", help="a note stored with the key (e.g. the agent's name)")
    c.add_argument("--pub-out", type=Path, default=None,
                   help="where to write the public key file (default: KEYRING/public/DOMAIN.ID.pub.json)")
    _keyring_flag(c)
    add_json_flag(c)

    c = command(s, "list", help="list trusted keys per domain, revocations and policies",
                example="c2c keys list --json", func=_list)
    _keyring_flag(c)
    add_json_flag(c)

    c = command(s, "trust", help="trust a public key file for a domain",
                example="c2c keys trust alice.pub.json --domain research", func=_trust)
    c.add_argument("pubkey_file", type=Path, help="public key file written by `c2c keys new`")
    c.add_argument("--domain", default=None, help="domain to trust it for (default: the one in the file)")
    c.add_argument("--label", default="", help="a note stored with the key")
    _keyring_flag(c)
    add_json_flag(c)

    c = command(s, "revoke", help="revoke a key in every domain (artifacts it signed are refused)",
                example="c2c keys revoke 3f2a9c01 --reason 'laptop stolen'", func=_revoke)
    c.add_argument("key_id", help="key id, or a unique prefix of at least 8 hex characters")
    c.add_argument("--reason", default="", help="why (recorded and shown to receivers)")
    _keyring_flag(c)
    add_json_flag(c)

    c = command(s, "policy", help="show or set a domain's verification policy",
                example="c2c keys policy --domain research --kv sample --samples 48", func=_policy)
    c.add_argument("--domain", required=True, help="trust domain")
    c.add_argument("--kv", choices=["none", "sample", "strict"], default=None,
                   help="KV check on import: none (signature only), sample, or strict")
    c.add_argument("--samples", type=int, default=None, help="deep probes for sample mode")
    c.add_argument("--tolerance", type=float, default=None, help="relative tolerance (default per dtype/device)")
    c.add_argument("--allow-partial", choices=["yes", "no"], default=None,
                   help="yes: accept a sampled check of a slice without its context at layer 0 only "
                        "(default no: such a slice is refused)")
    _keyring_flag(c)
    add_json_flag(c)

    c = command(s, "seal-key", help="export, import or rotate a domain's AES-256-GCM seal key",
                example="c2c keys seal-key --domain research --export research.seal\n"
                        "c2c keys seal-key --domain research --import research.seal", func=_seal_key)
    c.add_argument("--domain", required=True, help="trust domain")
    g = c.add_mutually_exclusive_group(required=True)
    g.add_argument("--export", type=Path, help="write the current seal key to this file (mode 0600)")
    g.add_argument("--import", dest="import_", type=Path, help="add the seal key in this file")
    g.add_argument("--rotate", action="store_true", help="make a new current seal key")
    _keyring_flag(c)
    add_json_flag(c)

    c = command(s, "sign", help="sign an artifact file with this machine's key for a domain",
                example="c2c keys sign notes.c2c --domain research", func=_sign)
    c.add_argument("file", type=Path, help="artifact file (rewritten in place unless --out)")
    c.add_argument("--domain", required=True, help="domain whose signing key to use")
    c.add_argument("--out", type=Path, default=None, help="write the signed artifact here instead")
    _keyring_flag(c)
    add_json_flag(c)

    c = command(s, "seal", help="seal a file for a domain with AES-256-GCM (for transport or shared disks)",
                example="c2c keys seal notes.c2c --domain research --out notes.c2c.sealed", func=_seal)
    c.add_argument("file", type=Path, help="file to seal")
    c.add_argument("--domain", required=True, help="trust domain whose seal key to use")
    c.add_argument("--out", type=Path, required=True, help="sealed file to write")
    _keyring_flag(c)
    add_json_flag(c)

    c = command(s, "unseal", help="open a sealed file (any changed byte is refused)",
                example="c2c keys unseal notes.c2c.sealed --domain research --out notes.c2c", func=_unseal)
    c.add_argument("file", type=Path, help="sealed file")
    c.add_argument("--domain", required=True, help="trust domain it must be sealed for")
    c.add_argument("--out", type=Path, required=True, help="file to write the opened bytes to")
    _keyring_flag(c)
    add_json_flag(c)


def _ring(args):
    from c2c.trust.keys import Keyring

    return Keyring(args.keyring)


def _new(args: argparse.Namespace) -> int:
    from c2c._io import private_dir, write_atomic

    ring = _ring(args)
    key = ring.create_key(args.domain, label=args.label)
    seal = ring.seal_key(args.domain, create=True)
    pub = args.pub_out or ring.root / "public" / f"{args.domain}.{key.key_id[:16]}.pub.json"
    private_dir(pub.parent, error=KeyringError)
    write_atomic(pub, key.public.to_json())
    info = {"domain": args.domain, "key_id": key.key_id, "public_key_file": str(pub), "seal_key_id": seal.key_id}
    emit(args, info, f"new key {key.key_id[:16]} for domain {args.domain!r}\npublic key: {pub}\n"
                     f"(give that file to receivers: c2c keys trust {pub.name} --domain {args.domain})")
    return 0


def _list(args: argparse.Namespace) -> int:
    from c2c.trust.verify_policy import policy_for

    ring = _ring(args)
    entries = ring.entries()
    rows = [{"domain": e.domain, "key_id": e.key_id, "label": e.label, "added": e.added,
             "revoked": e.revoked, "private_key_here": e.has_private} for e in entries]
    policies = {d: policy_for(ring, d).to_dict() for d in ring.domains()}
    lines = [f"{'domain':<16}{'key id':<18}{'state':<9}{'private':<9}label"]
    lines += [f"{r['domain']:<16}{r['key_id'][:16]:<18}{'REVOKED' if r['revoked'] else 'trusted':<9}"
              f"{'yes' if r['private_key_here'] else 'no':<9}{r['label']}" for r in rows]
    lines += [f"policy {d}: kv={p['kv']} samples={p['samples']}" for d, p in policies.items()]
    emit(args, {"keyring": str(ring.root), "keys": rows, "policies": policies},
         "\n".join(lines) if rows else f"no keys in {ring.root}; create one with `c2c keys new --domain NAME`")
    return 0


def _trust(args: argparse.Namespace) -> int:
    from c2c.trust.keys import PublicKey

    try:
        data = args.pubkey_file.read_bytes()
    except OSError as e:
        raise KeyringError(f"cannot read {args.pubkey_file}: {e.strerror}") from None
    pk = PublicKey.from_json(data)
    kid = _ring(args).trust(pk, domain=args.domain, label=args.label)
    domain = args.domain or pk.domain
    emit(args, {"key_id": kid, "domain": domain}, f"trusting key {kid[:16]} for domain {domain!r}")
    return 0


def _revoke(args: argparse.Namespace) -> int:
    kid = _ring(args).revoke(args.key_id, reason=args.reason)
    emit(args, {"key_id": kid, "revoked": True}, f"revoked key {kid[:16]} in every domain")
    return 0


def _policy(args: argparse.Namespace) -> int:
    from dataclasses import replace

    from c2c.trust.verify_policy import policy_for

    ring = _ring(args)
    policy = policy_for(ring, args.domain)
    partial = None if args.allow_partial is None else args.allow_partial == "yes"
    changes = {k: v for k, v in (("kv", args.kv), ("samples", args.samples), ("tolerance", args.tolerance),
                                 ("allow_partial", partial)) if v is not None}
    if changes:
        policy = replace(policy, **changes)
        ring.set_policy(args.domain, policy.to_dict())
    d = policy.to_dict()
    emit(args, {"domain": args.domain, **d}, f"domain {args.domain!r}: " + " ".join(f"{k}={v}" for k, v in d.items()))
    return 0


def _seal_key(args: argparse.Namespace) -> int:
    from c2c.trust.keys import SealKey, read_secret_file, write_private_file

    ring = _ring(args)
    if args.rotate:
        key = ring.rotate_seal_key(args.domain)
        action = "rotated to"
    elif args.export:
        key = ring.seal_key(args.domain)
        write_private_file(args.export, json.dumps({"domain": args.domain,
                                                "key": base64.b64encode(key.secret).decode()}).encode())
        action = f"exported to {args.export}:"
    else:
        try:
            d = json.loads(read_secret_file(args.import_))
            key = SealKey(domain=d["domain"], secret=base64.b64decode(d["key"], validate=True))
        except (ValueError, KeyError, TypeError) as e:
            raise KeyringError(f"{args.import_} is not a seal key file: {e}") from None
        if key.domain != args.domain or len(key.secret) != 32:
            raise ConfigError(f"{args.import_} holds a key for {key.domain!r}, not {args.domain!r}")
        ring.import_seal_key(key)
        action = "imported"
    emit(args, {"domain": args.domain, "seal_key_id": key.key_id},
         f"domain {args.domain!r}: seal key {action} {key.key_id}")
    return 0


def _sign(args: argparse.Namespace) -> int:
    from c2c.artifact.codec import Artifact
    from c2c.trust.signing import sign

    ring = _ring(args)
    artifact = sign(Artifact.read(args.file), ring.signing_key(args.domain))
    out = args.out or args.file
    n = artifact.write(out)
    sig = artifact.signature
    emit(args, {"path": str(out), "bytes": n, "key_id": sig["key_id"], "domain": sig["domain"], "id": artifact.id},
         f"signed {out} for domain {args.domain!r} with key {sig['key_id'][:16]}")
    return 0


def _seal(args: argparse.Namespace) -> int:
    from c2c.artifact.codec import write_atomic
    from c2c.trust.seal import seal

    data = _read(args.file)
    n = write_atomic(args.out, seal(data, _ring(args).seal_key(args.domain)))
    emit(args, {"path": str(args.out), "bytes": n, "domain": args.domain},
         f"sealed {args.file} for domain {args.domain!r} -> {args.out} ({n:,} bytes)")
    return 0


def _unseal(args: argparse.Namespace) -> int:
    from c2c.artifact.codec import write_atomic
    from c2c.trust.seal import open_sealed

    data = open_sealed(_read(args.file), _ring(args), domain=args.domain)
    n = write_atomic(args.out, data)
    emit(args, {"path": str(args.out), "bytes": n}, f"opened {args.file} -> {args.out} ({n:,} bytes)")
    return 0


def _read(path: Path) -> bytes:
    from c2c._io import read_bounded
    from c2c.artifact.codec import max_artifact_bytes

    return read_bounded(path, max_artifact_bytes())
