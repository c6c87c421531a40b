package view

import (
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ckptfs/ckptfs/layout"
	"github.com/ckptfs/ckptfs/layout/mapping"
)

func sourcesNamed(names ...string) []mapping.Source {
	out := make([]mapping.Source, len(names))
	for i, n := range names {
		out[i] = mapping.Source{Name: n}
	}
	return out
}

func TestUnmappedWarning(t *testing.T) {
	for _, tc := range []struct {
		name  string
		keys  []string
		want  []string // substrings
		empty bool
	}{
		{name: "Megatron MoE: experts instead of linear_fc1",
			keys: []string{"embedding.word_embeddings.weight", "decoder.final_layernorm.weight",
				"decoder.layers.self_attention.linear_qkv.weight", "decoder.layers.self_attention.linear_qkv.layer_norm_weight",
				"decoder.layers.self_attention.linear_proj.weight", "decoder.layers.pre_mlp_layernorm.weight",
				"decoder.layers.mlp.router.weight", "decoder.layers.mlp.experts.experts.linear_fc1.weight",
				"decoder.layers.mlp.experts.experts.linear_fc2.weight"},
			want: []string{"keys look like Megatron-Core's",
				"no megatron-gpt rule covers 3 keys: decoder.layers.mlp.router.weight, decoder.layers.mlp.experts.experts.linear_fc1.weight, decoder.layers.mlp.experts.experts.linear_fc2.weight",
				"megatron-gpt needs decoder.layers.mlp.linear_fc1.weight, decoder.layers.mlp.linear_fc2.weight"}},
		{name: "torchtitan MoE",
			keys: []string{"tok_embeddings.weight", "norm.weight", "output.weight",
				"layers.0.attention.wq.weight", "layers.0.attention.wk.weight", "layers.0.attention.wv.weight",
				"layers.0.attention.wo.weight", "layers.0.attention_norm.weight", "layers.0.ffn_norm.weight",
				"layers.0.moe.router.gate.weight", "layers.0.moe.experts.w1", "layers.0.moe.experts.w2", "layers.0.moe.experts.w3"},
			want: []string{"keys look like torchtitan's", "no torchtitan-llama rule covers 4 keys: layers.0.moe.router.gate.weight",
				"torchtitan-llama needs layers.{l}.feed_forward.w1.weight"}},
		{name: "not a framework's keys", keys: []string{"fc1.weight", "layers.0.weight", "model.decoder.x"}, empty: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w := unmappedWarning(sourcesNamed(tc.keys...))
			if tc.empty {
				assert.Empty(t, w)
				return
			}
			assert.True(t, strings.HasPrefix(w, unmappedPrefix), w)
			assert.NotContains(t, w, "\n", "one line")
			for _, s := range tc.want {
				assert.Contains(t, w, s)
			}
		})
	}
	many := make([]string, 20)
	for i := range many {
		many[i] = "decoder.x" + strings.Repeat("y", i)
	}
	assert.Contains(t, unmappedWarning(sourcesNamed(many...)), "and 12 more")
}

// A Megatron checkpoint no built-in mapping covers (testdata/megatron: an
// MLP without attention) is not shown silently: one warning (what inspect
// prints and the mount logs) naming what the mapping lacks, and the same
// text as CKPTFS_INFO.txt in the view. --map none asked for saved names:
// nothing to say.
func TestUnmappedFrameworkNote(t *testing.T) {
	dir := filepath.Join("..", "..", "testdata", "megatron", "ckpt")
	c, err := layout.Open(dir)
	require.NoError(t, err)
	v, err := Plan(c, Options{})
	require.NoError(t, err)
	defer v.Close()
	var notes []string
	for _, w := range v.Warnings {
		if strings.HasPrefix(w, unmappedPrefix) {
			notes = append(notes, w)
		}
	}
	require.Len(t, notes, 1, "%q", v.Warnings)
	assert.Contains(t, notes[0], "megatron-gpt needs decoder.layers.self_attention.linear_qkv.weight")
	assert.Equal(t, v.Warnings, NewReport(c, v).Warnings)
	f := v.Lookup(InfoName)
	require.NotNil(t, f, "the view carries the note")
	b := make([]byte, f.Size)
	_, err = f.ReadAt(b, 0)
	require.NoError(t, err)
	assert.Equal(t, notes[0]+"\n", string(b))

	c2, err := layout.Open(dir)
	require.NoError(t, err)
	v2, err := Plan(c2, Options{NoMapping: true})
	require.NoError(t, err)
	defer v2.Close()
	assert.Nil(t, v2.Lookup(InfoName))
	for _, w := range v2.Warnings {
		assert.NotContains(t, w, unmappedPrefix)
	}
}
