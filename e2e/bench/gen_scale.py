"""Write the .metadata of a large FSDP-sharded torch DCP checkpoint, with
sparse shard files (made by truncate: no tensor data), for timing how
ckptfs opens checkpoints of many ranks.

The tensors are Llama-3.1-405B-shaped by default (126 layers, hidden 16384,
ffn 53248, 8 kv heads, vocab 128256), saved as {"model": ..., "optim": ...}:
each tensor split on dim 0 into W chunks (FSDP: ceil(rows/W) rows per rank,
empty chunks past the end), one per rank file __<r>_0.distcp. With --adam,
optimizer state as torch.optim.Adam keeps it: optim.state.<fqn>.exp_avg and
exp_avg_sq (float32, sharded like the parameter) and step (a 0-dim float32
tensor, saved by rank 0). The .metadata is built with torch's own classes
(Metadata, TensorStorageMetadata, ChunkStorageMetadata, MetadataIndex,
_StorageInfo) and pickled as dcp.save pickles it; as in a real save, the
objects of each rank's write results are distinct (they were gathered), and
a rank's relative_path is one string.

    python e2e/bench/gen_scale.py OUT --ranks 512 [--adam] [--layers 126]
"""

import argparse
import os
import pickle
import time

import torch
from torch.distributed.checkpoint.filesystem import _StorageInfo
from torch.distributed.checkpoint.metadata import (BytesStorageMetadata, ChunkStorageMetadata, Metadata,
                                                   MetadataIndex, TensorProperties, TensorStorageMetadata)

# The record a chunk's bytes sit in (a torch.save zip) is this much larger
# than the bytes.
RECORD_OVERHEAD = 1024


def llama_tensors(layers, hidden, ffn, kv_heads, head_dim, vocab):
    """(name, shape) of a Llama's HF state dict."""
    out = [("model.embed_tokens.weight", (vocab, hidden))]
    kv = kv_heads * head_dim
    for i in range(layers):
        p = f"model.layers.{i}."
        out += [(p + "self_attn.q_proj.weight", (hidden, hidden)),
                (p + "self_attn.k_proj.weight", (kv, hidden)),
                (p + "self_attn.v_proj.weight", (kv, hidden)),
                (p + "self_attn.o_proj.weight", (hidden, hidden)),
                (p + "mlp.gate_proj.weight", (ffn, hidden)),
                (p + "mlp.up_proj.weight", (ffn, hidden)),
                (p + "mlp.down_proj.weight", (hidden, ffn)),
                (p + "input_layernorm.weight", (hidden,)),
                (p + "post_attention_layernorm.weight", (hidden,))]
    out += [("model.norm.weight", (hidden,)), ("lm_head.weight", (vocab, hidden))]
    return out


def numel(shape):
    n = 1
    for d in shape:
        n *= d
    return n


class Writer:
    """Builds state_dict_metadata, planner_data and storage_data, and keeps
    each rank file's length."""

    def __init__(self, ranks):
        self.ranks = ranks
        self.sdm, self.planner, self.storage = {}, {}, {}
        self.sizes = [0] * ranks
        self.paths = [f"__{r}_0.distcp" for r in range(ranks)]

    def put(self, rank, fqn, offsets, nbytes):
        length = nbytes + RECORD_OVERHEAD
        # Fresh torch.Size objects, as after a gather: nothing shared with
        # the chunk's own.
        self.storage[MetadataIndex(fqn, torch.Size(offsets))] = _StorageInfo(
            self.paths[rank], self.sizes[rank], length)
        self.sizes[rank] += length

    def sharded(self, fqn, path, shape, dtype, esize):
        rows = shape[0]
        per = -(-rows // self.ranks)
        rest = numel(shape[1:])
        chunks = []
        for r in range(self.ranks):
            start = min(r * per, rows)
            n = min(per, rows - start)
            off = (start,) + (0,) * (len(shape) - 1)
            chunks.append(ChunkStorageMetadata(offsets=torch.Size(off), sizes=torch.Size((n,) + tuple(shape[1:]))))
            self.put(r, fqn, off, n * rest * esize)
        self.sdm[fqn] = TensorStorageMetadata(TensorProperties(dtype=dtype), torch.Size(shape), chunks)
        self.planner[fqn] = path

    def scalar(self, fqn, path):
        self.sdm[fqn] = TensorStorageMetadata(TensorProperties(dtype=torch.float32), torch.Size(()),
                                              [ChunkStorageMetadata(offsets=torch.Size(()), sizes=torch.Size(()))])
        self.planner[fqn] = path
        self.put(0, fqn, (), 4)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--ranks", type=int, default=512)
    ap.add_argument("--adam", action="store_true", help="add Adam's exp_avg, exp_avg_sq and step")
    ap.add_argument("--layers", type=int, default=126)
    ap.add_argument("--hidden", type=int, default=16384)
    ap.add_argument("--ffn", type=int, default=53248)
    ap.add_argument("--kv-heads", type=int, default=8)
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--vocab", type=int, default=128256)
    a = ap.parse_args()
    t0 = time.time()
    os.makedirs(a.out, exist_ok=True)
    w = Writer(a.ranks)
    params = llama_tensors(a.layers, a.hidden, a.ffn, a.kv_heads, a.head_dim, a.vocab)
    for name, shape in params:
        w.sharded("model." + name, ("model", name), shape, torch.bfloat16, 2)
    if a.adam:
        for name, shape in params:
            for st in ("exp_avg", "exp_avg_sq"):
                fqn = f"optim.state.{name}.{st}"
                w.sharded(fqn, ("optim", "state", name, st), shape, torch.float32, 4)
            w.scalar(f"optim.state.{name}.step", ("optim", "state", name, "step"))
        w.sdm["optim.param_groups.0.lr"] = BytesStorageMetadata()
        w.planner["optim.param_groups.0.lr"] = ("optim", "param_groups", 0, "lr")
        w.storage[MetadataIndex("optim.param_groups.0.lr")] = _StorageInfo(w.paths[0], w.sizes[0], 64)
        w.sizes[0] += 64
    md = Metadata(state_dict_metadata=w.sdm, planner_data=w.planner, storage_data=w.storage)
    for r in range(a.ranks):
        with open(os.path.join(a.out, w.paths[r]), "wb") as f:
            f.truncate(w.sizes[r])
    with open(os.path.join(a.out, ".metadata"), "wb") as f:
        pickle.dump(md, f)
    chunks = sum(len(t.chunks) for t in w.sdm.values() if isinstance(t, TensorStorageMetadata))
    print(f"{a.out}: {len(w.sdm)} items, {chunks} chunks, .metadata {os.path.getsize(os.path.join(a.out, '.metadata'))} bytes, "
          f"{time.time() - t0:.1f}s")


if __name__ == "__main__":
    main()
