"""Loads DCP directories written by ckptfs's Go DCP writer at another world
size: WORLD gloo processes on CPU, each tensor as a DTensor placed Shard(0),
then Shard(1), then Replicate() over a 1-D mesh, dcp.load, and every rank
compares its local shard with the same box of the source bytes.

usage: check_reshard.py WORLD PORT DIR [DIR ...]   (DIR.expect.json as for
check_load.py). Prints one OK line per directory; exits non-zero on a
mismatch.
"""
import json
import os
import sys
import warnings

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
import torch.multiprocessing as mp
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor, Replicate, Shard
from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

warnings.filterwarnings("ignore")


def raw(t):
    return bytes(t.detach().contiguous().clone().untyped_storage()).hex()


def run(rank, world, port, dirs):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    mesh = init_device_mesh("cpu", (world,))
    for d in dirs:
        with open(d.rstrip("/") + ".expect.json") as f:
            tensors = json.load(f)["tensors"]
        for placement in (Shard(0), Shard(1), Replicate()):
            sd, want = {}, {}
            for e in tensors:
                dt = getattr(torch, e["dtype"])
                b = bytes.fromhex(e["hex"])
                ref = (torch.frombuffer(bytearray(b), dtype=torch.uint8).view(dt).reshape(e["shape"])
                       if b else torch.empty(e["shape"], dtype=dt))
                p = placement
                if isinstance(p, Shard) and p.dim >= len(e["shape"]):
                    p = Replicate()
                shape, off = compute_local_shape_and_global_offset(torch.Size(e["shape"]), mesh, [p])
                box = ref
                for dim, (o, s) in enumerate(zip(off, shape)):
                    box = box.narrow(dim, o, s)
                local = DTensor.from_local(torch.empty(shape, dtype=dt), mesh, [p], run_check=False,
                                           shape=torch.Size(e["shape"]), stride=ref.stride())
                cur = sd
                for k in e["path"][:-1]:
                    cur = cur.setdefault(k, {})
                cur[e["path"][-1]] = local
                want[e["fqn"]] = (e["path"], raw(box))
            dcp.load(sd, checkpoint_id=d)
            for fqn, (path, h) in want.items():
                cur = sd
                for k in path:
                    cur = cur[k]
                if raw(cur.to_local()) != h:
                    print(f"FAIL {d}: {fqn} {placement} rank {rank}/{world}: local shard differs", flush=True)
                    sys.exit(1)
        dist.barrier()
        if rank == 0:
            print(f"OK {os.path.basename(d)}: world {world}, torch {torch.__version__}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    if len(sys.argv) < 4:
        sys.exit(__doc__)
    world, port = int(sys.argv[1]), int(sys.argv[2])
    mp.spawn(run, args=(world, port, sys.argv[3:]), nprocs=world)
