package dcpwrite

import (
	"bytes"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ckptfs/ckptfs/layout/ckpt"
	"github.com/ckptfs/ckptfs/safetensors"
)

func fakeLike(name string, shape []int64, boxes [][2][]int64) *ckpt.Checkpoint {
	t := &ckpt.Tensor{Name: name, DType: safetensors.F32, Shape: shape}
	for _, b := range boxes {
		t.Chunks.Add(b[0], b[1], nil)
	}
	return &ckpt.Checkpoint{Tensors: []*ckpt.Tensor{t}}
}

func rc(rank int, off, size []int64) RankChunk {
	return RankChunk{Rank: rank, Offsets: off, Sizes: size}
}

func TestChunks(t *testing.T) {
	rules := mustRules(t, "^col 1\n^rep replicate\n")
	for _, tc := range []struct {
		name  string
		world int
		shape []int64
		want  []RankChunk
	}{
		// FORMATS.md §5.2 (torch 2.14.1, 4 ranks).
		{"x", 4, []int64{10, 3}, []RankChunk{rc(0, []int64{0, 0}, []int64{3, 3}), rc(1, []int64{3, 0}, []int64{3, 3}), rc(2, []int64{6, 0}, []int64{3, 3}), rc(3, []int64{9, 0}, []int64{1, 3})}},
		{"x", 4, []int64{5, 3}, []RankChunk{rc(0, []int64{0, 0}, []int64{2, 3}), rc(1, []int64{2, 0}, []int64{2, 3}), rc(2, []int64{4, 0}, []int64{1, 3}), rc(3, []int64{5, 0}, []int64{0, 3})}},
		{"x", 4, []int64{5}, []RankChunk{rc(0, []int64{0}, []int64{2}), rc(1, []int64{2}, []int64{2}), rc(2, []int64{4}, []int64{1}), rc(3, []int64{5}, []int64{0})}},
		{"x", 4, []int64{2, 3}, []RankChunk{rc(0, []int64{0, 0}, []int64{1, 3}), rc(1, []int64{1, 0}, []int64{1, 3}), rc(2, []int64{2, 0}, []int64{0, 3})}},
		{"col", 4, []int64{2, 12}, []RankChunk{rc(0, []int64{0, 0}, []int64{2, 3}), rc(1, []int64{0, 3}, []int64{2, 3}), rc(2, []int64{0, 6}, []int64{2, 3}), rc(3, []int64{0, 9}, []int64{2, 3})}},
		{"rep", 4, []int64{2, 3}, []RankChunk{rc(0, []int64{0, 0}, []int64{2, 3})}},
		// More.
		{"x", 3, []int64{4}, []RankChunk{rc(0, []int64{0}, []int64{2}), rc(1, []int64{2}, []int64{2}), rc(2, []int64{4}, []int64{0})}},
		{"x", 3, []int64{0, 2}, []RankChunk{rc(0, []int64{0, 0}, []int64{0, 2})}},
		{"x", 3, []int64{}, []RankChunk{rc(0, []int64{}, []int64{})}},
		{"col", 3, []int64{4}, []RankChunk{rc(0, []int64{0}, []int64{4})}}, // no dim 1: replicated
		{"x", 1, []int64{7, 2}, []RankChunk{rc(0, []int64{0, 0}, []int64{7, 2})}},
		{"x", 0, []int64{7}, []RankChunk{rc(0, []int64{0}, []int64{7})}},
	} {
		got := Target{WorldSize: tc.world, Rules: rules}.Chunks(tc.name, tc.shape)
		assert.Equal(t, tc.want, got, "%s %v over %d", tc.name, tc.shape, tc.world)
	}
}

func TestChunksLike(t *testing.T) {
	like := fakeLike("model.w", []int64{4, 4}, [][2][]int64{
		{{0, 0}, {2, 2}}, {{0, 2}, {2, 2}}, {{2, 0}, {2, 2}}, {{2, 2}, {2, 2}},
	})
	target := Target{WorldSize: 3, Like: like, Prefix: "model", Rules: mustRules(t, ". replicate")}
	assert.Equal(t, []RankChunk{
		rc(0, []int64{0, 0}, []int64{2, 2}), rc(0, []int64{2, 2}, []int64{2, 2}),
		rc(1, []int64{0, 2}, []int64{2, 2}), rc(2, []int64{2, 0}, []int64{2, 2}),
	}, target.Chunks("w", []int64{4, 4}))
	// Shape differs: the rules apply.
	assert.Equal(t, []RankChunk{rc(0, []int64{0, 0}, []int64{4, 5})}, target.Chunks("w", []int64{4, 5}))
	// Plain-name match when the FQN is not in Like.
	target.Prefix = "other"
	like.Tensors[0].Name = "w"
	assert.Len(t, target.Chunks("w", []int64{4, 4}), 4)
}

