"""Write a torch DCP checkpoint with real tensor bytes as W FSDP2 ranks save
it (each rank its Shard(0) DTensor pieces, one __<rank>_0.distcp each), by
torch's own dcp.save: the W ranks are threads of one process joined by
torch's threaded process group (torch.testing's multi_threaded_pg, what
torch's own DTensor tests run on), so the planning, the gathers of plans
and write results, and the .metadata are dcp.save's for a W-rank world,
without W interpreters (256 gloo processes do not fit this VM).

The tensors are a Llama of tiny dims (HF names, bf16): tensor k of
llama_tensors() is tensors(a)[k], from a generator seeded with k, so the
bench computes the originals again in its own run. With 256 ranks a
rank holds a row or a few of each tensor; the k/v projections (128 rows)
leave half the ranks empty pieces, and so do rows that do not divide
(dcp.save keeps one empty chunk per tensor: BENCHMARKS.md, run Z-scale).

    python e2e/bench/gen_scale_bytes.py OUT [--ranks 256] [--layers 4] [--hidden 512] ...
"""

import argparse
import json
import os
import sys
import threading
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gen_scale import llama_tensors  # noqa: E402

DTYPE = torch.bfloat16


def shapes(a):
    return llama_tensors(a.layers, a.hidden, a.ffn, a.kv_heads, a.head_dim, a.vocab)


def tensors(a):
    """The checkpoint's tensors, in full: name -> tensor (the originals)."""
    out = {}
    for k, (name, shape) in enumerate(shapes(a)):
        g = torch.Generator().manual_seed(k)
        out[name] = (torch.randn(shape, generator=g) * 0.02).to(DTYPE)
    return out


def threaded_save(out, ranks, state_of, storage_writer=None):
    """dcp.save by ranks threads on torch's threaded process group, rank r
    saving state_of(r, mesh); storage_writer(out), if given, is each
    rank's writer (else dcp.save's FileSystemWriter)."""
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    from torch.distributed.device_mesh import init_device_mesh
    from torch.testing._internal.distributed.multi_threaded_pg import (ProcessLocalGroup, _install_threaded_pg,
                                                                        _uninstall_threaded_pg)

    errors = []

    def rank_main(rank, store):
        try:
            dist.init_process_group("threaded", rank=rank, world_size=ranks, store=store)
            try:
                state = state_of(rank, init_device_mesh("cpu", (ranks,)))
                if storage_writer:
                    dcp.save(state, storage_writer=storage_writer(out))
                else:
                    dcp.save(state, checkpoint_id=out)
            finally:
                dist.destroy_process_group()
        except BaseException as e:  # noqa: BLE001 (reported by the main thread)
            errors.append((rank, repr(e)))
            ProcessLocalGroup.exception_handle(e)  # wake the other ranks

    torch._C._distributed_c10d._set_thread_isolation_mode(True)
    _install_threaded_pg()
    try:
        store = dist.HashStore()
        threads = [threading.Thread(target=rank_main, args=(r, store)) for r in range(ranks)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        _uninstall_threaded_pg()
        torch._C._distributed_c10d._set_thread_isolation_mode(False)
    if errors:
        raise SystemExit(f"dcp.save failed on {len(errors)} ranks, first: rank {errors[0][0]}: {errors[0][1]}")


def shard0(t, rank, ranks, mesh):
    """Rank's piece of t as FSDP2 holds it: a DTensor of Shard(0), its
    rows torch.chunk's (none past the last chunk)."""
    from torch.distributed.tensor import DTensor, Shard

    parts = t.chunk(ranks)
    local = parts[rank] if rank < len(parts) else t[t.shape[0]:]
    if local.device.type != "meta":
        local = local.clone()
    return DTensor.from_local(local, mesh, [Shard(0)], run_check=False, shape=t.shape, stride=t.stride())


def save(out, full, ranks):
    """dcp.save of full's tensors sharded on dim 0 over ranks threads."""
    threaded_save(out, ranks, lambda rank, mesh: {name: shard0(t, rank, ranks, mesh) for name, t in full.items()})


def args(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--ranks", type=int, default=256)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--hidden", type=int, default=512)
    ap.add_argument("--ffn", type=int, default=1408)
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--kv-heads", type=int, default=2)
    ap.add_argument("--vocab", type=int, default=8000)
    a = ap.parse_args(argv)
    a.head_dim = a.hidden // a.heads
    return a


def config(a):
    """config.json of the model (what a view's from_pretrained reads)."""
    return dict(architectures=["LlamaForCausalLM"], model_type="llama", vocab_size=a.vocab, hidden_size=a.hidden,
                intermediate_size=a.ffn, num_hidden_layers=a.layers, num_attention_heads=a.heads,
                num_key_value_heads=a.kv_heads, max_position_embeddings=256, rms_norm_eps=1e-5,
                tie_word_embeddings=False, torch_dtype="bfloat16")


def main():
    a = args()
    t0 = time.time()
    os.makedirs(a.out, exist_ok=True)
    full = tensors(a)
    save(a.out, full, a.ranks)
    with open(os.path.join(a.out, "config.json"), "w") as f:
        json.dump(config(a), f, indent=1)
    nbytes = sum(t.numel() * t.element_size() for t in full.values())
    print(f"{a.out}: {len(full)} tensors, {nbytes} bytes, {a.ranks} ranks, {time.time() - t0:.1f}s")


if __name__ == "__main__":
    main()
