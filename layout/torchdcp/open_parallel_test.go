package torchdcp

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ckptfs/ckptfs/layout/ckpt"
	"github.com/ckptfs/ckptfs/layout/internal/treetest"
	"github.com/ckptfs/ckptfs/layout/source"
)

// buildIn sets how items are built for the rest of the test: workers
// cores from any number of chunks on (1: one pass).
func buildIn(t *testing.T, workers int) {
	chunks, w := buildParallelChunks, buildWorkers
	t.Cleanup(func() { buildParallelChunks, buildWorkers = chunks, w })
	buildParallelChunks, buildWorkers = 0, workers
}

// openIn opens dir with items built on workers cores.
func openIn(t *testing.T, dir string, workers int, opts Options) (*ckpt.Checkpoint, error) {
	buildIn(t, workers)
	return treetest.OpenLocal(dir, func(tree source.Tree) (*ckpt.Checkpoint, error) { return OpenTree(tree, opts) })
}

// TestOpenInParallel: a checkpoint whose items are built on several cores
// is the one a single pass builds: the same tensors in the same order,
// chunks in the same places, the same tensors left out, skipped and
// objects; optimizer state left out or shown.
func TestOpenInParallel(t *testing.T) {
	for _, name := range checkpoints {
		for _, leave := range []bool{false, true} {
			t.Run(name, func(t *testing.T) {
				opts := Options{Open: ckpt.OpenOptions{LeaveOptimizer: leave}}
				want, err := openIn(t, filepath.Join("testdata", name), 1, opts)
				require.NoError(t, err)
				defer want.Close()
				for range 5 {
					got, err := openIn(t, filepath.Join("testdata", name), 4, opts)
					require.NoError(t, err)
					assertSameModel(t, want, got)
					got.Close()
				}
			})
		}
	}
}

func assertSameModel(t *testing.T, want, got *ckpt.Checkpoint) {
	t.Helper()
	require.Len(t, got.Tensors, len(want.Tensors))
	for i, wt := range want.Tensors {
		gt := got.Tensors[i]
		require.Equal(t, wt.Name, gt.Name)
		assert.Equal(t, wt.Path, gt.Path)
		assert.Equal(t, wt.DType, gt.DType)
		assert.Equal(t, wt.Shape, gt.Shape)
		require.Equal(t, wt.Chunks.Len(), gt.Chunks.Len(), wt.Name)
		for j := range wt.Chunks.Len() {
			wc, gc := wt.Chunks.At(j), gt.Chunks.At(j)
			assert.Equal(t, wc.Offsets, gc.Offsets)
			assert.Equal(t, wc.Sizes, gc.Sizes)
			wf, woff, wn, whow := wc.Source.(ckpt.Placed).Place()
			gf, goff, gn, ghow := gc.Source.(ckpt.Placed).Place()
			assert.Equal(t, []any{wf.Rel, woff, wn, whow}, []any{gf.Rel, goff, gn, ghow}, "%s chunk %d", wt.Name, j)
		}
	}
	assert.Equal(t, want.Left, got.Left)
	assert.Equal(t, want.Skipped, got.Skipped)
	require.Len(t, got.Objects, len(want.Objects))
	for i, wo := range want.Objects {
		go_ := got.Objects[i]
		assert.Equal(t, []any{wo.Name, wo.Path, wo.Size, wo.Source}, []any{go_.Name, go_.Path, go_.Size, go_.Source})
	}
}

// TestOpenInParallelFirstError: where several items cannot be shown, the
// error of a build on several cores is the first item's, as in one pass,
// whichever worker met which error first.
func TestOpenInParallelFirstError(t *testing.T) {
	dir := copyDir(t, "sharded")
	m, err := decodeFile(t, filepath.Join(dir, MetadataFile))
	require.NoError(t, err)
	for i := range m.Storage { // every chunk of every tensor past its file's end
		m.Storage[i].Info.Offset += 1 << 40
	}
	var b bytes.Buffer
	require.NoError(t, EncodeMetadata(&b, m))
	require.NoError(t, os.WriteFile(filepath.Join(dir, MetadataFile), b.Bytes(), 0o644))
	_, want := openIn(t, dir, 1, Options{})
	require.Error(t, want)
	assert.ErrorContains(t, want, `tensor "rows": chunk (0,0) stored in`)
	for range 20 {
		_, err := openIn(t, dir, 4, Options{})
		require.Error(t, err)
		assert.Equal(t, want.Error(), err.Error())
		assert.ErrorIs(t, err, ckpt.ErrInvalid)
	}
}

// BenchmarkBuildScale builds the model of the checkpoint in
// $CKPTFS_BENCH_SCALE, else of BenchmarkOpenLlama405BW64's (written here),
// decoded once, in one pass and on buildWorkers
// cores, alternated, as a mount opens it (optimizer state left out), and
// reports the median and least milliseconds of each: a shared machine's
// load falls on both alike.
func BenchmarkBuildScale(b *testing.B) {
	dir := os.Getenv("CKPTFS_BENCH_SCALE")
	if dir == "" {
		dir = b.TempDir()
		writeLlamaScale(b, dir, 64, 126)
	}
	tree, err := source.OpenLocal(dir)
	require.NoError(b, err)
	defer tree.Close()
	var m *Metadata
	var st *stream
	require.NoError(b, withMetadata(tree, DefaultMaxMetadataBytes, func(data []byte, _ func(lo, hi int)) error {
		var err error
		m, st, err = decodeMetadataStream(data, DefaultMaxMetadataBytes, newStream())
		return err
	}))
	require.NotNil(b, st)
	opts := Options{Open: ckpt.OpenOptions{LeaveOptimizer: true}}
	workers := buildWorkers
	defer func(n int) { buildParallelChunks = n }(buildParallelChunks)
	took := map[int][]float64{}
	for b.Loop() {
		for _, w := range []int{1, workers} {
			buildWorkers = w
			runtime.GC()
			t0 := time.Now()
			c, err := openDecoded(tree, m, st, opts)
			took[w] = append(took[w], float64(time.Since(t0).Microseconds())/1000)
			require.NoError(b, err)
			c.Close()
		}
	}
	buildWorkers = workers
	for _, w := range []int{1, workers} {
		slices.Sort(took[w])
		b.ReportMetric(took[w][len(took[w])/2], fmt.Sprintf("ms-median-%d-cores", w))
		b.ReportMetric(took[w][0], fmt.Sprintf("ms-least-%d-cores", w))
	}
}
