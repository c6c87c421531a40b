"""Write a Megatron-Core torch_dist checkpoint of a large MoE saved from W
ranks (metadata.json, common.pt with the trainer's args, .metadata built
with torch's own DCP metadata classes as gen_scale.py builds it, sparse
__<rank>_0.distcp files: no tensor data), for timing how ckptfs opens it.

Qwen3-235B-A22B-shaped by default (94 layers, hidden 4096, 64 query heads,
4 query groups, head dim 128, QK norms, 128 experts of ffn 1536, top 8,
vocab 151936, bf16), laid out as torch_dist stacks it: layers on a leading
axis, the experts of a layer on the next (decoder.layers.mlp.experts.experts.
linear_fc1.weight is [L, E, 2·ffn, H]). W = 1024 is TP 4 × PP 16 × DP 16
with EP 16 (expert TP 1): a dense chunk is [layers of a stage, 1/TP of the
TP dim, ...], an expert chunk [layers of a stage, E/EP experts, ...], each
written by one rank of its DP group (spread as Megatron's fully parallel
save spreads them). With --optim, the distributed optimizer's fp32_param,
exp_avg and exp_avg_sq of every parameter under optimizer.state.<name>.<key>,
each model chunk split further over DP on its first split-free dimension
(an approximation of its model-space sharding: the count and sizes of
chunks are what matter here).

    python e2e/bench/gen_megatron_moe_scale.py OUT [--tp 4 --pp 16 --dp 16 --ep 16] [--optim]
"""

import argparse
import argparse as _ap
import itertools
import json
import os
import pickle
import time

import torch
from torch.distributed.checkpoint.metadata import (ChunkStorageMetadata, Metadata, TensorProperties,
                                                   TensorStorageMetadata)

from gen_scale import Writer, numel


def tensors(a):
    """key -> (shape, dtype, split): split maps a dim to the mesh axis it is
    split over ("pp" for the layer axis, "tp", "ep")."""
    L, H, E, F, V = a.layers, a.hidden, a.experts, a.moe_ffn, a.vocab
    qkv = (a.heads + 2 * a.groups) * a.head_dim
    return {
        "embedding.word_embeddings.weight": ([V, H], {0: "tp"}),
        "decoder.layers.self_attention.linear_qkv.layer_norm_weight": ([L, H], {0: "pp"}),
        "decoder.layers.self_attention.linear_qkv.weight": ([L, qkv, H], {0: "pp", 1: "tp"}),
        "decoder.layers.self_attention.q_layernorm.weight": ([L, a.head_dim], {0: "pp"}),
        "decoder.layers.self_attention.k_layernorm.weight": ([L, a.head_dim], {0: "pp"}),
        "decoder.layers.self_attention.linear_proj.weight": ([L, H, a.heads * a.head_dim], {0: "pp", 2: "tp"}),
        "decoder.layers.pre_mlp_layernorm.weight": ([L, H], {0: "pp"}),
        "decoder.layers.mlp.router.weight": ([L, E, H], {0: "pp"}),
        "decoder.layers.mlp.experts.experts.linear_fc1.weight": ([L, E, 2 * F, H], {0: "pp", 1: "ep"}),
        "decoder.layers.mlp.experts.experts.linear_fc2.weight": ([L, E, H, F], {0: "pp", 1: "ep"}),
        "decoder.final_layernorm.weight": ([H], {}),
        "output_layer.weight": ([V, H], {0: "tp"}),
    }