func TestParseRules(t *testing.T) {
	rules, err := ParseRules(strings.NewReader(`
# embeddings are column-sharded
^model\.embed_tokens\.weight$   1
  .*norm.*  replicate   # trailing comment
lm_head 0
x REPLICATE
`))
	require.NoError(t, err)
	require.Len(t, rules, 4)
	assert.Equal(t, `^model\.embed_tokens\.weight$`, rules[0].Pattern.String())
	assert.Equal(t, 1, rules[0].Dim)
	assert.Equal(t, Replicate, rules[1].Dim)
	assert.Equal(t, 0, rules[2].Dim)
	assert.Equal(t, Replicate, rules[3].Dim)
	target := Target{WorldSize: 2, Rules: rules}
	assert.Equal(t, 1, target.Dim("model.embed_tokens.weight", 2))
	assert.Equal(t, Replicate, target.Dim("layers.0.input_layernorm.weight", 1))
	assert.Equal(t, 0, target.Dim("other", 2))

	for _, tc := range []struct{ in, want string }{
		{"a", "line 1: want"},
		{"a 1 2", "line 1: want"},
		{"\n\n( 1", "line 3: error parsing regexp"},
		{"a -1", `line 1: placement "-1"`},
		{"ok 0\na x", `line 2: placement "x"`},
	} {
		_, err := ParseRules(strings.NewReader(tc.in))
		require.Error(t, err, tc.in)
		assert.Contains(t, err.Error(), tc.want)
	}
	rules, err = ParseRules(bytes.NewReader(nil))
	require.NoError(t, err)
	assert.Empty(t, rules)
}

// FuzzChunks checks that every placement tiles the tensor (the save-time
// checks pass) and that copyBox extracts each box exactly as a naive copy
// does, with any copy-buffer size.
func FuzzChunks(f *testing.F) {
	f.Add(uint8(3), uint8(5), uint8(3), uint8(0), uint8(0), uint8(2), uint8(7))
	f.Add(uint8(4), uint8(2), uint8(3), uint8(1), uint8(1), uint8(1), uint8(1))
	f.Add(uint8(2), uint8(0), uint8(4), uint8(6), uint8(2), uint8(4), uint8(64))
	f.Fuzz(func(t *testing.T, world, d0, d1, d2, rank, es, bufSize uint8) {
		ndim := int(rank % 4)
		shape := []int64{int64(d0 % 9), int64(d1 % 9), int64(d2 % 9)}[:ndim]
		esz := []int64{1, 2, 4, 8}[es%4]
		rules := []Rule{{Pattern: mustRules(t, ". 0")[0].Pattern, Dim: int(bufSize%5) - 1}}
		target := Target{WorldSize: int(world%9) + 1, Rules: rules}
		chunks := dedupEmpty(target.Chunks("t", shape))
		tt := ckpt.Tensor{Name: "t", DType: map[int64]safetensors.DType{1: safetensors.U8, 2: safetensors.F16, 4: safetensors.F32, 8: safetensors.F64}[esz], Shape: shape}
		for _, c := range chunks {
			require.GreaterOrEqual(t, c.Rank, 0)
			require.Less(t, c.Rank, target.world())
			tt.Chunks.Add(c.Offsets, c.Sizes, nil)
		}
		require.NoError(t, tt.Validate())
		n, _ := ckpt.NumElements(shape)
		full := fill("t", safetensors.U8, n*esz, int(bufSize))
		src := append([]byte("HEADER"), full...)
		buf := make([]byte, int(bufSize)+1)
		for _, c := range chunks {
			var out bytes.Buffer
			err := copyBox(&out, complete{bytes.NewReader(src)}, 6, shape, c.Offsets, c.Sizes, esz, buf)
			require.NoError(t, err)
			require.Equal(t, boxBytes(full, shape, c.Offsets, c.Sizes, esz), append([]byte{}, out.Bytes()...), "box %v %v of %v", c.Offsets, c.Sizes, shape)
		}
	})
}
