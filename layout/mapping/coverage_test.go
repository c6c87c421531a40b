package mapping

import (
	"testing"

	"github.com/stretchr/testify/assert"
)

func sources(names ...string) []Source {
	out := make([]Source, len(names))
	for i, n := range names {
		out[i] = Source{Name: n}
	}
	return out
}

// Coverage matches names as applying a spec does: Megatron's singleton
// expert keys (one tensor per expert, "{e}" in the name) are covered.
func TestCoverageMatchesEveryIndex(t *testing.T) {
	uncovered, missing := ByName("megatron-mixtral").Coverage(sources(
		"embedding.word_embeddings.weight", "decoder.final_layernorm.weight", "output_layer.weight",
		"decoder.layers.self_attention.linear_qkv.weight", "decoder.layers.self_attention.linear_qkv.layer_norm_weight",
		"decoder.layers.self_attention.linear_proj.weight", "decoder.layers.pre_mlp_layernorm.weight",
		"decoder.layers.mlp.router.weight",
		"decoder.layers.mlp.experts.0.linear_fc1.weight", "decoder.layers.mlp.experts.1.linear_fc1.weight",
		"decoder.layers.mlp.experts.0.linear_fc2.weight", "decoder.layers.mlp.experts.1.linear_fc2.weight",
		"decoder.layers.mlp.experts.01.linear_fc2.weight", // not an index: a leading zero
		"decoder.layers.extra.weight"))
	assert.Equal(t, []string{"decoder.layers.mlp.experts.01.linear_fc2.weight", "decoder.layers.extra.weight"}, uncovered)
	assert.Empty(t, missing)

	_, missing = ByName("megatron-mixtral").Coverage(sources("decoder.final_layernorm.weight"))
	assert.Contains(t, missing, "decoder.layers.mlp.router.weight")
}

func TestFrameworkOf(t *testing.T) {
	assert.Equal(t, "Megatron-Core", FrameworkOf(sources("x", "decoder.layers.mlp.router.weight")).Name)
	assert.Equal(t, "torchtitan", FrameworkOf(sources("layers.3.attention.wq.weight")).Name)
	assert.Nil(t, FrameworkOf(sources("model.layers.0.self_attn.q_proj.weight")))
}
