"""Write a large DCP checkpoint for benchmarks, the way a training job does:
several gloo ranks each save their local shards of DTensors.

    python e2e/bench/gen_big.py OUT --dim 0 --gib 2 --world 4

Each rank makes its own shard (DTensor.from_local), so no tensor is ever
materialised whole and generation costs about one write of the data."""

import argparse
import os
import sys

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import models  # noqa: E402  (e2e/models.py: the gloo rendezvous)

ROWS, COLS = 4096, 8192  # 128 MiB of float32 per tensor


def worker(rank, world, init_method, out, dim, count):
    models.join(rank, world, init_method)
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Shard

    mesh = init_device_mesh("cpu", (world,))
    g = torch.Generator().manual_seed(rank)
    state = {}
    for i in range(count):
        shape = [ROWS, COLS]
        shape[dim] //= world
        local = torch.rand(shape, generator=g)
        state[f"layers.{i}.weight"] = DTensor.from_local(local, mesh, [Shard(dim)], run_check=False)
    dcp.save(state, checkpoint_id=out)
    dist.barrier()
    models.leave()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--dim", type=int, default=0)
    ap.add_argument("--gib", type=float, default=2)
    ap.add_argument("--world", type=int, default=4)
    a = ap.parse_args()
    count = max(1, int(a.gib * 1024 / (ROWS * COLS * 4 / 2**20)))
    models.spawn(worker, a.world, a.out, a.dim, count)


if __name__ == "__main__":
    main()
