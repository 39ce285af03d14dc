"""Fairness during a long context edit: another tenant's short request while a 5k-token session is repaired.

    .venv/bin/python benchmarks/serve_edit_fairness.py                 # SmolLM2-135M, ~5,000 tokens
    .venv/bin/python benchmarks/serve_edit_fairness.py --tokens 2000 --rounds 1

One run, two `c2c serve` processes of the same model, one at a time: the server as shipped
(``--prefill-chunk 64``: every forward pass of a turn, a repair's included, is cut into
64-token passes, :mod:`c2c.runtime.pace`) and the matched control ``--prefill-chunk 0``
(every pass whole: what a repair did before, in one pass). On each:

1. tenant B (domain ``other``) sends its short request alone (8 greedy tokens, end of turn
   banned), ``--alone`` times;
2. for each repair level, tenant A (domain ``research``) builds a session of ``--tokens``
   tokens of tool results (not timed), then drops its first tool result with that repair;
   while the repair runs, B sends its short request every ``--every`` seconds (a light tenant: one
   that sends back to back is a heavy one, and fairly gets half the model, twice its time alone)
   until A's turn ends.

Reports B's median latency alone and during each repair, their ratio, and A's edit time
(its ``timings.attach_s``: the edit runs before the attachments). Acceptance (issue #53):
during a ``ratio:1`` repair of a 5k-token session, B's median is at most 1.5x alone.

Outputs benchmarks/results/serve_edit_fairness.{json,md,png} (or --out PREFIX).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

import openai

from c2c.bench import results
from c2c.testing import server_process as _serve

RESULTS = Path(__file__).resolve().parent / "results"
TOKENS = {"analyst": ("tok-analyst-0123456789abcdef", "research"),
          "outsider": ("tok-outsider-0123456789abcdef", "other")}
SYSTEM = {"role": "system", "content": "You are a research agent. Use the tool results below. Be brief."}
FILLER = ("The station log lists a reading of {i} units at hour {h}, taken by sensor {s} on the north ridge, "
          "with the usual calibration note and no alarm raised. ")


def tool_results(tokens: int) -> list[dict]:
    """A conversation of tool results totalling about ``tokens`` tokens (about 41 tokens a sentence)."""
    msgs, n, k = [SYSTEM], 0, 0
    while n < tokens:
        body = "".join(FILLER.format(i=k * 40 + j, h=j % 24, s=(k + j) % 9) for j in range(16))
        msgs += [{"role": "user", "content": f"Tool result {k}: {body}"}, {"role": "assistant", "content": "Noted."}]
        n, k = n + 16 * 41 + 10, k + 1
    return msgs + [{"role": "user", "content": "Sum up the readings."}]


def client(server, agent: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.base_url, api_key=TOKENS[agent][0], max_retries=0, timeout=600)


def short(b: openai.OpenAI, model: str, bias: dict) -> float:
    t0 = time.perf_counter()
    r = b.chat.completions.create(model=model, messages=[SYSTEM, {"role": "user", "content": "Status?"}],
                                  max_tokens=8, temperature=0, logit_bias=bias)
    assert r.usage.completion_tokens == 8
    return time.perf_counter() - t0


def run_server(args, chunk: int, bias: dict, root: Path) -> dict:
    tokens = _serve.write_tokens(root / f"tokens-{chunk}.json", TOKENS)
    server = _serve.ServeProcess(_serve.make_home(root / f"home-{chunk}"), "--model", args.model, "--tokens",
                                 str(tokens), "--prefill-chunk", str(chunk), log_dir=root).start()
    try:
        a, b = client(server, "analyst"), client(server, "outsider")
        for _ in range(2):
            short(b, args.model, bias)   # warm-up
        alone = [short(b, args.model, bias) for _ in range(args.alone)]
        out = {"chunk": chunk, "alone_s": alone, "repairs": []}
        for level in args.repairs:
            for rnd in range(args.rounds):
                session = f"s-{chunk}-{level}-{rnd}"
                msgs = tool_results(args.tokens)
                r1 = a.chat.completions.create(model=args.model, messages=msgs, max_tokens=1, temperature=0,
                                               extra_body={"c2c": {"session": session}})
                msgs2 = msgs + [{"role": "assistant", "content": r1.choices[0].message.content},
                                {"role": "user", "content": "Again, briefly."}]
                done, got = threading.Event(), {}

                def edit():
                    got["r"] = a.chat.completions.create(
                        model=args.model, messages=msgs2, max_tokens=1, temperature=0,
                        extra_body={"c2c": {"session": session, "edit": {"drop": [1, 2], "repair": level}}})
                    done.set()
                t = threading.Thread(target=edit, daemon=True)
                t.start()
                time.sleep(0.3)   # A's turn has begun: its edit (and repair) runs first
                during = []
                while not done.is_set():   # a light tenant: one short request every --every seconds
                    t_next = time.perf_counter() + args.every
                    during.append(short(b, args.model, bias))
                    done.wait(max(t_next - time.perf_counter(), 0))
                t.join()
                c2c = got["r"].model_extra["c2c"]
                out["repairs"].append({"repair": level, "round": rnd, "session_tokens": r1.usage.prompt_tokens,
                                       "recomputed_tokens": c2c["edit"]["recomputed_tokens"],
                                       "edit_s": c2c["timings"]["attach_s"], "during_s": during})
                print(f"chunk {chunk} {level} round {rnd}: session {r1.usage.prompt_tokens} tokens, edit "
                      f"{c2c['timings']['attach_s']:.2f} s, B {len(during)}x median "
                      f"{statistics.median(during) if during else float('nan'):.2f} s "
                      f"(alone {statistics.median(alone):.2f} s)", flush=True)
        return out
    finally:
        server.stop()


def summarize(run: dict) -> list[dict]:
    alone = statistics.median(run["alone_s"])
    rows = []
    for level in dict.fromkeys(r["repair"] for r in run["repairs"]):
        rs = [r for r in run["repairs"] if r["repair"] == level]
        during = [x for r in rs for x in r["during_s"]]
        med = statistics.median(during) if during else None
        rows.append({"chunk": run["chunk"], "repair": level, "session_tokens": rs[0]["session_tokens"],
                     "recomputed_tokens": rs[0]["recomputed_tokens"],
                     "edit_s": statistics.median(r["edit_s"] for r in rs), "b_alone_s": alone, "b_during_s": med,
                     "b_first_s": statistics.median(r["during_s"][0] for r in rs if r["during_s"]) if during else None,
                     "b_max_s": max(during) if during else None, "b_requests": len(during),
                     "ratio": med / alone if med else None})
    return rows


def markdown(result: dict) -> str:
    m = result["machine"]
    lines = [f"# Another tenant's short request during a context repair ({result['model']})", "",
             f"{m['cpu']}, {m['cores']} cores, bf16 flags: {', '.join(m['bf16_flags']) or 'none'}. "
             f"Command: `{result['command']}`.", "",
             "| server | repair | session tokens | recomputed | A's edit | B alone (p50) | B during (p50) | "
             "B's first | B during (max) | B requests | p50 ratio | first ratio |",
             "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in result["rows"]:
        name = "paced, 64-token passes" if r["chunk"] else "one pass (control)"
        ratio = f"{r['ratio']:.2f}x" if r["ratio"] else "n/a"
        if r["chunk"] and r["repair"] == "ratio:1" and r["ratio"] and r["ratio"] <= 1.5:
            ratio = f"**{ratio}**"
        during = f"{r['b_during_s']:.2f} s" if r["b_during_s"] else "n/a"
        worst = f"{r['b_max_s']:.2f} s" if r["b_max_s"] else "n/a"
        first = f"{r['b_first_s']:.2f} s" if r["b_first_s"] else "n/a"
        first_ratio = f"{r['b_first_s'] / r['b_alone_s']:.2f}x" if r["b_first_s"] else "n/a"
        lines.append(f"| {name} | {r['repair']} | {r['session_tokens']} | {r['recomputed_tokens']} | "
                     f"{r['edit_s']:.2f} s | {r['b_alone_s']:.2f} s | {during} | {first} | {worst} | "
                     f"{r['b_requests']} | {ratio} | {first_ratio} |")
    lines += ["", f"B sends one request every {result['every']:g} s during the repair. B's first request is the one sent "
              "while A's edit began (0.3 s after A's request); in one pass it waits for the whole repair. A's edit "
              "time includes the passes B's requests took between its own.",
              "", "Acceptance: " + ", ".join(f"{k}: {'yes' if v else 'no'}" for k, v in result["acceptance"].items()),
              ""]
    return "\n".join(lines)


def plot(result: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = result["rows"]
    fig, ax = plt.subplots(figsize=(7, 3.5))
    labels = [f"{r['repair']}\n{'paced' if r['chunk'] else 'one pass'}" for r in rows]
    ax.bar(range(len(rows)), [r["ratio"] or 0 for r in rows],
           color=["tab:blue" if r["chunk"] else "tab:gray" for r in rows])
    ax.axhline(1.5, color="tab:red", linestyle="--", label="1.5x alone")
    ax.set_xticks(range(len(rows)), labels, fontsize=8)
    ax.set_ylabel("B's p50 during / alone")
    ax.set_title(f"A short request during a {rows[0]['session_tokens']}-token repair ({result['model']})", fontsize=9)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", default="SmolLM2-135M-Instruct", help="zoo model to serve (default SmolLM2-135M)")
    p.add_argument("--tokens", type=int, default=5000, help="tokens of tool results in A's session (default 5000)")
    p.add_argument("--repairs", nargs="+", default=["ratio:1", "ratio:0.5", "first:1048576"],
                   help="repair levels to run (default ratio:1 ratio:0.5 first:1048576)")
    p.add_argument("--rounds", type=int, default=1, help="repairs per level and server (default 1)")
    p.add_argument("--alone", type=int, default=7, help="B's requests alone (default 7)")
    p.add_argument("--every", type=float, default=1.0,
                   help="seconds between the starts of B's requests during a repair (default 1)")
    p.add_argument("--no-control", action="store_true", help="skip the one-pass control server")
    p.add_argument("--out", default=str(RESULTS / "serve_edit_fairness"), help="output prefix")
    args = p.parse_args()
    from c2c.runtime import zoo

    rt = zoo.load(args.model)
    bias = {str(t): -100 for t in rt.eos_ids}
    rt.close()
    root = Path(tempfile.mkdtemp(prefix="c2c-edit-fair-"))
    runs = [run_server(args, 64, bias, root)] + ([] if args.no_control else [run_server(args, 0, bias, root)])
    rows = [r for run in runs for r in summarize(run)]
    paced = [r for r in rows if r["chunk"] and r["repair"] == "ratio:1"]
    result = {"model": args.model, "every": args.every, "machine": results.machine(), "command": " ".join(["python"] + sys.argv),
              "rows": rows, "runs": runs,
              "acceptance": {"b_during_ratio1_repair_le_1.5x_alone": bool(paced and paced[0]["ratio"]
                                                                           and paced[0]["ratio"] <= 1.5)}}
    return results.write(args.out, result, markdown(result), plot=lambda path: plot(result, path))


if __name__ == "__main__":
    sys.exit(main())
