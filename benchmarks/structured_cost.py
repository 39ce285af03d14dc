"""What constrained decoding costs per decoded token, and whether every constrained reply validates.

    .venv/bin/python benchmarks/structured_cost.py                          # Qwen2.5-Coder-0.5B, 64 tokens, 5 rounds
    .venv/bin/python benchmarks/structured_cost.py --model SmolLM2-135M-Instruct --rounds 3

One process, one model, the decode loop `c2c serve` runs (:func:`c2c.conversation.decode.generate`),
greedy, in turns: each round decodes ``--tokens`` tokens unconstrained (end of turn banned)
and ``--tokens`` tokens under a JSON schema whose shortest match is longer than that (so both
decode exactly as many tokens). The per-token time is the decode time over the tokens decoded
(the prompt's prefill is not in it). Then every schema of a small test set is decoded to the
end on its own prompt, and each reply is parsed and checked against its schema.

Acceptance (issue #55): the constrained per-token time is at most 1.10x the unconstrained one
(medians of the rounds), and every reply of the test set validates.

Outputs benchmarks/results/structured_cost.{json,md} (or --out PREFIX).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

from c2c.bench import results
from c2c.runtime import zoo
from c2c.runtime.grammar import Grammar
from c2c.conversation.decode import Sampling, generate
from c2c.conversation.render import Message, render

RESULTS = Path(__file__).resolve().parent / "results"
LONG = {"type": "object", "required": ["readings"], "additionalProperties": False,
        "properties": {"readings": {"type": "array", "minItems": 200, "items": {"type": "integer"}}}}
TEST_SET = [
    ("a person", {"type": "object", "required": ["name", "age"], "additionalProperties": False,
                  "properties": {"name": {"type": "string", "maxLength": 30},
                                 "age": {"type": "integer", "minimum": 0}}}),
    ("three colours", {"type": "array", "minItems": 3, "maxItems": 3, "items": {"type": "string", "maxLength": 20}}),
    ("an incident", {"type": "object", "required": ["host", "severity", "resolved"], "additionalProperties": False,
                     "properties": {"host": {"type": "string", "maxLength": 20},
                                    "severity": {"enum": ["low", "medium", "high"]},
                                    "resolved": {"type": "boolean"}}}),
    ("a list of steps", {"type": "object", "required": ["steps"], "additionalProperties": False,
                         "properties": {"steps": {"type": "array", "maxItems": 4,
                                                  "items": {"type": "string", "maxLength": 40}}}}),
]


def validates(doc, schema) -> bool:
    """A small checker for the test set's keywords (type, required, additionalProperties, enum, min/max)."""
    t = schema.get("type")
    if "enum" in schema:
        return doc in schema["enum"]
    if t == "object":
        if not isinstance(doc, dict) or not set(schema.get("required", ())) <= set(doc):
            return False
        props = schema.get("properties", {})
        if schema.get("additionalProperties") is False and set(doc) - set(props):
            return False
        return all(validates(v, props[k]) for k, v in doc.items() if k in props)
    if t == "array":
        return (isinstance(doc, list) and schema.get("minItems", 0) <= len(doc) <= schema.get("maxItems", 1 << 30)
                and all(validates(x, schema.get("items", {})) for x in doc))
    if t == "string":
        return isinstance(doc, str) and len(doc) <= schema.get("maxLength", 1 << 30)
    if t == "integer":
        return isinstance(doc, int) and not isinstance(doc, bool) and doc >= schema.get("minimum", -(1 << 62))
    if t == "boolean":
        return isinstance(doc, bool)
    return True


