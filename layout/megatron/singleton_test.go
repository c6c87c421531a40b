package megatron

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ckptfs/ckptfs/layout/ckpt"
	"github.com/ckptfs/ckptfs/safetensors"
)

type zeros struct{}

func (zeros) ReadAt(p []byte, off int64) (int, error) { clear(p); return len(p), nil }
func (zeros) String() string                          { return "zeros" }

func whole(name string, shape ...int64) *ckpt.Tensor {
	return &ckpt.Tensor{Name: name, DType: safetensors.F32, Shape: shape,
		Chunks: ckpt.MakeChunks(ckpt.Chunk{Offsets: make([]int64, len(shape)), Sizes: shape, Source: zeros{}})}
}

// Per-layer and per-expert keys become the stacked tensors of the default
// save; _w and _v become one [gate; up]; a key missing from the grid, or a
// half without its other half, is an error naming it.
func TestStackSingletons(t *testing.T) {
	c := &ckpt.Checkpoint{Dir: "d", Tensors: []*ckpt.Tensor{
		whole("embedding.word_embeddings.weight", 8, 4),
		whole("decoder.layers.0.mlp.experts.experts.0.linear_fc1.weight_w", 3, 4),
		whole("decoder.layers.0.mlp.experts.experts.0.linear_fc1.weight_v", 3, 4),
		whole("decoder.layers.0.mlp.experts.experts.1.linear_fc1.weight_w", 3, 4),
		whole("decoder.layers.0.mlp.experts.experts.1.linear_fc1.weight_v", 3, 4),
		whole("decoder.layers.1.mlp.experts.experts.0.linear_fc1.weight_w", 3, 4),
		whole("decoder.layers.1.mlp.experts.experts.0.linear_fc1.weight_v", 3, 4),
		whole("decoder.layers.1.mlp.experts.experts.1.linear_fc1.weight_w", 3, 4),
		whole("decoder.layers.1.mlp.experts.experts.1.linear_fc1.weight_v", 3, 4),
		whole("decoder.layers.0.self_attention.linear_proj.weight", 4, 4),
		whole("decoder.layers.1.self_attention.linear_proj.weight", 4, 4),
		whole("optimizer.state.exp_avg.decoder.layers.0.self_attention.linear_proj.weight", 4, 4),
	}}
	require.NoError(t, stackSingletons(c))
	got := map[string][]int64{}
	var names []string
	for _, tn := range c.Tensors {
		got[tn.Name] = tn.Shape
		names = append(names, tn.Name)
	}
	assert.Equal(t, []string{"embedding.word_embeddings.weight", "decoder.layers.mlp.experts.experts.linear_fc1.weight",
		"decoder.layers.self_attention.linear_proj.weight", "optimizer.state.exp_avg.decoder.layers.0.self_attention.linear_proj.weight"}, names)
	assert.Equal(t, []int64{2, 2, 6, 4}, got["decoder.layers.mlp.experts.experts.linear_fc1.weight"])
	assert.Equal(t, []int64{2, 4, 4}, got["decoder.layers.self_attention.linear_proj.weight"])
	fc1 := c.Tensors[1]
	// layer 1, expert 0, up half: rows 3..5
	assert.Contains(t, fc1.Chunks.Values(), ckpt.Chunk{Offsets: []int64{1, 0, 3, 0}, Sizes: []int64{1, 1, 3, 4}, Source: zeros{}})

	for _, tc := range []struct {
		name string
		ts   []*ckpt.Tensor
		err  string
	}{
		{"a layer missing", []*ckpt.Tensor{whole("decoder.layers.0.x", 2), whole("decoder.layers.2.x", 2)}, "decoder.layers.x: 2 keys do not fill [3]"},
		{"an expert missing", []*ckpt.Tensor{whole("decoder.layers.0.mlp.experts.experts.1.w", 2), whole("decoder.layers.1.mlp.experts.experts.0.w", 2),
			whole("decoder.layers.1.mlp.experts.experts.1.w", 2)}, "3 keys do not fill [2 2]"},
		{"shapes differ", []*ckpt.Tensor{whole("decoder.layers.0.x", 2), whole("decoder.layers.1.x", 3)}, "decoder.layers.0.x and decoder.layers.1.x cannot be stacked"},
		{"a half alone", []*ckpt.Tensor{whole("decoder.layers.0.mlp.linear_fc1.weight_w", 2, 2)}, "decoder.layers.mlp.linear_fc1.weight has only one of its _w and _v halves"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := stackSingletons(&ckpt.Checkpoint{Dir: "d", Tensors: tc.ts})
			assert.ErrorContains(t, err, tc.err)
		})
	}
}

// FuzzStackSingletons: any set of saved names (one per line, each a [2, 3]
// tensor, a line starting with "s" a [3] one) stacks into tensors that
// tile their shapes, or is an error; never a panic.
func FuzzStackSingletons(f *testing.F) {
	f.Add("decoder.layers.0.mlp.experts.experts.0.linear_fc1.weight_w\ndecoder.layers.0.mlp.experts.experts.0.linear_fc1.weight_v\ndecoder.layers.1.x")
	f.Add("decoder.layers.999999.x\ndecoder.layers.0.x")
	f.Add("decoder.layers.0.experts.experts.1.experts.experts.2.y")
	f.Fuzz(func(t *testing.T, names string) {
		var ts []*ckpt.Tensor
		seen := map[string]bool{}
		for i, n := range strings.Split(names, "\n") {
			if seen[n] || i > 64 {
				continue
			}
			seen[n] = true
			shape := []int64{2, 3}
			if strings.HasPrefix(n, "s") {
				shape = []int64{3}
			}
			ts = append(ts, whole(n, shape...))
		}
		c := &ckpt.Checkpoint{Dir: "d", Tensors: ts}
		if err := stackSingletons(c); err != nil {
			return
		}
		for _, tn := range c.Tensors {
			require.NoError(t, tn.Validate(), tn.Name)
		}
	})
}
