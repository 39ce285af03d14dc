"""How long the connector takes to write an attached commit into vLLM's paged KV blocks, and to read one out.

    .venv/bin/python benchmarks/vllm_paged.py                 # a few seconds; needs no vLLM
    .venv/bin/python benchmarks/vllm_paged.py --tokens 549 --reps 200

Outputs benchmarks/results/vllm_paged.{json,md} (or --out PREFIX).

One layer of Qwen2.5-Coder-0.5B (2 KV heads x 64, bf16), the K/V of ``--tokens`` prompt
positions (549: what the vLLM pipeline benchmark imports), in the block sizes vLLM uses for
each packing (``c2c.vllm.paged``). Per layer, one thread, the median of ``--reps``:

- ``write``: :meth:`PagedLayout.write`, as ``wait_for_layer_load`` calls it before each
  layer's attention (the last block part way: its other positions are kept);
- ``read``: :meth:`PagedLayout.read`, as a publish copies a finished request out;
- the **baseline**, an element-wise gather and scatter over every (position, head, dim)
  offset of the kernel's table: how ``c2c.vllm.paged`` moved K/V before it moved whole
  blocks. Both give the same bytes (checked here on every row).

The connector does this for every layer of every attach (24 layers here) on vLLM's forward
path, so a millisecond per layer is 24 ms of engine time per attach.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

from c2c.bench import results
from c2c.vllm.paged import layout_for

RESULTS = Path(__file__).resolve().parent / "results"
HEADS, DIM, LAYERS = 2, 64, 24


def element_offsets(isa: str, p: torch.Tensor, d: torch.Tensor, B: int, D: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Offsets of key and value (p, d) inside a (block, head) region, element by element (the docstring table
    of ``c2c.vllm.paged``)."""
    if isa == "amx":
        keys = ((p // 16) * (D // 2) + d // 2) * 32 + (p % 16) * 2 + d % 2
        return keys, B * D + ((d // 16) * (B // 2) + p // 2) * 32 + (d % 16) * 2 + p % 2
    return d * B + p, B * D + p * D + d


class Elementwise:
    """The baseline: one index per element, into the layer viewed as ``(NB, H, 2*B*D)``."""

    def __init__(self, isa: str, B: int, block_ids: list[int], start: int, end: int):
        pos = torch.arange(start, end)
        table = torch.as_tensor(block_ids)
        block, p = table[pos // B], pos % B                                          # (T,), (T,)
        ko, vo = element_offsets(isa, p[:, None], torch.arange(DIM)[None, :], B, DIM)  # (T, D)
        self.b, self.h = block[:, None, None], torch.arange(HEADS)[None, :, None]
        self.ko, self.vo, self.B = ko[:, None, :], vo[:, None, :], B

    def write(self, layer, keys, values):
        flat = layer.view(layer.shape[0], HEADS, 2 * self.B * DIM)
        flat[self.b, self.h, self.ko] = keys[0].permute(1, 0, 2)                   # (T, H, D)
        flat[self.b, self.h, self.vo] = values[0].permute(1, 0, 2)

    def read(self, layer):
        flat = layer.view(layer.shape[0], HEADS, 2 * self.B * DIM)
        return (flat[self.b, self.h, self.ko].permute(1, 0, 2)[None].contiguous(),
                flat[self.b, self.h, self.vo].permute(1, 0, 2)[None].contiguous())


def median_ms(fn, reps: int) -> float:
    fn()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e3


def row(isa: str, B: int, tokens: int, reps: int) -> dict:
    g = torch.Generator().manual_seed(B)
    n = -(-tokens // B)
    blocks = torch.randperm(4 * n, generator=g)[:n].tolist()           # scattered, as vLLM hands them out
    layer = torch.randn(4 * n, HEADS, B, 2 * DIM, generator=g).bfloat16()
    keys = torch.randn(1, HEADS, tokens, DIM, generator=g).bfloat16()
    values = torch.randn(1, HEADS, tokens, DIM, generator=g).bfloat16()
    lay, base = layout_for(isa, block_size=B, kv_heads=HEADS, head_dim=DIM), Elementwise(isa, B, blocks, 0, tokens)
    ours, theirs = layer.clone(), layer.clone()
    lay.write(ours, blocks, 0, keys, values)
    base.write(theirs, keys, values)
    same = torch.equal(ours.view(torch.int16), theirs.view(torch.int16)) and all(
        torch.equal(a, b) for a, b in zip(lay.read(ours, blocks, 0, tokens), base.read(theirs)))
    out = {"isa": isa, "block_size": B, "tokens": tokens, "same_bytes": same,
           "write_ms": median_ms(lambda: lay.write(ours, blocks, 0, keys, values), reps),
           "read_ms": median_ms(lambda: lay.read(ours, blocks, 0, tokens), reps),
           "baseline_write_ms": median_ms(lambda: base.write(theirs, keys, values), reps),
           "baseline_read_ms": median_ms(lambda: base.read(theirs), reps)}
    out["write_speedup"] = out["baseline_write_ms"] / out["write_ms"]
    out["read_speedup"] = out["baseline_read_ms"] / out["read_ms"]
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tokens", type=int, default=549)
    ap.add_argument("--reps", type=int, default=100)
    ap.add_argument("--out", default=str(RESULTS / "vllm_paged"))
    args = ap.parse_args()
    torch.set_num_threads(1)
    rows = [row(isa, B, args.tokens, args.reps) for isa, B in (("vec", 128), ("vec", 16), ("amx", 32), ("amx", 128))]
    out = {"machine": results.machine(), "tokens": args.tokens, "reps": args.reps, "threads": 1,
           "kv_heads": HEADS, "head_dim": DIM, "rows": rows,
           "acceptance": {"same_bytes_as_the_elementwise_baseline": all(r["same_bytes"] for r in rows),
                          "vec_block128_write_and_read_2x_faster": rows[0]["write_speedup"] >= 2
                          and rows[0]["read_speedup"] >= 2}}
    return results.write(Path(args.out), out, markdown(out))


def markdown(out: dict) -> str:
    m = out["machine"]
    lines = [f"# The connector's paged K/V copies, per layer ({out['tokens']} tokens, bf16, {out['kv_heads']} KV heads "
             f"x {out['head_dim']})", "",
             f"CPU: {m['cpu']} ({m['cores']} cores; AMX-BF16 {'yes' if m['amx_bf16'] else 'no'}); one thread; the "
             f"median of {out['reps']} runs. Baseline: an element-wise gather/scatter over the kernel's table "
             "(module doc of `benchmarks/vllm_paged.py`). ms per layer; the connector does it for every layer.", "",
             "| packing | block | write ms | baseline write ms | speed-up | read ms | baseline read ms | speed-up "
             "| same bytes |", "|---|---:|---:|---:|---:|---:|---:|---:|---|"]
    for r in out["rows"]:
        lines.append(f"| {r['isa']} | {r['block_size']} | {r['write_ms']:.3f} | {r['baseline_write_ms']:.3f} | "
                     f"{r['write_speedup']:.1f}x | {r['read_ms']:.3f} | {r['baseline_read_ms']:.3f} | "
                     f"{r['read_speedup']:.1f}x | {'yes' if r['same_bytes'] else 'NO'} |")
    lines += ["", "Acceptance: " + ", ".join(f"{k} {'yes' if v else 'NO'}" for k, v in out["acceptance"].items())]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
