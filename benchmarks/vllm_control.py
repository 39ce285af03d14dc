"""The vLLM pipeline's two ratios under a matched control: this checkout against an earlier commit, in turns.

    bash scripts/setup_vllm.sh
    .venv/bin/python benchmarks/vllm_control.py --rev 860770e --rounds 2

Each round runs ``benchmarks/vllm.py --lengths 256 --repeats 1`` of the earlier commit (a git
worktree, its own ``src`` first on the Python path, so its server loads its own connector) and
of this checkout, one after the other, the order alternating by round, and stops each run once
its load leg is out (the unused-cost legs that follow are not part of the comparison). Both
versions thus meet the same machine, minutes apart: a ratio that moves between sessions with
the machine (its memory reads faster or slower from one day to the next) does not move between
the two versions unless the code moved it.

Outputs benchmarks/results/vllm_control.{json,md} (or --out PREFIX).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from c2c.bench import results
from c2c.config import data_dir

REPO = Path(__file__).resolve().parent.parent
RESULTS = Path(__file__).resolve().parent / "results"
SINGLE = re.compile(r"^N=256: text ([\d.]+)s cache ([\d.]+)s ratio ([\d.]+)")
LOAD = re.compile(r"^load: ([\d.]+) vs ([\d.]+) pipelines/s")


def servers() -> set[int]:
    """The pids of the vLLM API servers running now."""
    pids = set()
    for d in Path("/proc").iterdir():
        try:
            if d.name.isdigit() and b"vllm.entrypoints.openai.api_server" in (d / "cmdline").read_bytes():
                pids.add(int(d.name))
        except OSError:
            pass
    return pids


def stop(pids: set[int]) -> None:
    """Stop these servers with their process groups (engine core, worker): TERM, then KILL after 60 s."""
    for sig, wait in ((signal.SIGTERM, 60), (signal.SIGKILL, 5)):
        for pid in pids:
            with contextlib.suppress(OSError):
                os.killpg(pid, sig)
        deadline = time.monotonic() + wait
        while pids & servers() and time.monotonic() < deadline:
            time.sleep(1)


def one_run(checkout: Path, venv: Path, log: Path) -> dict:
    """``checkout``'s vLLM benchmark up to its load leg: the single-stream and the under-load figures."""
    env = {**os.environ, "PYTHONPATH": str(checkout / "src"), "C2C_VLLM_VENV": str(venv),
           "C2C_DATA": str(data_dir())}
    cmd = [str(venv / "bin" / "python"), "benchmarks/vllm.py", "--lengths", "256", "--repeats", "1",
           "--out", str(log.with_suffix(""))]
    out: dict = {}
    before = servers()
    with open(log, "w") as f, subprocess.Popen(cmd, cwd=checkout, env=env, stdout=subprocess.PIPE,
                                                stderr=subprocess.STDOUT, text=True, start_new_session=True) as p:
        try:
            for line in p.stdout:
                f.write(line)
                if m := SINGLE.match(line):
                    out.update(text_s=float(m[1]), cache_s=float(m[2]), single_ratio=float(m[3]))
                if m := LOAD.match(line):
                    out.update(text_per_s=float(m[1]), cache_per_s=float(m[2]))
                    out["load_ratio"] = out["cache_per_s"] / out["text_per_s"]
                    break
        finally:
            os.killpg(p.pid, signal.SIGINT)   # the run stops its server on the way out (its own session)
            try:
                p.wait(timeout=120)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
            stop(servers() - before)          # and whatever server it left (one started as it was stopped)
    if "load_ratio" not in out:
        raise SystemExit(f"{checkout}: the benchmark stopped before its load leg; see {log}")
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rev", required=True, help="the earlier commit to compare with (any git revision)")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--out", default=str(RESULTS / "vllm_control"))
    args = ap.parse_args()
    venv = REPO / ".venv-vllm"
    if not (venv / "bin" / "python").exists():
        raise SystemExit("no vLLM virtualenv: run `bash scripts/setup_vllm.sh` first")
    rev = subprocess.run(["git", "rev-parse", "--short", args.rev], cwd=REPO, check=True, capture_output=True,
                         text=True).stdout.strip()
    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, check=True, capture_output=True,
                          text=True).stdout.strip()
    work = Path(tempfile.mkdtemp(prefix="c2c-vllm-control-"))
    subprocess.run(["git", "worktree", "add", "--detach", "-q", str(work / "earlier"), rev], cwd=REPO, check=True)
    runs: list[dict] = []
    try:
        for r in range(args.rounds):
            order = (("earlier", work / "earlier"), ("this", REPO))
            for name, checkout in order if r % 2 == 0 else order[::-1]:
                run = {"round": r, "version": name, **one_run(checkout, venv, work / f"{name}-{r}.log")}
                print(run, file=sys.stderr, flush=True)
                runs.append(run)
    finally:
        subprocess.run(["git", "worktree", "remove", "--force", str(work / "earlier")], cwd=REPO, check=False)
    out = {"earlier": rev, "this": head, "rounds": args.rounds, "machine": results.machine(), "runs": runs,
           "median": {v: {k: statistics.median(x[k] for x in runs if x["version"] == v)
                          for k in ("single_ratio", "load_ratio", "text_per_s", "cache_per_s")}
                      for v in ("earlier", "this")}}
    return results.write(Path(args.out), out, markdown(out))


def markdown(out: dict) -> str:
    m = out["machine"]
    lines = [f"# vLLM pipeline: this checkout ({out['this']}) against {out['earlier']}, in turns", "",
             f"CPU: {m['cpu']} ({m['cores']} cores; AMX-BF16 {'yes' if m['amx_bf16'] else 'no'}). "
             f"`benchmarks/vllm.py --lengths 256 --repeats 1` of each version, up to its load leg, "
             f"{out['rounds']} rounds, the order alternating (module doc of `benchmarks/vllm_control.py`).", "",
             "| round | version | single stream: text s / cache s | ratio | under load: text / cache pipelines/s "
             "| ratio |", "|---|---|---|---:|---|---:|"]
    for r in out["runs"]:
        lines.append(f"| {r['round']} | {r['version']} | {r['text_s']:.2f} / {r['cache_s']:.2f} | "
                     f"{r['single_ratio']:.2f}x | {r['text_per_s']:.3f} / {r['cache_per_s']:.3f} | "
                     f"{r['load_ratio']:.2f}x |")
    lines += ["", "| version | single-stream ratio, median | under-load ratio, median |", "|---|---:|---:|"]
    for v, x in out["median"].items():
        lines.append(f"| {v} ({out[v]}) | {x['single_ratio']:.2f}x | {x['load_ratio']:.2f}x |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
