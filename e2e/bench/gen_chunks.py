"""Write a DCP checkpoint of many small chunks, for timing how long a mount
takes to open and list it: one [N, 16] float32 tensor saved as N one-row
chunks, each its own torch.save record in one shard file, and a .metadata
built with torch's own classes and pickled as dcp.save pickles it.

    python e2e/bench/gen_chunks.py OUT [--chunks 100000]"""

import argparse
import io
import os
import pickle

import torch
from torch.distributed.checkpoint.filesystem import _StorageInfo
from torch.distributed.checkpoint.metadata import (ChunkStorageMetadata, Metadata, MetadataIndex,
                                                   TensorProperties, TensorStorageMetadata)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--chunks", type=int, default=100_000)
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    n, cols = a.chunks, 16
    full = torch.arange(n * cols, dtype=torch.float32).reshape(n, cols)
    chunks, storage = [], {}
    with open(os.path.join(a.out, "__0_0.distcp"), "wb") as f:
        for i in range(n):
            buf = io.BytesIO()
            torch.save(full[i:i + 1].clone(), buf)
            rec = buf.getvalue()
            off = f.tell()
            f.write(rec)
            chunk = ChunkStorageMetadata(offsets=torch.Size([i, 0]), sizes=torch.Size([1, cols]))
            chunks.append(chunk)
            storage[MetadataIndex("t", torch.Size([i, 0]), i)] = _StorageInfo("__0_0.distcp", off, len(rec))
    props = TensorProperties(dtype=torch.float32)
    md = Metadata(state_dict_metadata={"t": TensorStorageMetadata(props, torch.Size([n, cols]), chunks)},
                  planner_data={"t": ("t",)}, storage_data=storage)
    with open(os.path.join(a.out, ".metadata"), "wb") as f:
        pickle.dump(md, f)


if __name__ == "__main__":
    main()
