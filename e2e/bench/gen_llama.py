"""Write a multi-GB Llama-style checkpoint the way FSDP2 saves it (each
rank its Shard(0) pieces), plus config.json, for the from_pretrained benchmark:
as torch DCP (`dcp.save`), or as HF-sharded safetensors (torch's
HuggingFaceStorageWriter(save_distributed=True), what torch's
consolidate_safetensors_files takes). The same seed gives the same tensors.

    python e2e/bench/gen_llama.py OUT [--world 4] [--layers 8] [--format dcp|hf]
    python e2e/bench/gen_llama.py OUT --preset llama3-8b --world 8     (bf16, Llama 3 shapes)
    python e2e/bench/gen_llama.py OUT --names torchtitan   (torchtitan's names: a view RoPE-permutes q/k)

The model is built on the meta device for names and shapes only; every rank
fills just its own shards, so no process ever holds the whole model."""

import argparse
import os
import sys

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import models  # noqa: E402  (e2e/models.py: the gloo rendezvous)


# Llama 3 shapes in bf16 (16 GB and 7.2 GB), for the large-model section of bench.py.
PRESETS = {
    "llama3-8b": dict(vocab_size=128256, hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
                      num_attention_heads=32, num_key_value_heads=8),
    "llama3-3b": dict(vocab_size=128256, hidden_size=3072, intermediate_size=8192, num_hidden_layers=28,
                      num_attention_heads=24, num_key_value_heads=8),
    "tiny": dict(vocab_size=1024, hidden_size=256, intermediate_size=512, num_hidden_layers=2,
                 num_attention_heads=4, num_key_value_heads=2),  # to try the section out
}


def config(layers, preset=None):
    from transformers import LlamaConfig

    if preset:
        return LlamaConfig(**PRESETS[preset], max_position_embeddings=512, tie_word_embeddings=False,
                           torch_dtype="bfloat16")
    return LlamaConfig(vocab_size=32000, hidden_size=2048, intermediate_size=5632, num_hidden_layers=layers,
                       num_attention_heads=16, num_key_value_heads=16, max_position_embeddings=512,
                       tie_word_embeddings=False, torch_dtype="float32")


# HF names as torchtitan's Llama saves them (its state dict adapter's
# from_hf); the bytes stay as they are, so a view of them through the
# torchtitan-llama mapping permutes q/k rows (what the bench measures).
TITAN = [("model.embed_tokens.", "tok_embeddings."), ("model.norm.", "norm."), ("lm_head.", "output."),
         ("model.layers.", "layers."), ("self_attn.q_proj.", "attention.wq."), ("self_attn.k_proj.", "attention.wk."),
         ("self_attn.v_proj.", "attention.wv."), ("self_attn.o_proj.", "attention.wo."),
         ("input_layernorm.", "attention_norm."), ("post_attention_layernorm.", "ffn_norm."),
         ("mlp.gate_proj.", "feed_forward.w1."), ("mlp.up_proj.", "feed_forward.w3."),
         ("mlp.down_proj.", "feed_forward.w2.")]


def titan_name(name):
    for hf, tt in TITAN:
        name = name.replace(hf, tt)
    return name


def worker(rank, world, init_method, out, layers, fmt, preset, names):
    torch.set_num_threads(max(1, (os.cpu_count() or 2) // world))
    models.join(rank, world, init_method)
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Shard
    from transformers import LlamaForCausalLM

    mesh = init_device_mesh("cpu", (world,))
    with torch.device("meta"):
        model = LlamaForCausalLM(config(layers, preset))
    g = torch.Generator().manual_seed(rank)
    state = {}
    for name, p in model.state_dict().items():
        rows = p.shape[0]
        per = -(-rows // world)  # torch.chunk: ceil division
        lo, hi = min(rank * per, rows), min((rank + 1) * per, rows)
        local = (torch.rand((hi - lo, *p.shape[1:]), generator=g) - 0.5) * 0.05
        if preset:
            local = local.to(torch.bfloat16)
        if names == "torchtitan":
            name = titan_name(name)
        state[name] = DTensor.from_local(local, mesh, [Shard(0)], run_check=False, shape=p.shape, stride=p.stride())
    if fmt == "hf":
        from torch.distributed.checkpoint import HuggingFaceStorageWriter

        dcp.save(state, storage_writer=HuggingFaceStorageWriter(
            out, save_distributed=True, fqn_to_index_mapping={k: 1 for k in state}))
    else:
        dcp.save(state, checkpoint_id=out)
    dist.barrier()
    if rank == 0:
        config(layers, preset).save_pretrained(out)
    models.leave()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--world", type=int, default=4)
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--format", choices=["dcp", "hf"], default="dcp")
    ap.add_argument("--preset", choices=sorted(PRESETS), help="Llama 3 shapes in bf16 (--layers is ignored)")
    ap.add_argument("--names", choices=["hf", "torchtitan"], default="hf")
    a = ap.parse_args()
    models.spawn(worker, a.world, a.out, a.layers, a.format, a.preset, a.names)


if __name__ == "__main__":
    main()
