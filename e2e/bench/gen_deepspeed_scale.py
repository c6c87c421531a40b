"""Write a DeepSpeed ZeRO-3 (or, --stage 2, ZeRO-2) checkpoint of W ranks (global_step1/) as
DeepSpeed 0.19's engine.save_checkpoint lays it out, for timing how ckptfs
opens checkpoints of many ranks: zero_pp_rank_R_mp_rank_00_optim_states.pt
per rank (torch.save of {"optimizer_state_dict": {"zero_stage": 3,
"partition_count": W, "fp32_flat_groups": [flat fp32 partition]}}) and
zero_pp_rank_0_mp_rank_00_model_states.pt (param_shapes). Each param of
numel n has ceil(n / W) elements on every rank (the last ranks padded with
zeros), params back to back in param_shapes order, as zero_to_fp32.py reads
them. The values are real and deterministic: element i of param p is
float32(p * 1000003 + i) mod 2^24, so a reader can check any byte without a
copy (expected()). ZeRO-2: one param group, its params flattened back to
back, padded with zeros to a multiple of 2·W and split evenly, rank r's
part its single_partition_of_fp32_groups[0] (stage_1_and_2.py's layout);
mp_rank_00_model_states.pt holds param_shapes.

Llama-shaped and small by default (8 layers, hidden 512): W = 512 is 512
files, ~140 MB, written in seconds.

    python e2e/bench/gen_deepspeed_scale.py OUT --ranks 512 [--stage 2] [--layers 8 --hidden 512 ...]
"""

import argparse
import os
import time
from collections import OrderedDict

import numpy as np
import torch

from gen_scale import llama_tensors, numel


def values(p, start, n):
    """Elements [start, start+n) of param p, as float32."""
    return ((np.arange(start, start + n, dtype=np.int64) + p * 1000003) % (1 << 24)).astype(np.float32)


def expected(shapes, p):
    """Param p's tensor."""
    name, shape = shapes[p]
    return values(p, 0, numel(shape)).reshape(shape)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--ranks", type=int, default=512)
    ap.add_argument("--stage", type=int, default=3, choices=[2, 3])
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--hidden", type=int, default=512)
    ap.add_argument("--ffn", type=int, default=1408)
    ap.add_argument("--kv-heads", type=int, default=4)
    ap.add_argument("--head-dim", type=int, default=64)
    ap.add_argument("--vocab", type=int, default=8000)
    a = ap.parse_args()
    t0 = time.time()
    step = os.path.join(a.out, "global_step1")
    os.makedirs(step, exist_ok=True)
    shapes = llama_tensors(a.layers, a.hidden, a.ffn, a.kv_heads, a.head_dim, a.vocab)
    W = a.ranks
    if a.stage == 3:
        parts = [-(-numel(s) // W) for _, s in shapes]
        per_rank = sum(parts)
    else:
        total = sum(numel(s) for _, s in shapes)
        per_rank = -(-total // (2 * W)) * 2
        whole = np.concatenate([values(p, 0, numel(s)) for p, (_, s) in enumerate(shapes)])
        whole = np.concatenate([whole, np.zeros(per_rank * W - total, dtype=np.float32)])
    for r in range(W):
        if a.stage == 3:
            flat = np.zeros(per_rank, dtype=np.float32)
            at = 0
            for p, (name, shape) in enumerate(shapes):
                n = numel(shape)
                lo, hi = min(r * parts[p], n), min((r + 1) * parts[p], n)
                flat[at:at + hi - lo] = values(p, lo, hi - lo)
                at += parts[p]
            key = "fp32_flat_groups"
        else:
            flat = whole[r * per_rank:(r + 1) * per_rank].copy()
            key = "single_partition_of_fp32_groups"
        osd = {"zero_stage": a.stage, "partition_count": W, "loss_scaler": None, "dynamic_loss_scale": False,
               "overflow": False, key: [torch.from_numpy(flat)]}
        torch.save({"optimizer_state_dict": osd, "ds_config": {}, "ds_version": "0.19.8"},
                   os.path.join(step, f"zero_pp_rank_{r}_mp_rank_00_optim_states.pt"))
    ms = {"module": None, "buffer_names": [], "param_shapes": [OrderedDict((n, torch.Size(s)) for n, s in shapes)],
          "frozen_param_shapes": None, "shared_params": {}, "frozen_param_fragments": None,
          "dp_world_size": W, "mp_world_size": 1, "ds_version": "0.19.8"}
    torch.save(ms, os.path.join(step, "zero_pp_rank_0_mp_rank_00_model_states.pt" if a.stage == 3
                                else "mp_rank_00_model_states.pt"))
    with open(os.path.join(a.out, "latest"), "w") as f:
        f.write("global_step1")
    total = sum(os.path.getsize(os.path.join(step, f)) for f in os.listdir(step))
    print(f"{a.out}: ZeRO-{a.stage}, {len(shapes)} params, {W} ranks, {per_rank} elements per rank, {total} bytes, {time.time() - t0:.1f}s")


if __name__ == "__main__":
    main()
