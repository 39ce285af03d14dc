"""One prepared GPU run (#14, item 4): an 8B-shaped model on CUDA, its 512-token KV across processes, exactness.

    .venv/bin/python benchmarks/gpu.py                          # on a CUDA machine: benchmarks/results/gpu.{json,md}
    .venv/bin/python benchmarks/gpu.py --device cpu --small     # the same steps on small shapes (a dry run)

Nothing needs to travel with it but the repository: the weights are random, in bf16, of
Llama-3-8B's shape (32 layers, hidden 4096, 32 query heads and 8 KV heads of 128, MLP 14336;
the vocabulary is c2c's 259-token byte tokenizer, so the embedding is small), seeded.

1. **Exactness.** 512 random tokens are prefilled into a cache; the cache becomes a c2c
   artifact (bytes, digest-checked on decode), comes back onto the device and continues with
   16 more tokens and 16 greedy ones. The same 528 tokens prefilled in one pass must give the
   same 16 tokens (``exact``), and the received tensors must equal the sent ones bit for bit.
2. **Across processes through pinned memory.** A second process opens the same ``memfd``
   (passed over a Unix socket), both register it with CUDA as pinned host memory
   (``cudaHostRegister``), the first copies the KV tensors device -> pinned, the second
   pinned -> its device. Each step is timed with CUDA synchronisation, beside a device-to-device
   copy of the same bytes, and the second process checks the bytes' sha256.

Writes ``--out`` ``.json`` and ``.md`` (default benchmarks/results/gpu).
"""

from __future__ import annotations

import argparse
import array
import hashlib
import json
import mmap
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"
LLAMA3_8B = dict(hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32,
                 num_key_value_heads=8, head_dim=128, rope_theta=500000.0, max_position_embeddings=8192)
SMALL = dict(hidden_size=256, intermediate_size=512, num_hidden_layers=4, num_attention_heads=4,
             num_key_value_heads=2, head_dim=64, rope_theta=500000.0, max_position_embeddings=8192)

