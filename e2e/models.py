"""Tiny Llama-style models saved as real DCP checkpoints by several gloo
processes on CPU, the way training jobs save them.

    python e2e/models.py CKPT REF --mode fsdp2 --world 3 [--dtype bfloat16]
    python e2e/models.py CKPT REF --mode tp_fsdp --world 4

writes REF (save_pretrained of the unsharded model, the ground truth) and
CKPT (the DCP checkpoint, with config.json beside it)."""

import argparse
import os
import shutil
import sys
import tempfile

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
import torch.multiprocessing as mp


def spawn(fn, world, *args):
    """Run fn(rank, world, init_method, *args) on `world` gloo ranks. The
    ranks meet at a FileStore in a fresh directory: a TCP port picked free
    and bound later by rank 0 can be taken in between (a fixture save on CI
    failed once, likely so)."""
    d = tempfile.mkdtemp(prefix="ckptfs-gloo-")
    try:
        mp.spawn(fn, args=(world, "file://" + os.path.join(d, "store"), *args), nprocs=world, join=True)
    finally:
        shutil.rmtree(d, ignore_errors=True)


def join(rank, world, init_method):
    dist.init_process_group("gloo", init_method=init_method, rank=rank, world_size=world)


def leave():
    """End a rank that did its work: destroy its process groups, then exit
    without the interpreter's finalization. A rank that finalized after gloo
    ran was killed by SIGABRT once on CI ("terminate called without an
    active exception", after its files were written), a race in torch's
    teardown; everything a rank writes is closed before this."""
    dist.destroy_process_group()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


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


def shard(model, mode, world, mesh_group=None):
    """Shard model in place the way training does: FSDP2 on `world` ranks (or
    on the ranks of `mesh_group`), or TP within pairs of ranks x FSDP2 across."""
    from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
    from torch.distributed.fsdp import fully_shard

    if mode == "fsdp2":
        mesh = DeviceMesh.from_group(mesh_group, "cpu") if mesh_group is not None else init_device_mesh("cpu", (world,))
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
    return model


def worker(rank, world, init_method, ckpt, ref, mode, dtype, nested):
    join(rank, world, init_method)
    from torch.distributed.checkpoint.state_dict import get_model_state_dict

    model = build(dtype)
    if rank == 0:
        model.save_pretrained(ref)
    shard(model, mode, world)
    state = get_model_state_dict(model)
    if nested:
        state = {"model": state, "extra": {"step": 10}}
    dcp.save(state, checkpoint_id=ckpt)
    dist.barrier()
    if rank == 0:
        shutil.copy(os.path.join(ref, "config.json"), os.path.join(ckpt, "config.json"))
    leave()


def save(ckpt, ref, mode="fsdp2", world=3, dtype="float32", nested=False):
    spawn(worker, world, str(ckpt), str(ref), mode, dtype, nested)


# --- The write path: DCP checkpoints written through a --rw mount, loaded back
# into sharded models (used by test_write.py).

def reference_state(ref):
    """name -> tensor of an HF directory written by save_pretrained."""
    import glob

    from safetensors.torch import load_file

    state = {}
    for path in sorted(glob.glob(os.path.join(ref, "*.safetensors"))):
        state.update(load_file(path))
    return state


def _sharded(mode, mesh_group, world, dtype):
    """A model with other weights than build() (seed 1), sharded for `mode`.
    `mesh_group` is the process group of the FSDP2 mesh (fsdp2 on a subset of
    the ranks), or None for the default group."""
    from transformers import LlamaForCausalLM

    torch.manual_seed(1)
    model = LlamaForCausalLM(tiny_config(dtype)).to(getattr(torch, dtype))
    return shard(model, mode, world, mesh_group)


def _load_and_compare(model, ckpt, prefix, want, group, label):
    """dcp.load ckpt into the sharded model; every parameter must equal `want`."""
    from torch.distributed.checkpoint.state_dict import get_model_state_dict, set_model_state_dict

    state = get_model_state_dict(model)
    wrapped = {prefix: state} if prefix else state
    dcp.load(wrapped, checkpoint_id=ckpt, process_group=group)
    set_model_state_dict(model, state)
    bad = []
    for name, p in sorted(get_model_state_dict(model).items()):
        full = p.full_tensor() if hasattr(p, "full_tensor") else p
        if name not in want or full.dtype != want[name].dtype or not torch.equal(full, want[name]):
            bad.append(name)
    if bad:
        raise AssertionError(f"{label}: {len(bad)} parameters differ after dcp.load of {ckpt}: {bad[:5]}")


def load_worker(rank, world, init_method, cases, ref, dtype, configs):
    """One rank of check_load: for each config (mode, n), the first n ranks
    build a sharded model and dcp.load every case (ckpt, prefix) into it."""
    join(rank, world, init_method)
    want = reference_state(ref)
    for mode, n in configs:
        if mode == "fsdp2" and n < world:
            group = dist.new_group(ranks=list(range(n)))  # every rank takes part in creating it
            member = rank < n
        else:
            group, member = None, True
        if member:
            for ckpt, prefix in cases:
                model = _sharded(mode, group, n, dtype)
                _load_and_compare(model, ckpt, prefix, want, group, f"{mode} on {n} ranks")
        dist.barrier()
    leave()


def check_load(cases, ref, dtype="float32", world=4, configs=(("fsdp2", 2), ("fsdp2", 3), ("fsdp2", 4), ("tp_fsdp", 4))):
    """Load each (ckpt, prefix) of `cases` with dcp.load into FSDP2 models on
    2, 3 and 4 ranks and into a 2x2 TP x FSDP mesh model, in one set of
    `world` gloo processes; raise if any parameter differs from the HF
    directory `ref`."""
    cases = [(str(c), p) for c, p in cases]
    spawn(load_worker, world, cases, str(ref), dtype, list(configs))


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
