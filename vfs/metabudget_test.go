package vfs

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/ckptfs/ckptfs/internal/testenv"
	"github.com/ckptfs/ckptfs/layout/torchdcp"
	"github.com/ckptfs/ckptfs/vfs/viewcache"
)

// writeScaled writes a DCP checkpoint of ranks FSDP ranks into dir: a
// small Llama's tensors saved as {"model": ..., "optim": ...}, each split
// on dim 0 into one chunk per rank, with Adam's exp_avg and exp_avg_sq,
// and sparse shard files (truncated to size: nothing is read from them
// to open or list the view). e2e/bench/gen_scale.py writes the same with
// torch's own classes, at 405B scale.
func writeScaled(t *testing.T, dir string, ranks int) {
	t.Helper()
	require.NoError(t, os.MkdirAll(dir, 0o755))
	const layers, hidden, ffn = 16, 1024, 2816
	type param struct {
		name  string
		shape []int64
	}
	params := []param{{"model.embed_tokens.weight", []int64{4096, hidden}}}
	for l := range layers {
		p := fmt.Sprintf("model.layers.%d.", l)
		params = append(params, param{p + "self_attn.q_proj.weight", []int64{hidden, hidden}},
			param{p + "mlp.up_proj.weight", []int64{ffn, hidden}}, param{p + "mlp.down_proj.weight", []int64{hidden, ffn}},
			param{p + "input_layernorm.weight", []int64{hidden}})
	}
	m := &torchdcp.Metadata{Planner: []torchdcp.PlannerEntry{}}
	sizes := make([]int64, ranks)
	add := func(fqn string, path []any, shape []int64, dtype string, esize int64) {
		tm := &torchdcp.TensorMetadata{Properties: torchdcp.TensorProperties{DType: dtype, Layout: "torch.strided"}, Size: shape}
		per := (shape[0] + int64(ranks) - 1) / int64(ranks)
		row := esize
		for _, d := range shape[1:] {
			row *= d
		}
		for r := range ranks {
			start := min(int64(r)*per, shape[0])
			n := min(per, shape[0]-start)
			off := append([]int64{start}, make([]int64, len(shape)-1)...)
			sz := append([]int64{n}, shape[1:]...)
			tm.Chunks = append(tm.Chunks, torchdcp.ChunkMetadata{Offsets: off, Sizes: sz})
			length := n*row + 1024
			m.Storage = append(m.Storage, torchdcp.StorageEntry{Index: torchdcp.Index{FQN: fqn, Offset: off},
				Info: torchdcp.StorageInfo{RelativePath: torchdcp.ShardName(r, 0), Offset: sizes[r], Length: length}})
			sizes[r] += length
		}
		m.Items = append(m.Items, torchdcp.Item{FQN: fqn, Tensor: tm})
		m.Planner = append(m.Planner, torchdcp.PlannerEntry{Key: fqn, Path: path})
	}
	for _, p := range params {
		add("model."+p.name, []any{"model", p.name}, p.shape, "bfloat16", 2)
	}
	for _, p := range params {
		for _, st := range []string{"exp_avg", "exp_avg_sq"} {
			add("optim.state."+p.name+"."+st, []any{"optim", "state", p.name, st}, p.shape, "float32", 4)
		}
	}
	f, err := os.Create(filepath.Join(dir, torchdcp.MetadataFile))
	require.NoError(t, err)
	require.NoError(t, torchdcp.EncodeMetadata(f, m.With(nil, nil, nil)))
	require.NoError(t, f.Close())
	for r, n := range sizes {
		f, err := os.Create(filepath.Join(dir, torchdcp.ShardName(r, 0)))
		require.NoError(t, err)
		require.NoError(t, f.Truncate(n))
		require.NoError(t, f.Close())
	}
}

// Views of large checkpoints are closed least recently used first when
// their resident metadata passes the budget: with a budget of two and a
// half views, opening six keeps at most three open (the newest always
// stays), and the heap they hold stays within the budget and one view.
func TestViewsEvictedWithinMetadataBudget(t *testing.T) {
	const n, ranks = 6, 64
	root := t.TempDir()
	for i := range n {
		writeScaled(t, filepath.Join(root, step(i)), ranks)
	}
	fsys := newFS(t, root)
	one := func() int64 {
		fsys.view(step(0), nil)
		st := entryStats(t, fsys, step(0))
		require.True(t, st.Open, "%v", st.Err)
		return st.MetadataBytes
	}()
	require.Greater(t, one, int64(256<<10), "a view of %d ranks holds hundreds of KB of metadata", ranks)
	metaMax := one * 5 / 2
	setViewLimits(fsys, viewcache.Limits{Meta: metaMax})

	base := testenv.LiveHeap()
	for pass := range 2 {
		for i := range n {
			e := fsys.view(step(i), nil)
			i, err := fsys.views.Acquire(e)
			require.NoError(t, err)
			for _, f := range e.Files() {
				require.NotNil(t, i.File(f.Name), f.Name)
			}
			i.Unref()
			st := fsys.views.Stats()
			meta, views := st.MetadataBytes, st.Views
			require.LessOrEqual(t, meta, metaMax+one, "pass %d", pass)
			require.LessOrEqual(t, views, 3, "pass %d", pass)
		}
	}
	// What the views hold is what they count (ResidentBytes), within a
	// quarter, plus what a Go heap keeps beside.
	held := testenv.LiveHeap() - base
	meta := fsys.views.Stats().MetadataBytes
	require.LessOrEqual(t, held, meta*5/4+(4<<20), "the views hold %d bytes of heap; they count %d", held, meta)
	require.LessOrEqual(t, held, metaMax+one+(4<<20))
}