CHILD = r"""
import array, ctypes, hashlib, json, mmap, os, socket, sys, time
import torch
dev, sock_path, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
s.connect(sock_path)
msg, anc, _, _ = s.recvmsg(4096, socket.CMSG_SPACE(4))
fd = array.array("i", anc[0][2][:4])[0]
size = json.loads(msg)["size"]
m = mmap.mmap(fd, size, prot=mmap.PROT_READ | mmap.PROT_WRITE)
host = torch.frombuffer(m, dtype=torch.uint8)
if dev == "cuda":
    torch.cuda.init()
    assert torch.cuda.cudart().cudaHostRegister(host.data_ptr(), size, 0) == 0
out = []
for _ in range(n):
    s.recv(64)  # "ready": the sender has filled the arena
    t0 = time.perf_counter()
    got = host.to(dev, non_blocking=True)
    if dev == "cuda":
        torch.cuda.synchronize()
    out.append(time.perf_counter() - t0)
    s.send(b"done")
digest = hashlib.sha256(got.cpu().numpy().tobytes()).hexdigest()
s.send(json.dumps({"h2d_s": out, "sha256": digest}).encode())
"""


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--small", action="store_true", help="small shapes (a dry run anywhere)")
    ap.add_argument("--tokens", type=int, default=512)
    ap.add_argument("--repeats", type=int, default=10)
    ap.add_argument("--out", default=str(RESULTS / "gpu"), help="output path prefix")
    args = ap.parse_args()

    import torch
    import transformers

    from c2c.artifact import Artifact
    from c2c.artifact.fingerprint import Fingerprint
    from c2c.artifact.prefix import PrefixRef
    from c2c.runtime.transformers import TransformersRuntime
    from c2c.runtime.transformers.tiny import byte_tokenizer

    if args.device == "cuda" and not torch.cuda.is_available():
        print("no CUDA device here: nothing measured, nothing written", file=sys.stderr)
        return 2
    dev = args.device
    tok = byte_tokenizer()  # the tiny models' byte tokenizer: a small embedding, the real layer shapes
    shape = SMALL if args.small else LLAMA3_8B
    config = transformers.LlamaConfig(vocab_size=len(tok), eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id,
                                      bos_token_id=tok.pad_token_id, tie_word_embeddings=False, **shape)
    torch.manual_seed(0)
    t0 = time.perf_counter()
    with torch.device(dev):
        model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16).eval()
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 2:
                p.normal_(0.0, 0.02)
    build_s = time.perf_counter() - t0
    rt = TransformersRuntime(model, tok, name="random-llama3-8b-shape" if not args.small else "random-small", path=None)
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, 256, (args.tokens + 16,), generator=g).tolist()
    head, tail = ids[:args.tokens], ids[args.tokens:]

    # 1. exactness: through artifact bytes, against one pass
    one_pass = rt.generate(ids, max_new_tokens=16, min_new_tokens=16).token_ids
    _, cache = rt.prefill(head)                                 # [1, 8, T, 128] per layer on the device
    t0 = time.perf_counter()
    art = Artifact.build(cache.to("cpu"), fingerprint=Fingerprint.of(rt), prefix=PrefixRef.of(head[:0]))
    data = art.encode()
    back = Artifact.decode(bytearray(data)).cache.to(dev)
    artifact_s = time.perf_counter() - t0
    same_bytes = all(torch.equal(a, b) for a, b in zip(cache.keys + cache.values, back.keys + back.values))
    split = rt.generate(tail, back, max_new_tokens=16, min_new_tokens=16).token_ids

    # 2. the KV across processes through pinned shared memory
    tensors = [t.contiguous() for pair in zip(cache.keys, cache.values) for t in pair]
    nbytes = sum(t.numel() * t.element_size() for t in tensors)
    fd = os.memfd_create("c2c-gpu-arena", os.MFD_CLOEXEC)
    os.ftruncate(fd, nbytes)
    m = mmap.mmap(fd, nbytes)
    host = torch.frombuffer(m, dtype=torch.uint8)
    if dev == "cuda":
        assert torch.cuda.cudart().cudaHostRegister(host.data_ptr(), nbytes, 0) == 0
    views, at = [], 0
    for t in tensors:
        n = t.numel() * t.element_size()
        views.append(host[at:at + n])
        at += n
    path = Path(tempfile.mkdtemp()) / "gpu.sock"
    lst = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    lst.bind(str(path))
    lst.listen(1)
    child = subprocess.Popen([sys.executable, "-c", CHILD, dev, str(path), str(args.repeats)])
    conn, _ = lst.accept()
    conn.sendmsg([json.dumps({"size": nbytes}).encode()],
                 [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", [fd]).tobytes())])

    def sync():
        if dev == "cuda":
            torch.cuda.synchronize()

    d2h = []
    for _ in range(args.repeats):
        t0 = time.perf_counter()
        for v, t in zip(views, tensors):
            v.copy_(t.view(-1).view(torch.uint8), non_blocking=True)
        sync()
        d2h.append(time.perf_counter() - t0)
        conn.send(b"ready")
        assert conn.recv(64) == b"done"
    report = json.loads(conn.recv(1 << 16))
    child.wait(timeout=120)
    sent_digest = hashlib.sha256(host.numpy().tobytes()).hexdigest()
    flat = torch.cat([t.view(-1).view(torch.uint8) for t in tensors])
    d2d = []
    for _ in range(args.repeats):
        sync()
        t0 = time.perf_counter()
        flat.clone()
        sync()
        d2d.append(time.perf_counter() - t0)
    med = statistics.median
    across = med(d2h) + med(report["h2d_s"])
    result = {
        "device": torch.cuda.get_device_name() if dev == "cuda" else dev, "shape": shape,
        "dtype": "bfloat16", "tokens": args.tokens, "kv_bytes": nbytes, "build_s": build_s,
        "exact": one_pass == split, "received_bytes_identical": same_bytes, "artifact_roundtrip_s": artifact_s,
        "across_processes_pinned": {"d2h_s": med(d2h), "h2d_s": med(report["h2d_s"]), "total_s": across,
                                    "gbps": nbytes / across / 1e9, "bytes_identical": report["sha256"] == sent_digest},
        "device_to_device_copy_s": med(d2d), "device_to_device_gbps": nbytes / med(d2d) / 1e9,
        "command": "python benchmarks/gpu.py " + " ".join(sys.argv[1:]),
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    result["acceptance"] = {"exact": result["exact"], "received_bytes_identical": same_bytes,
                            "pinned_bytes_identical": result["across_processes_pinned"]["bytes_identical"]}
    from c2c.bench import results

    return results.write(args.out, result, markdown(result))


def markdown(r: dict) -> str:
    p = r["across_processes_pinned"]
    s = r["shape"]
    lines = [f"# GPU run: {r['device']}, a {r['tokens']}-token bf16 KV of {s['num_hidden_layers']} layers x "
             f"{s['num_key_value_heads']} KV heads x {s.get('head_dim', s['hidden_size'] // s['num_attention_heads'])}",
             "",
             f"Command: `{r['command']}` ({r['created']}).", "",
             "| step | seconds | GB/s |", "|---|---:|---:|",
             f"| artifact round trip (encode, decode, back on the device) | {r['artifact_roundtrip_s']:.4f} | – |",
             f"| across processes: device -> pinned memfd | {p['d2h_s']:.4f} | – |",
             f"| across processes: pinned memfd -> device | {p['h2d_s']:.4f} | – |",
             f"| across processes, total | {p['total_s']:.4f} | {p['gbps']:.2f} |",
             f"| device-to-device copy of the same bytes | {r['device_to_device_copy_s']:.4f} | "
             f"{r['device_to_device_gbps']:.2f} |", "",
             f"KV: {r['kv_bytes']:,} bytes. " + ", ".join(f"{k}: **{'PASS' if v else 'FAIL'}**"
                                                         for k, v in r["acceptance"].items()), ""]
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
