"""Write an HF-sharded safetensors checkpoint of W files, as torch's
HuggingFaceStorageWriter(save_distributed=True) writes it from W FSDP ranks
(shard-{rank+1:05}-model-00001-of-00001.safetensors, each holding its rank's
dim-0 piece of every tensor, the pieces' global offsets in the header's
__metadata__ DCP_SHARDING_INFO), for timing how ckptfs opens checkpoints of
many files. Headers are written as safetensors writes them (entries sorted
by name, the header padded with spaces to 8 bytes); the data is sparse (made
by truncate). A rank with no rows of a tensor does not list it.

Llama-3-70B-shaped by default (80 layers, hidden 8192, ffn 28672, 8 kv
heads, vocab 128256, bf16): W = 1024 is 1024 headers of ~0.1 MB.

    python e2e/bench/gen_hfsharded_scale.py OUT --ranks 1024 [--layers 80 ...]
"""

import argparse
import json
import os
import struct
import time

from gen_scale import llama_tensors, numel


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--ranks", type=int, default=1024)
    ap.add_argument("--layers", type=int, default=80)
    ap.add_argument("--hidden", type=int, default=8192)
    ap.add_argument("--ffn", type=int, default=28672)
    ap.add_argument("--kv-heads", type=int, default=8)
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--vocab", type=int, default=128256)
    a = ap.parse_args()
    t0 = time.time()
    os.makedirs(a.out, exist_ok=True)
    tensors = llama_tensors(a.layers, a.hidden, a.ffn, a.kv_heads, a.head_dim, a.vocab)
    W = a.ranks
    headers = 0
    for r in range(W):
        pieces = []
        for name, shape in tensors:
            per = -(-shape[0] // W)
            start = min(r * per, shape[0])
            n = min(per, shape[0] - start)
            if n > 0:
                pieces.append((name, [n, *shape[1:]], [start] + [0] * (len(shape) - 1)))
        info = {name: {"saved_offsets": off} for name, _, off in pieces}
        header = {"__metadata__": {"DCP_SHARDING_INFO": json.dumps(info)}}
        at = 0
        for name, shape, _ in sorted(pieces):
            size = numel(shape) * 2
            header[name] = {"dtype": "BF16", "shape": shape, "data_offsets": [at, at + size]}
            at += size
        h = json.dumps(header, separators=(",", ":")).encode()
        h += b" " * (-len(h) % 8)
        headers += len(h)
        path = os.path.join(a.out, f"shard-{r + 1:05d}-model-00001-of-00001.safetensors")
        with open(path, "wb") as f:
            f.write(struct.pack("<Q", len(h)) + h)
            f.truncate(8 + len(h) + at)
    print(f"{a.out}: {len(tensors)} tensors, {W} files, {headers} header bytes, {time.time() - t0:.1f}s")


if __name__ == "__main__":
    main()
