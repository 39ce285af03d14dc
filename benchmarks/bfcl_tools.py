"""Tool-call accuracy on BFCL's non-live AST categories: `c2c serve` against `vllm serve`, scored by BFCL's checker.

    nice .venv/bin/python benchmarks/bfcl_tools.py                       # 20 items a category, both servers
    nice .venv/bin/python benchmarks/bfcl_tools.py --items 40 --servers c2c

The Berkeley Function Calling Leaderboard ships its data and its AST checker in the ``bfcl-eval``
package (installed here with ``--no-deps`` into ``$C2C_HOME/bfcl``: its own dependencies are the
model clients of every vendor, none of which the checker reads). Each item's functions become
OpenAI ``tools`` as BFCL's own OpenAI handler makes them (``.`` in a name becomes ``_``; BFCL's
types map to JSON Schema's), its question the messages, and the reply's ``tool_calls`` the model
output the checker reads (``[{name: arguments}]``). An irrelevance item is right when no call comes.

Both servers serve Qwen2.5-Coder-0.5B-Instruct in bf16, greedy, one at a time in one run:
``c2c serve`` with its defaults, and ``vllm serve`` with c2c's connector, its middleware and
``--enable-auto-tool-choice --tool-call-parser hermes``. Each is asked in ``tool_choice: auto`` and
``required`` (irrelevance: ``auto`` only). The same items (the first ``--items`` of each category,
never chosen by their results) go to every leg.

Acceptance (issue #55): in ``auto``, `c2c serve` reaches vLLM's ``required``-mode accuracy on
simple_python, multiple, parallel and parallel_multiple (the paired 95% interval of the difference
reaches 0 or above), and keeps irrelevance at 80% or more.

Outputs benchmarks/results/bfcl_tools.{json,md,jsonl,png} (or --out PREFIX).
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import subprocess
import sys
import tempfile
import time
import types
from pathlib import Path

import openai

from c2c.bench import results
from c2c.bench.stats import bootstrap_mean, wilson

RESULTS = Path(__file__).resolve().parent / "results"
MODEL = "Qwen2.5-Coder-0.5B-Instruct"
BFCL = "bfcl-eval==2026.3.23"
CALLS = ("simple_python", "multiple", "parallel", "parallel_multiple")
CATEGORIES = CALLS + ("irrelevance",)


def bfcl_package(home: Path) -> Path:
    """The folder holding ``bfcl_eval`` (pip-installed there, without its dependencies, on first use)."""
    target = home / "bfcl"
    if not (target / "bfcl_eval").is_dir():
        print(f"installing {BFCL} (data and checker only) into {target} ...", flush=True)
        subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--target", str(target), BFCL],
                       check=True)
    return target


def checker(target: Path):
    """BFCL's ``ast_checker`` and its Python language tag. Its module table of every vendor's model handler is
    stood in for by the one entry the checker reads: names whose ``.`` was sent as ``_`` (as for OpenAI)."""
    sys.path.insert(0, str(target))
    table = types.ModuleType("bfcl_eval.constants.model_config")
    table.MODEL_CONFIG_MAPPING = {"c2c": types.SimpleNamespace(underscore_to_dot=True)}
    sys.modules["bfcl_eval.constants.model_config"] = table
    from bfcl_eval.constants.enums import Language
    from bfcl_eval.constants.type_mappings import GORILLA_TO_OPENAPI
    from bfcl_eval.eval_checker.ast_eval.ast_checker import ast_checker
    return ast_checker, Language.PYTHON, GORILLA_TO_OPENAPI


def load(target: Path, category: str, n: int) -> list[dict]:
    data = target / "bfcl_eval" / "data"
    items = [json.loads(line) for line in (data / f"BFCL_v4_{category}.json").read_text().splitlines()][:n]
    answers = data / "possible_answer" / f"BFCL_v4_{category}.json"
    if answers.is_file():
        truth = {a["id"]: a["ground_truth"] for a in map(json.loads, answers.read_text().splitlines())}
        for it in items:
            it["truth"] = truth[it["id"]]
    return items


def openai_type(schema: dict, mapping: dict) -> dict:
    """A BFCL parameter schema as JSON Schema (``dict`` -> ``object``, ``float`` -> ``number``, ...)."""
    s = copy.deepcopy(schema)
    t = s.get("type", "string")
    s["type"] = mapping.get(t, "string")
    if t == "float":
        s["description"] = s.get("description", "") + " This is a float type value."
    if "properties" in s:
        s["properties"] = {k: openai_type(v, mapping) for k, v in s["properties"].items()}
    if isinstance(s.get("items"), dict):
        s["items"] = openai_type(s["items"], mapping)
    return s


def tools_of(item: dict, mapping: dict) -> list[dict]:
    return [{"type": "function", "function": {"name": f["name"].replace(".", "_"), "description": f["description"],
                                              "parameters": openai_type(f["parameters"], mapping)}}
            for f in item["function"]]


def ask(client: openai.OpenAI, item: dict, mapping: dict, choice: str) -> dict:
    messages = item["question"][0]
    t0 = time.perf_counter()
    try:
        r = client.chat.completions.create(model=MODEL, messages=messages, tools=tools_of(item, mapping),
                                           tool_choice=choice, temperature=0, max_tokens=256)
    except openai.APIStatusError as e:
        return {"error": f"{e.status_code}: {str(e.message)[:200]}", "s": time.perf_counter() - t0}
    m = r.choices[0].message
    calls = []
    for c in m.tool_calls or ():
        try:
            calls.append({c.function.name: json.loads(c.function.arguments)})
        except ValueError:
            calls.append({c.function.name: None})
    return {"calls": calls, "content": m.content, "finish": r.choices[0].finish_reason,
            "s": time.perf_counter() - t0}


def score(item: dict, category: str, got: dict, check, python) -> bool:
    if category == "irrelevance":
        return "error" not in got and not got["calls"]
    if "error" in got or not got["calls"] or any(v is None for c in got["calls"] for v in c.values()):
        return False
    return bool(check(item["function"], got["calls"], item["truth"], python, category, "c2c")["valid"])


def start(server: str, root: Path):
    if server == "c2c":
        from c2c.testing.server_process import ServeProcess, make_home
        return ServeProcess(make_home(root / "c2c"), "--model", MODEL, "--dtype", "bfloat16",
                            env={"C2C_THREADS": str(os.cpu_count() or 1)}).start()
    from c2c.runtime import zoo
    from c2c.testing.vllm import VllmProcess
    return VllmProcess(zoo.model_path(MODEL), root / "vllm-home", store=f"sqlite:///{root / 'vllm-store'}",
                       domain="bench", name=MODEL, dtype="bfloat16", max_model_len=4096, kv_cache_gb=2,
                       extra_args=("--enable-auto-tool-choice", "--tool-call-parser", "hermes")).start()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--items", type=int, default=20, help="items a category (the first N; default 20)")
    ap.add_argument("--servers", default="c2c,vllm", help="comma-separated: c2c, vllm (default both)")
    ap.add_argument("--out", default=str(RESULTS / "bfcl_tools"))
    args = ap.parse_args(argv)
    home = Path(os.environ.get("C2C_HOME") or Path.home() / ".cache" / "c2c")
    target = bfcl_package(home)
    check, python, mapping = checker(target)
    items = {c: load(target, c, args.items) for c in CATEGORIES}
    servers = [s for s in args.servers.split(",") if s]
    records, t_all = [], time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="c2c-bfcl-") as tmp:
        for server in servers:
            proc = start(server, Path(tmp))
            client = openai.OpenAI(base_url=proc.base_url, api_key="none", max_retries=0, timeout=600)
            try:
                for category, its in items.items():
                    for choice in ("auto",) if category == "irrelevance" else ("auto", "required"):
                        for k, it in enumerate(its):
                            got = ask(client, it, mapping, choice)
                            ok = score(it, category, got, check, python)
                            records.append({"server": server, "mode": choice, "category": category, "id": it["id"],
                                            "correct": ok, "parsed": bool(got.get("calls")), **got})
                            print(f"\r{server:5s} {choice:8s} {category:18s} {k + 1}/{len(its)}", end="", flush=True)
            finally:
                proc.stop()
    print()
    return report(records, servers, args, time.perf_counter() - t_all)


def report(records: list[dict], servers: list[str], args, wall_s: float) -> int:
    m = results.machine()
    cell = {}
    for r in records:
        cell.setdefault((r["server"], r["mode"], r["category"]), []).append(r)
    rows, table = [], {}
    for (server, mode, category), rs in sorted(cell.items()):
        k, n = sum(r["correct"] for r in rs), len(rs)
        lo, hi = wilson(k, n)
        parsed = sum(r["parsed"] for r in rs)
        table[server, mode, category] = {r["id"]: r["correct"] for r in rs}
        rows.append({"server": server, "mode": mode, "category": category, "correct": k, "n": n, "acc": k / n,
                     "ci95": [lo, hi], "parse_rate": parsed / n, "errors": sum("error" in r for r in rs),
                     "median_s": sorted(r["s"] for r in rs)[n // 2]})
    paired, acceptance = {}, {}
    if "vllm" in servers and "c2c" in servers:
        for c in CALLS:
            ours, theirs = table.get(("c2c", "auto", c), {}), table.get(("vllm", "required", c), {})
            diffs = [int(ours[i]) - int(theirs[i]) for i in ours if i in theirs]
            if diffs:
                lo, hi = bootstrap_mean(diffs)
                paired[c] = {"diff": sum(diffs) / len(diffs), "ci95": [lo, hi], "n": len(diffs)}
                acceptance[f"{c}: c2c auto reaches vLLM required"] = hi >= 0
    irr = table.get(("c2c", "auto", "irrelevance"), {})
    if irr:
        acceptance["irrelevance: c2c auto >= 80%"] = sum(irr.values()) / len(irr) >= 0.8
    result = {"benchmark": "bfcl_tools", "model": MODEL, "dtype": "bfloat16", "items_per_category": args.items,
              "machine": m, "command": " ".join(["python"] + sys.argv), "wall_s": wall_s, "rows": rows,
              "paired_c2c_auto_minus_vllm_required": paired, "acceptance": acceptance}
    lines = [f"# BFCL tool calls: `c2c serve` vs `vllm serve` ({MODEL}, bf16)", "",
             f"{m['cpu']}, {m['cores']} cores, bf16 flags: {', '.join(m['bf16_flags']) or 'none'}. First "
             f"{args.items} items of each non-live AST category, greedy, scored by BFCL's own AST checker "
             f"(bfcl-eval {BFCL.split('==')[1]}). vLLM: hermes tool parser. Accuracy with 95% Wilson intervals; "
             "parse rate = replies with at least one call.", "",
             "| category | server | tool_choice | correct | accuracy (95% CI) | parse rate | median s |",
             "|---|---|---|---:|---:|---:|---:|"]
    for r in rows:
        lines.append(f"| {r['category']} | {r['server']} | {r['mode']} | {r['correct']}/{r['n']} | "
                     f"{r['acc']:.0%} ({r['ci95'][0]:.0%}–{r['ci95'][1]:.0%}) | {r['parse_rate']:.0%} | "
                     f"{r['median_s']:.1f} |")
    if paired:
        lines += ["", "Paired difference, c2c serve `auto` minus vLLM `required`, per item (bootstrap 95% CI):", "",
                  "| category | difference | 95% CI |", "|---|---:|---:|"]
        for c, p in paired.items():
            bold = "**" if p["ci95"][0] > 0 or p["ci95"][1] < 0 else ""
            lines.append(f"| {c} | {bold}{p['diff']:+.0%}{bold} | {p['ci95'][0]:+.0%} .. {p['ci95'][1]:+.0%} |")
    lines += ["", "Acceptance:", ""] + [f"- {k}: {'yes' if v else 'no'}" for k, v in acceptance.items()]
    lines += ["", f"Command: `nice .venv/bin/python benchmarks/bfcl_tools.py --items {args.items} "
              f"--servers {args.servers}` ({wall_s / 60:.0f} min)."]
    return results.write(args.out, result, "\n".join(lines), records=records, plot=lambda p: plot(rows, p))


def plot(rows: list[dict], path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    legs = sorted({(r["server"], r["mode"]) for r in rows})
    fig, ax = plt.subplots(figsize=(9, 4))
    width = 0.8 / max(len(legs), 1)
    for j, leg in enumerate(legs):
        xs, ys, err = [], [], [[], []]
        for i, c in enumerate(CATEGORIES):
            r = next((r for r in rows if (r["server"], r["mode"], r["category"]) == (*leg, c)), None)
            if r is None:
                continue
            xs.append(i + j * width)
            ys.append(r["acc"])
            err[0].append(r["acc"] - r["ci95"][0])
            err[1].append(r["ci95"][1] - r["acc"])
        ax.bar(xs, ys, width, yerr=err, capsize=2, label=f"{leg[0]} {leg[1]}")
    ax.set_xticks([i + 0.4 - width / 2 for i in range(len(CATEGORIES))], CATEGORIES)
    ax.set_ylabel("BFCL AST accuracy")
    ax.set_ylim(0, 1.05)
    ax.legend(fontsize=8)
    ax.set_title(f"Tool calls on {MODEL}: c2c serve vs vllm serve")
    fig.tight_layout()
    fig.savefig(path, dpi=120)


if __name__ == "__main__":
    sys.exit(main())
