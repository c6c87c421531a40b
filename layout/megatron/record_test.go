package megatron

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ckptfs/ckptfs/layout/ckpt"
	"github.com/ckptfs/ckptfs/layout/mapping"
)

// target is what the built-in mapping of that name makes.
func target(name string) ckpt.HFTarget {
	s := mapping.ByName(name)
	return ckpt.HFTarget{Mapping: s.Name, MoE: s.MoE}
}

// The arguments of a Megatron-Core MoE model make the HF config.json of the
// mapping that shows it, and what HF cannot express is refused.
func TestArgsHFConfigMoE(t *testing.T) {
	args := Args{"swiglu": true, "normalization": "RMSNorm", "position_embedding_type": "rope",
		"num_attention_heads": int64(2), "hidden_size": int64(4), "num_layers": int64(2), "ffn_hidden_size": int64(6),
		"kv_channels": int64(2), "vocab_size": int64(8), "num_experts": int64(3), "moe_router_topk": int64(2), "moe_ffn_hidden_size": int64(3)}
	b, err := args.HFConfig(target("megatron-mixtral"))
	require.NoError(t, err)
	assert.Contains(t, string(b), `"MixtralForCausalLM"`)
	assert.Contains(t, string(b), `"num_local_experts": 3`)
	assert.Contains(t, string(b), `"intermediate_size": 3`)
	assert.Contains(t, string(b), `"vocab_size": 8`)
	// The family comes from the mapping, not from its name.
	b, err = args.HFConfig(ckpt.HFTarget{Mapping: "my-map", MoE: ckpt.MoEMixtral})
	require.NoError(t, err)
	assert.Contains(t, string(b), `"MixtralForCausalLM"`)
	_, err = args.HFConfig(target("megatron-gpt"))
	assert.EqualError(t, err, "the megatron-gpt mapping makes no MoE model")
	args["qk_layernorm"] = true
	b, err = args.HFConfig(target("megatron-qwen-moe"))
	require.NoError(t, err)
	assert.Contains(t, string(b), `"Qwen3MoeForCausalLM"`)
	assert.Contains(t, string(b), `"norm_topk_prob": true`)
	args["moe_router_score_function"] = "sigmoid"
	_, err = args.HFConfig(target("megatron-qwen-moe"))
	assert.ErrorContains(t, err, "scores by sigmoid")
}

// The sizes a mapping needs, read from the arguments: GQA, head_dim from
// hidden ÷ heads, tied embeddings unless untied, and a padded vocabulary
// used (and said so) when the tokenizer's size is not recorded.
func TestArgsParams(t *testing.T) {
	p, tied, notes := Args{"num_attention_heads": int64(4), "hidden_size": int64(64), "num_layers": int64(2),
		"group_query_attention": true, "num_query_groups": int64(2), "padded_vocab_size": int64(128)}.Params()
	assert.Equal(t, map[string]int64{"heads": 4, "kv_heads": 2, "hidden": 64, "head_dim": 16, "layers": 2, "vocab": 128}, p)
	assert.True(t, tied)
	require.Len(t, notes, 1)
	assert.Contains(t, notes[0], "128 rows Megatron padded it to")

	p, tied, notes = Args{"num_attention_heads": int64(4), "hidden_size": int64(64), "vocab_size": int64(100),
		"untie_embeddings_and_output_weights": true}.Params()
	assert.Equal(t, int64(4), p["kv_heads"], "no GQA: a KV head per head")
	assert.Equal(t, int64(100), p["vocab"])
	assert.False(t, tied)
	assert.Empty(t, notes)
}
