"""Write the .metadata dcp.save itself writes for gen_scale.py's model
(Llama-405B shapes by default, {"model": ...}, FSDP2 Shard(0) over W ranks;
with --adam, gen_scale.py's optimizer state under "optim"), with no
tensor bytes: the W ranks are threads on torch's threaded process group
(gen_scale_bytes.threaded_save), each holding meta-device DTensors; the
storage writer is torch's FileSystemWriter but for write_data, which
reports each record's place in its rank file (the bytes plus
gen_scale.RECORD_OVERHEAD) without writing it, and leaves the rank files
sparse. Everything else (planning, gathers, de-duplication, the
Metadata and its pickle) is dcp.save's: the oracle for gen_scale.py's
hand-written stream at the same shapes (bench_scale's dcpsave row;
e2e/test_bench_gen.py compares the two byte for byte). Its records are
the chunk's bytes (WriteItem.tensor_storage_size() is the whole tensor's).

    python e2e/bench/gen_scale_dcpsave.py OUT [--ranks 64] [--layers 126] [--adam] [--hidden 16384] ...
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
            # FileSystemWriter's order in a rank file: the bytes items,
            # then the tensors (_write_files_from_queue)
            for it in sorted(plan.items, key=lambda it: it.tensor_data is not None):
                # the chunk's bytes (tensor_storage_size() is the whole
                # tensor's), 64 for a bytes item
                n = (gen_scale.numel(it.tensor_data.chunk.sizes) * torch._utils._element_size(it.tensor_data.properties.dtype)
                     if it.tensor_data is not None else 64) + gen_scale.RECORD_OVERHEAD
                results.append(WriteResult(index=it.index, size_in_bytes=n, storage_data=_StorageInfo(name, at, n)))
                at += n
            with open(os.path.join(self.path, name), "wb") as f:
                f.truncate(at)
            fut = Future()
            fut.set_result(results)
            return fut

    return NoBytes


def save(out, a):
    """dcp.save of a's checkpoint (gen_scale.items(): a.ranks, a.layers,
    the shapes, a.adam) into out, by a.ranks threaded ranks."""
    shapes = gen_scale.llama_tensors(a.layers, a.hidden, a.ffn, a.kv_heads, a.head_dim, a.vocab)
    full = {name: torch.empty(shape, dtype=torch.bfloat16, device="meta") for name, shape in shapes}

    def state_of(rank, mesh):
        state = {"model": {n: shard0(t, rank, a.ranks, mesh) for n, t in full.items()}}
        if a.adam:
            # gen_scale.items()'s optimizer state: exp_avg, exp_avg_sq
            # (float32, sharded like the parameter), step (a 0-dim float32
            # tensor every rank holds), param_groups[0]["lr"] (bytes)
            st = {}
            for n, t in full.items():
                f32 = torch.empty(t.shape, dtype=torch.float32, device="meta")
                st[n] = {"exp_avg": shard0(f32, rank, a.ranks, mesh), "exp_avg_sq": shard0(f32, rank, a.ranks, mesh),
                         "step": torch.zeros((), dtype=torch.float32)}
            state["optim"] = {"state": st, "param_groups": [{"lr": 1e-4}]}
        return state

    threaded_save(out, a.ranks, state_of, writer_class())
    return len(full)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--ranks", type=int, default=64)
    ap.add_argument("--layers", type=int, default=126)
    ap.add_argument("--adam", action="store_true", help="add Adam's state as gen_scale.py does")
    ap.add_argument("--hidden", type=int, default=16384)
    ap.add_argument("--ffn", type=int, default=53248)
    ap.add_argument("--kv-heads", type=int, default=8)
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--vocab", type=int, default=128256)
    a = ap.parse_args()
    t0 = time.time()
    os.makedirs(a.out, exist_ok=True)
    n = save(a.out, a)
    meta = os.path.join(a.out, ".metadata")
    print(f"{a.out}: {n} tensors, .metadata {os.path.getsize(meta)} bytes, {time.time() - t0:.1f}s")


if __name__ == "__main__":
    main()
