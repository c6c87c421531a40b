"""Tiny Llama-style models saved as real DCP checkpoints by several gloo
processes on CPU, the way training jobs save them.

    python e2e/models.py CKPT REF --mode fsdp2 --world 3 [--dtype bfloat16]
    python e2e/models.py CKPT REF --mode tp_fsdp --world 4

writes REF (save_pretrained of the unsharded model, the ground truth) and
CKPT (the DCP checkpoint, with config.json beside it)."""

import argparse
import os
import shutil
import socket

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
import torch.multiprocessing as mp


def tiny_config(dtype):
    from transformers import LlamaConfig

    # Odd sizes so that FSDP2 shards are uneven on 3 ranks.
    return LlamaConfig(vocab_size=131, hidden_size=64, intermediate_size=88, num_hidden_layers=2,
                       num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                       tie_word_embeddings=False, torch_dtype=dtype)


def build(dtype):
    from transformers import LlamaForCausalLM

    torch.manual_seed(0)
    model = LlamaForCausalLM(tiny_config(dtype))
    return model.to(getattr(torch, dtype)).eval()


def worker(rank, world, port, ckpt, ref, mode, dtype, nested):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    from torch.distributed.checkpoint.state_dict import get_model_state_dict
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    model = build(dtype)
    if rank == 0:
        model.save_pretrained(ref)
    if mode == "fsdp2":
        mesh = init_device_mesh("cpu", (world,))
        for layer in model.model.layers:
            fully_shard(layer, mesh=mesh)
        fully_shard(model, mesh=mesh)
    elif mode == "tp_fsdp":
        from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

        mesh = init_device_mesh("cpu", (2, world // 2), mesh_dim_names=("dp", "tp"))
        plan = {
            "self_attn.q_proj": ColwiseParallel(), "self_attn.k_proj": ColwiseParallel(),
            "self_attn.v_proj": ColwiseParallel(), "self_attn.o_proj": RowwiseParallel(),
            "mlp.gate_proj": ColwiseParallel(), "mlp.up_proj": ColwiseParallel(),
            "mlp.down_proj": RowwiseParallel(),
        }
        for layer in model.model.layers:
            parallelize_module(layer, mesh["tp"], plan)
            fully_shard(layer, mesh=mesh["dp"])
        fully_shard(model, mesh=mesh["dp"])
    else:
        raise ValueError(mode)
    state = get_model_state_dict(model)
    if nested:
        state = {"model": state, "extra": {"step": 10}}
    dcp.save(state, checkpoint_id=ckpt)
    dist.barrier()
    if rank == 0:
        shutil.copy(os.path.join(ref, "config.json"), os.path.join(ckpt, "config.json"))
    dist.destroy_process_group()


def save(ckpt, ref, mode="fsdp2", world=3, dtype="float32", nested=False):
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    mp.spawn(worker, args=(world, port, str(ckpt), str(ref), mode, dtype, nested), nprocs=world, join=True)


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("ckpt")
    ap.add_argument("ref")
    ap.add_argument("--mode", default="fsdp2", choices=["fsdp2", "tp_fsdp"])
    ap.add_argument("--world", type=int, default=3)
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--nested", action="store_true")
    a = ap.parse_args()
    save(a.ckpt, a.ref, a.mode, a.world, a.dtype, a.nested)
