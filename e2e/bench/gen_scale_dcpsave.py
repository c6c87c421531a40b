"""Write the .metadata dcp.save itself writes for gen_scale.py's model
(Llama-405B shapes, {"model": ...}, FSDP2 Shard(0) over W ranks), with no
tensor bytes: the W ranks are threads on torch's threaded process group
(gen_scale_bytes.threaded_save), each holding meta-device DTensors; the
storage writer is torch's FileSystemWriter but for write_data, which
reports each record's place in its rank file (the bytes plus
gen_scale.RECORD_OVERHEAD) without writing it, and leaves the rank files
sparse. Everything else (planning, gathers, de-duplication, the
Metadata and its pickle) is dcp.save's: the oracle for gen_scale.py's
hand-written stream at the same shapes (bench_scale's dcpsave row).

    python e2e/bench/gen_scale_dcpsave.py OUT [--ranks 64] [--layers 126]
"""

import argparse
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gen_scale  # noqa: E402
from gen_scale_bytes import shard0, threaded_save  # noqa: E402


def writer_class():
    from torch.distributed.checkpoint import FileSystemWriter
    from torch.distributed.checkpoint.filesystem import _StorageInfo
    from torch.distributed.checkpoint.storage import WriteResult
    from torch.futures import Future

    class NoBytes(FileSystemWriter):
        """FileSystemWriter's one file per rank (its prefix, file 0), the
        records' places reported, nothing written but the file's length."""

        def write_data(self, plan, planner):
            name = plan.storage_data.prefix + "0.distcp"
            at, results = 0, []
            for it in plan.items:
                n = (it.tensor_storage_size() or 64) + gen_scale.RECORD_OVERHEAD
                results.append(WriteResult(index=it.index, size_in_bytes=n, storage_data=_StorageInfo(name, at, n)))
                at += n
            with open(os.path.join(self.path, name), "wb") as f:
                f.truncate(at)
            fut = Future()
            fut.set_result(results)
            return fut

    return NoBytes


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--ranks", type=int, default=64)
    ap.add_argument("--layers", type=int, default=126)
    a = ap.parse_args()
    t0 = time.time()
    os.makedirs(a.out, exist_ok=True)
    shapes = gen_scale.llama_tensors(a.layers, 16384, 53248, 8, 128, 128256)
    full = {name: torch.empty(shape, dtype=torch.bfloat16, device="meta") for name, shape in shapes}
    threaded_save(a.out, a.ranks, lambda rank, mesh: {"model": {n: shard0(t, rank, a.ranks, mesh) for n, t in full.items()}},
                  writer_class())
    meta = os.path.join(a.out, ".metadata")
    print(f"{a.out}: {len(full)} tensors, .metadata {os.path.getsize(meta)} bytes, {time.time() - t0:.1f}s")


if __name__ == "__main__":
    main()
