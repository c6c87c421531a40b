"""Write a large DCP checkpoint for benchmarks, the way a training job does:
several gloo ranks each save their local shards of DTensors.

    python e2e/bench/gen_big.py OUT --dim 0 --gib 2 --world 4

Each rank makes its own shard (DTensor.from_local), so no tensor is ever
materialised whole and generation costs about one write of the data."""

import argparse
import os
import socket

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
import torch.multiprocessing as mp

ROWS, COLS = 4096, 8192  # 128 MiB of float32 per tensor


def worker(rank, world, port, out, dim, count):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
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
    dist.destroy_process_group()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--dim", type=int, default=0)
    ap.add_argument("--gib", type=float, default=2)
    ap.add_argument("--world", type=int, default=4)
    a = ap.parse_args()
    count = max(1, int(a.gib * 1024 / (ROWS * COLS * 4 / 2**20)))
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    mp.spawn(worker, args=(a.world, port, a.out, a.dim, count), nprocs=a.world, join=True)


if __name__ == "__main__":
    main()
