package torchdcp

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/ckptfs/ckptfs/layout/pickle"
	"github.com/ckptfs/ckptfs/layout/source"
	"github.com/stretchr/testify/require"
)

// llamaScale is the checkpoint e2e/bench/gen_scale.py writes with --adam,
// in Go: a Llama of the given layers with Llama-3.1-405B's other shapes
// (hidden 16384, ffn 53248, 8 kv heads of 128, vocab 128256), saved as
// {"model": ..., "optim": ...} from ranks FSDP ranks (dim 0 split into
// ceil(rows/ranks) rows per rank, one file per rank), with Adam's exp_avg,
// exp_avg_sq and step; it returns the metadata and each rank file's size.
// Its storage entries come as dcp.save writes them: rank by rank (each
// rank's bytes item, then its tensors in order), each MetadataIndex with
// its index and its own fqn string (encodeIndex). Unlike gen_scale.py it
// keeps every step and the lr on rank 0 (no de-duplication by bytes), an
// empty chunk for each rank past a tensor's rows, and no strides.
func llamaScale(ranks, layers int) (*Metadata, []int64) {
	const hidden, ffn, kv, vocab, overhead = 16384, 53248, 8 * 128, 128256, 1024
	type param struct {
		name  string
		shape []int64
	}
	params := []param{{"model.embed_tokens.weight", []int64{vocab, hidden}}}
	for i := range layers {
		p := fmt.Sprintf("model.layers.%d.", i)
		params = append(params, param{p + "self_attn.q_proj.weight", []int64{hidden, hidden}},
			param{p + "self_attn.k_proj.weight", []int64{kv, hidden}}, param{p + "self_attn.v_proj.weight", []int64{kv, hidden}},
			param{p + "self_attn.o_proj.weight", []int64{hidden, hidden}}, param{p + "mlp.gate_proj.weight", []int64{ffn, hidden}},
			param{p + "mlp.up_proj.weight", []int64{ffn, hidden}}, param{p + "mlp.down_proj.weight", []int64{hidden, ffn}},
			param{p + "input_layernorm.weight", []int64{hidden}}, param{p + "post_attention_layernorm.weight", []int64{hidden}})
	}
	params = append(params, param{"model.norm.weight", []int64{hidden}}, param{"lm_head.weight", []int64{vocab, hidden}})

	m := &Metadata{}
	sizes := make([]int64, ranks)
	byRank := make([][]StorageEntry, ranks)
	put := func(rank int, fqn string, off []int64, nbytes int64) {
		byRank[rank] = append(byRank[rank], StorageEntry{Index: Index{FQN: fqn, Offset: off},
			Info: StorageInfo{RelativePath: fmt.Sprintf("__%d_0.distcp", rank), Offset: sizes[rank], Length: nbytes + overhead}})
		sizes[rank] += nbytes + overhead
	}
	put(0, "optim.param_groups.0.lr", nil, 64-overhead) // the bytes item first
	add := func(fqn string, path []any, t *TensorMetadata) {
		m.Items = append(m.Items, Item{FQN: fqn, Tensor: t})
		m.Planner = append(m.Planner, PlannerEntry{Key: fqn, Path: path})
	}
	sharded := func(fqn string, path []any, shape []int64, dtype string, esize int64) {
		rows, rest := shape[0], int64(1)
		for _, d := range shape[1:] {
			rest *= d
		}
		per := (rows + int64(ranks) - 1) / int64(ranks)
		t := &TensorMetadata{Properties: TensorProperties{DType: dtype, Layout: "torch.strided"}, Size: shape}
		for r := range ranks {
			start := min(int64(r)*per, rows)
			n := min(per, rows-start)
			off := make([]int64, len(shape))
			off[0] = start
			t.Chunks = append(t.Chunks, ChunkMetadata{Offsets: off, Sizes: append([]int64{n}, shape[1:]...)})
			put(r, fqn, append([]int64(nil), off...), n*rest*esize)
		}
		add(fqn, path, t)
	}
	for _, p := range params {
		sharded("model."+p.name, []any{"model", p.name}, p.shape, "bfloat16", 2)
	}
	for _, p := range params {
		for _, st := range []string{"exp_avg", "exp_avg_sq"} {
			sharded("optim.state."+p.name+"."+st, []any{"optim", "state", p.name, st}, p.shape, "float32", 4)
		}
		fqn := "optim.state." + p.name + ".step"
		add(fqn, []any{"optim", "state", p.name, "step"}, &TensorMetadata{
			Properties: TensorProperties{DType: "float32", Layout: "torch.strided"}, Size: []int64{},
			Chunks: []ChunkMetadata{{Offsets: []int64{}, Sizes: []int64{}}}})
		put(0, fqn, []int64{}, 4)
	}
	m.Items = append(m.Items, Item{FQN: "optim.param_groups.0.lr"})
	m.Planner = append(m.Planner, PlannerEntry{Key: "optim.param_groups.0.lr", Path: []any{"optim", "param_groups", int64(0), "lr"}})
	for _, entries := range byRank {
		m.Storage = append(m.Storage, entries...)
	}
	return m, sizes
}

