"""Write a Megatron-LM legacy checkpoint (--ckpt-format torch) of a Llama
saved from TP x PP ranks, for timing how ckptfs opens many rank files:
iter_0000001/mp_rank_TT_PPP/model_optim_rng.pt per rank, each a torch.save
of the dict Megatron-LM's save_checkpoint writes with --no-save-optim
(generate_state_dict: args, checkpoint_version 3.0, iteration, model,
rng_state, num_floating_point_operations_so_far; as
e2e/fixtures/gen_legacy.py writes it from a real megatron-core model), and
latest_checkpointed_iteration.txt. 'model' is what a megatron-core
GPTModel with the local spec returns from state_dict_for_save_checkpoint on
that rank: the stage's layers numbered from 0, each linear's TP slice
(column-parallel linear_qkv and linear_fc1 on dim 0, row-parallel
linear_proj and linear_fc2 on dim 1) and its _extra_state (None), the
embedding's vocabulary slice on the first stage, the final norm and the
output layer's slice on the last.

The layout is the scale's (TP 8 x PP 16 = 128 files, 128 layers: 8 per
stage, as a 405B-class run); the widths are small (hidden 256 by default),
so the files hold real, deterministic bf16 values and a few MB each: what
an open costs here is the files, their pickles and the tensors' count, not
their bytes.

    python e2e/bench/gen_megatron_legacy_scale.py OUT [--tp 8 --pp 16 --layers 128 --hidden 256 ...]
"""

import argparse
import os
import random
import time

import numpy as np
import torch

ITERATION = 1


def args_namespace(a, vocab_padded):
    """The hyper-parameters Megatron-LM keeps in args (e2e/fixtures/gen_megatron_gpt.py's names)."""
    return argparse.Namespace(
        num_layers=a.layers, hidden_size=a.hidden, ffn_hidden_size=a.ffn, num_attention_heads=a.heads,
        group_query_attention=a.groups != a.heads, num_query_groups=a.groups, kv_channels=a.hidden // a.heads,
        max_position_embeddings=8192, seq_length=8192, position_embedding_type="rope", rotary_base=500000,
        rotary_percent=1.0, rotary_interleaved=False, use_rope_scaling=False, normalization="RMSNorm",
        norm_epsilon=1e-5, swiglu=True, add_bias_linear=False, add_qkv_bias=False, qk_layernorm=False,
        untie_embeddings_and_output_weights=True, padded_vocab_size=vocab_padded, make_vocab_size_divisible_by=128,
        vocab_size=a.vocab, tokenizer_type="NullTokenizer", transformer_impl="local", hidden_dropout=0.0,
        attention_dropout=0.0, init_method_std=0.02, params_dtype=torch.bfloat16, fp16=False, bf16=True,
        tensor_model_parallel_size=a.tp, pipeline_model_parallel_size=a.pp,
        virtual_pipeline_model_parallel_size=None, sequence_parallel=True, context_parallel_size=1,
        expert_model_parallel_size=1, num_experts=None, world_size=a.tp * a.pp * a.dp, data_parallel_size=a.dp,
        use_distributed_optimizer=True, ckpt_format="torch", use_dist_ckpt=False, no_save_optim=True,
        no_save_rng=False, optimizer="adam", lr=3e-4, weight_decay=0.1, adam_beta1=0.9, adam_beta2=0.95,
        adam_eps=1e-8, clip_grad=1.0, iteration=ITERATION, train_iters=ITERATION,
        consumed_train_samples=ITERATION * 1024, global_batch_size=1024, micro_batch_size=1, save="ckpt", load=None)


def local_shapes(a, vocab_padded):
    """(name, shape) of one rank's local tensors in a stage of L layers
    (names from 0), without the embedding and output layer."""
    d = a.hidden // a.heads
    qkv = (a.heads + 2 * a.groups) * d // a.tp
    per = a.layers // a.pp
    out = []
    for i in range(per):
        p = f"decoder.layers.{i}."
        out += [(p + "input_layernorm.weight", (a.hidden,)),
                (p + "self_attention.linear_qkv.weight", (qkv, a.hidden)),
                (p + "self_attention.linear_qkv._extra_state", None),
                (p + "self_attention.linear_proj.weight", (a.hidden, a.heads * d // a.tp)),
                (p + "self_attention.linear_proj._extra_state", None),
                (p + "pre_mlp_layernorm.weight", (a.hidden,)),
                (p + "mlp.linear_fc1.weight", (2 * a.ffn // a.tp, a.hidden)),
                (p + "mlp.linear_fc1._extra_state", None),
                (p + "mlp.linear_fc2.weight", (a.hidden, a.ffn // a.tp)),
                (p + "mlp.linear_fc2._extra_state", None)]
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    for k, v in dict(tp=8, pp=16, dp=4, layers=128, hidden=256, heads=32, groups=8, ffn=512, vocab=128256).items():
        ap.add_argument("--" + k, type=int, default=v)
    a = ap.parse_args()
    assert a.layers % a.pp == 0 and a.heads % a.tp == 0 and a.groups % a.tp == 0 and a.ffn % a.tp == 0
    t0 = time.time()
    div = 128 * a.tp
    vocab_padded = -(-a.vocab // div) * div
    args = args_namespace(a, vocab_padded)
    gen = torch.Generator().manual_seed(1234)
    it = os.path.join(a.out, f"iter_{ITERATION:07d}")
    total = 0
    for pp in range(a.pp):
        for tp in range(a.tp):
            shapes = local_shapes(a, vocab_padded)
            if pp == 0:
                shapes = [("embedding.word_embeddings.weight", (vocab_padded // a.tp, a.hidden))] + shapes
            if pp == a.pp - 1:
                shapes += [("decoder.final_layernorm.weight", (a.hidden,)),
                           ("output_layer.weight", (vocab_padded // a.tp, a.hidden))]
            model = {n: None if s is None else torch.randn(s, generator=gen).to(torch.bfloat16) for n, s in shapes}
            random.seed(1234 + 100 * pp)
            np.random.seed(1234 + 100 * pp)
            rng = {"random_rng_state": random.getstate(), "np_rng_state": np.random.get_state(),
                   "torch_rng_state": torch.get_rng_state(), "rng_tracker_states": {}}
            state = {"args": args, "checkpoint_version": 3.0, "iteration": ITERATION, "model": model,
                     "rng_state": [rng], "num_floating_point_operations_so_far": 0}
            path = os.path.join(it, f"mp_rank_{tp:02d}_{pp:03d}", "model_optim_rng.pt")
            os.makedirs(os.path.dirname(path), exist_ok=True)
            torch.save(state, path)
            total += os.path.getsize(path)
    with open(os.path.join(a.out, "latest_checkpointed_iteration.txt"), "w") as f:
        f.write(str(ITERATION))
    print(f"{a.out}: TP {a.tp} x PP {a.pp}, {a.layers} layers, {a.tp * a.pp} files, {total} bytes, "
          f"{time.time() - t0:.1f}s")


if __name__ == "__main__":
    main()
