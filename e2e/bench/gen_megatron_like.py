"""Write a large checkpoint laid out as Megatron-Core's torch_dist saves a
GPT model, for timing a mapped view (layers stacked on a leading axis,
Q/K/V fused per query group, [gate; up] fused, tensor-parallel shards on 2
gloo ranks), with metadata.json and a common.pt holding the argparse
arguments Megatron-LM's trainer stores, so the megatron-gpt mapping and a
generated config.json apply. The tensors are written by torch's dcp.save;
their values are random (only the layout matters here).

    python e2e/bench/gen_megatron_like.py OUT [--gib 2]"""

import argparse
import json
import os
import sys

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import models  # noqa: E402  (e2e/models.py: the gloo rendezvous)

H, HEADS, GROUPS, FFN, VOCAB = 2048, 16, 4, 5632, 32000


def shapes(layers):
    hd = H // HEADS
    qkv = (HEADS + 2 * GROUPS) * hd
    return {
        "embedding.word_embeddings.weight": ([VOCAB, H], 0),
        "decoder.layers.self_attention.linear_qkv.layer_norm_weight": ([layers, H], None),
        "decoder.layers.self_attention.linear_qkv.weight": ([layers, qkv, H], 1),
        "decoder.layers.self_attention.linear_proj.weight": ([layers, H, HEADS * hd], 2),
        "decoder.layers.mlp.linear_fc1.layer_norm_weight": ([layers, H], None),
        "decoder.layers.mlp.linear_fc1.weight": ([layers, 2 * FFN, H], 1),
        "decoder.layers.mlp.linear_fc2.weight": ([layers, H, FFN], 2),
        "decoder.final_layernorm.weight": ([H], None),
        "output_layer.weight": ([VOCAB, H], 0),
    }


def worker(rank, world, init_method, out, layers):
    models.join(rank, world, init_method)
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Replicate, Shard

    mesh = init_device_mesh("cpu", (world,))
    g = torch.Generator().manual_seed(rank)
    state = {}
    for name, (shape, dim) in shapes(layers).items():
        local = list(shape)
        if dim is not None:
            local[dim] //= world
        t = (torch.rand(local, generator=g) - 0.5) * 0.05
        placement = [Replicate()] if dim is None else [Shard(dim)]
        full = torch.empty(shape, device="meta")
        state[name] = DTensor.from_local(t, mesh, placement, run_check=False, shape=full.shape, stride=full.stride())
    dcp.save(state, checkpoint_id=out)
    dist.barrier()
    if rank == 0:
        import argparse as ap

        args = ap.Namespace(num_layers=layers, hidden_size=H, ffn_hidden_size=FFN, num_attention_heads=HEADS,
                            num_query_groups=GROUPS, group_query_attention=True, kv_channels=H // HEADS,
                            padded_vocab_size=VOCAB, vocab_size=VOCAB, max_position_embeddings=4096,
                            normalization="RMSNorm", norm_epsilon=1e-5, swiglu=True, add_qkv_bias=False,
                            add_bias_linear=False, untie_embeddings_and_output_weights=True, rotary_base=10000,
                            position_embedding_type="rope", tensor_model_parallel_size=world)
        torch.save({"args": args, "iteration": 1, "checkpoint_version": 3.0}, os.path.join(out, "common.pt"))
        with open(os.path.join(out, "metadata.json"), "w") as f:
            json.dump({"sharded_backend": "torch_dist", "sharded_backend_version": 1}, f)
    models.leave()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--gib", type=float, default=2)
    ap.add_argument("--world", type=int, default=2)
    a = ap.parse_args()
    per_layer = sum(torch.Size(s).numel() for n, (s, _) in shapes(1).items() if "layers" in n) * 4
    fixed = 2 * VOCAB * H * 4
    layers = max(1, int((a.gib * 2**30 - fixed) // per_layer))
    models.spawn(worker, a.world, a.out, layers)


if __name__ == "__main__":
    main()