// writeLlamaScale writes llamaScale's checkpoint into dir, its .metadata
// pickled as torch pickles it (protocol 4, the memo), its shards sparse;
// it returns the number of chunks.
func writeLlamaScale(t testing.TB, dir string, ranks, layers int) int {
	m, sizes := llamaScale(ranks, layers)
	var buf bytes.Buffer
	require.NoError(t, encodeMetadata(&buf, m, pickle.NewMemoEncoder()))
	require.NoError(t, os.WriteFile(filepath.Join(dir, MetadataFile), buf.Bytes(), 0o644))
	for r, size := range sizes {
		f, err := os.Create(filepath.Join(dir, fmt.Sprintf("__%d_0.distcp", r)))
		require.NoError(t, err)
		require.NoError(t, f.Truncate(size))
		require.NoError(t, f.Close())
	}
	n := 0
	for _, it := range m.Items {
		if it.Tensor != nil {
			n += len(it.Tensor.Chunks)
		}
	}
	return n
}

// BenchmarkOpenLlama405BW64 opens run V's W = 64 with Adam checkpoint
// (219 441 chunks, written here: writeLlamaScale) as inspect does: the
// .metadata decoded (scanned, records, the stream), the model built and
// checked. The W = 512 file of issue 35 is the same at 8x the chunks.
func BenchmarkOpenLlama405BW64(b *testing.B) {
	dir := b.TempDir()
	chunks := writeLlamaScale(b, dir, 64, 126)
	tree, err := source.OpenLocal(dir)
	require.NoError(b, err)
	st, err := os.Stat(filepath.Join(dir, MetadataFile))
	require.NoError(b, err)
	b.SetBytes(st.Size())
	b.ReportAllocs()
	cpu0 := processCPU(b)
	for b.Loop() {
		c, err := OpenTree(tree, Options{})
		if err != nil {
			b.Fatal(err)
		}
		c.Close()
	}
	// The process's CPU time (collector included) per chunk: on a shared
	// machine, wall time measures the neighbours.
	per := float64(b.N) * float64(chunks)
	b.ReportMetric((processCPU(b)-cpu0).Seconds()*1e6/per, "cpu-µs/chunk")
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/1e3/per, "µs/chunk")
}

// processCPU is the user and system CPU time the process has used.
func processCPU(t testing.TB) time.Duration {
	var ru syscall.Rusage
	require.NoError(t, syscall.Getrusage(syscall.RUSAGE_SELF, &ru))
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// The benchmark's checkpoint, small: pickled as torch pickles it, it
// decodes the same through the stream with records, without, and the
// general way, every chunk, index and storage info a record, to what it
// was written from; and it opens.
func TestLlamaScaleFile(t *testing.T) {
	dir := t.TempDir()
	chunks := writeLlamaScale(t, dir, 4, 1)
	data, err := os.ReadFile(filepath.Join(dir, MetadataFile))
	require.NoError(t, err)
	st := checkStream(t, data)
	require.NotNil(t, st)
	require.Equal(t, 3*chunks+2, st.records, "chunks, indexes and storage infos (and the BYTE_IO value's index and info) as records")
	require.Zero(t, st.built)
	require.Equal(t, chunks, st.hinted, "storage entries placed by their index")
	want, _ := llamaScale(4, 1)
	got, err := decodeMetadataBytes(data, DefaultMaxMetadataBytes)
	require.NoError(t, err)
	require.Equal(t, len(want.Storage), len(got.Storage))
	for i, e := range got.Storage[1:] { // rank by rank, as dcp.save writes them
		require.LessOrEqual(t, got.Storage[i].Info.RelativePath, e.Info.RelativePath)
	}
	for i, w := range want.Items {
		require.Equal(t, w.FQN, got.Items[i].FQN)
		if w.Tensor != nil {
			require.Equal(t, w.Tensor.Chunks, got.Items[i].Tensor.Chunks, w.FQN)
		}
	}
	tree, err := source.OpenLocal(dir)
	require.NoError(t, err)
	c, err := OpenTree(tree, Options{})
	require.NoError(t, err)
	defer c.Close()
	require.Len(t, c.Tensors, len(want.Items)-1)
}