def ranges(n, parts):
    """(start, size) of n split into parts as Megatron splits (ceil, the last short)."""
    per = -(-n // parts)
    return [(min(i * per, n), max(0, min(per, n - i * per))) for i in range(parts)]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    for k, v in dict(tp=4, pp=16, dp=16, ep=16, layers=94, hidden=4096, heads=64, groups=4, head_dim=128,
                     experts=128, moe_ffn=1536, topk=8, vocab=151936).items():
        ap.add_argument("--" + k.replace("_", "-"), type=int, default=v)
    ap.add_argument("--optim", action="store_true")
    a = ap.parse_args()
    t0 = time.time()
    os.makedirs(a.out, exist_ok=True)
    world = a.tp * a.pp * a.dp
    w = Writer(world)
    axes = {"tp": a.tp, "pp": a.pp, "ep": a.ep}

    def rank(pp, dp, tp):
        return (pp * a.dp + dp) * a.tp + tp

    def add(key, shape, dtype, esize, split, extra_dp, salt):
        dims = sorted(split)
        chunks = []
        for idx in itertools.product(*(range(axes[split[d]]) for d in dims)):
            at = dict(zip((split[d] for d in dims), idx))
            off, size = [0] * len(shape), list(shape)
            for d, i in zip(dims, idx):
                off[d], size[d] = ranges(shape[d], axes[split[d]])[i]
            pp, tp = at.get("pp", 0), at.get("tp", salt % a.tp)
            if "ep" in at:
                dps = [at["ep"] * a.dp // a.ep]
            else:
                dps = [salt % a.dp]
            pieces = [(off, size, dps[0])]
            if extra_dp:  # split further over DP on the first dimension not split yet
                free = next((d for d in range(len(shape)) if d not in split), None)
                if free is not None:
                    pieces = []
                    for j, (s, n) in enumerate(ranges(size[free], a.dp)):
                        o2, z2 = list(off), list(size)
                        o2[free], z2[free] = off[free] + s, n
                        pieces.append((o2, z2, j))
            for o, z, dp in pieces:
                if numel(z) == 0:
                    continue
                chunks.append(ChunkStorageMetadata(offsets=torch.Size(o), sizes=torch.Size(z)))
                w.put(rank(pp, dp, tp), key, o, numel(z) * esize)
        w.sdm[key] = TensorStorageMetadata(TensorProperties(dtype=dtype), torch.Size(shape), chunks)
        w.planner[key] = (key,)

    ts = tensors(a)
    for salt, (key, (shape, split)) in enumerate(ts.items()):
        add(key, shape, torch.bfloat16, 2, split, False, salt)
    if a.optim:
        for salt, (key, (shape, split)) in enumerate(ts.items()):
            for st in ("fp32_param", "exp_avg", "exp_avg_sq"):
                add(f"optimizer.state.{st}.{key}", shape, torch.float32, 4, split, True, salt)
    md = Metadata(state_dict_metadata=w.sdm, planner_data=w.planner, storage_data=w.storage)
    for r in range(world):
        with open(os.path.join(a.out, w.paths[r]), "wb") as f:
            f.truncate(w.sizes[r])
    with open(os.path.join(a.out, ".metadata"), "wb") as f:
        pickle.dump(md, f)
    args = _ap.Namespace(num_layers=a.layers, hidden_size=a.hidden, ffn_hidden_size=a.moe_ffn * 8,
                         num_attention_heads=a.heads, num_query_groups=a.groups, group_query_attention=True,
                         kv_channels=a.head_dim, padded_vocab_size=a.vocab, vocab_size=a.vocab,
                         max_position_embeddings=40960, normalization="RMSNorm", norm_epsilon=1e-6, swiglu=True,
                         add_qkv_bias=False, add_bias_linear=False, untie_embeddings_and_output_weights=True,
                         rotary_base=1000000, position_embedding_type="rope", qk_layernorm=True, bf16=True,
                         num_experts=a.experts, moe_router_topk=a.topk, moe_ffn_hidden_size=a.moe_ffn,
                         moe_router_score_function="softmax", moe_router_pre_softmax=False,
                         tensor_model_parallel_size=a.tp, pipeline_model_parallel_size=a.pp,
                         expert_model_parallel_size=a.ep, data_parallel_size=a.dp, world_size=world)
    torch.save({"args": args, "iteration": 1, "checkpoint_version": 3.0}, os.path.join(a.out, "common.pt"))
    with open(os.path.join(a.out, "metadata.json"), "w") as f:
        json.dump({"sharded_backend": "torch_dist", "sharded_backend_version": 1}, f)
    chunks = sum(len(t.chunks) for t in w.sdm.values())
    print(f"{a.out}: {len(w.sdm)} tensors, {chunks} chunks, {world} ranks, .metadata "
          f"{os.path.getsize(os.path.join(a.out, '.metadata'))} bytes, {time.time() - t0:.1f}s")


if __name__ == "__main__":
    main()