def prompt(rt, what: str) -> list[int]:
    return list(render(rt, [Message(role="system", content="You answer in JSON only."),
                            Message(role="user", content=f"Give {what} as JSON.")]).token_ids)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", default="Qwen2.5-Coder-0.5B-Instruct", help="zoo model (default: c2c serve's)")
    p.add_argument("--tokens", type=int, default=64, help="tokens decoded per timed run (default 64)")
    p.add_argument("--rounds", type=int, default=5, help="rounds, each one unconstrained and one constrained run")
    p.add_argument("--out", default=str(RESULTS / "structured_cost"), help="output prefix")
    args = p.parse_args()
    rt = zoo.load(args.model)
    t0 = time.perf_counter()
    tokenizer = rt.grammar_tokenizer()
    tokenizer_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    long = Grammar.json(LONG, tokenizer)
    compile_s = time.perf_counter() - t0
    ids = prompt(rt, "two hundred sensor readings")
    no_eos = tuple((t, -100.0) for t in rt.eos_ids)
    runs = {"plain": [], "constrained": []}
    generate(rt, None, ids, Sampling(max_tokens=4, temperature=0))   # warm-up
    for r in range(args.rounds):
        for kind in ("plain", "constrained") if r % 2 == 0 else ("constrained", "plain"):
            s = Sampling(max_tokens=args.tokens, temperature=0, logit_bias=no_eos,
                         grammar=long if kind == "constrained" else None)
            d = generate(rt, None, ids, s)
            assert d.completion_tokens == args.tokens, (kind, d.completion_tokens)
            runs[kind].append(d.decode_s / (args.tokens - 1) * 1000)   # ms per decode step (the first is prefill's)
            print(f"round {r} {kind}: {runs[kind][-1]:.1f} ms/token", flush=True)
    plain, constrained = statistics.median(runs["plain"]), statistics.median(runs["constrained"])
    records = []
    for what, schema in TEST_SET:
        d = generate(rt, None, prompt(rt, what), Sampling(max_tokens=256, temperature=0,
                                                          grammar=Grammar.json(schema, tokenizer)))
        try:
            ok = d.finish_reason == "stop" and validates(json.loads(d.text), schema)
        except ValueError:
            ok = False
        records.append({"prompt": what, "schema": schema, "reply": d.text, "finish_reason": d.finish_reason,
                        "tokens": d.completion_tokens, "validates": ok})
    m = results.machine()
    result = {"model": args.model, "dtype": str(rt.dtype).replace("torch.", ""), "tokens": args.tokens,
              "machine": m, "command": " ".join(["python"] + sys.argv), "runs_ms_per_token": runs,
              "plain_ms_per_token": plain, "constrained_ms_per_token": constrained, "ratio": constrained / plain,
              "grammar_tokenizer_s": tokenizer_s, "compile_s": compile_s, "test_set": records,
              "acceptance": {"constrained_le_1.10x_per_token": constrained / plain <= 1.10,
                             "every_test_reply_validates": all(r["validates"] for r in records)}}
    ratio = f"{constrained / plain:.3f}x"
    lines = [f"# Structured output: constrained decoding's cost per token ({args.model}, {result['dtype']})", "",
             f"{m['cpu']}, {m['cores']} cores, bf16 flags: {', '.join(m['bf16_flags']) or 'none'}. "
             f"Command: `{result['command']}`. llguidance, as `c2c serve` runs it; greedy; {args.rounds} rounds "
             f"in turns, {args.tokens} tokens each.", "",
             "| decode | ms per token (median) | per round |", "|---|---:|---|",
             f"| unconstrained | {plain:.1f} | {', '.join(f'{x:.1f}' for x in runs['plain'])} |",
             f"| constrained (JSON schema) | {constrained:.1f} | "
             f"{', '.join(f'{x:.1f}' for x in runs['constrained'])} |", "",
             f"Ratio: **{ratio}**" if constrained / plain <= 1.10 else f"Ratio: {ratio}", "",
             f"One-time costs: the model's vocabulary for the engine {tokenizer_s:.2f} s (once per model), "
             f"compiling the schema {compile_s * 1000:.1f} ms (once per request).", "",
             "| test prompt | tokens | finish | validates | reply |", "|---|---:|---|---|---|"]
    for r in records:
        lines.append(f"| {r['prompt']} | {r['tokens']} | {r['finish_reason']} | {'yes' if r['validates'] else 'NO'} "
                     f"| `{r['reply'][:80]}` |")
    lines += ["", "Acceptance: " + ", ".join(f"{k}: {'yes' if v else 'no'}" for k, v in result["acceptance"].items()),
              ""]
    return results.write(args.out, result, "\n".join(lines), records=records)


if __name__ == "__main__":
    sys.exit(main())
