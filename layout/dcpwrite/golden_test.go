package dcpwrite

import (
	"bytes"
	"flag"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ckptfs/ckptfs/layout/torchdcp"
	"github.com/ckptfs/ckptfs/safetensors"
)

var update = flag.Bool("update", false, "rewrite golden files in testdata")

// goldenCommit writes the golden checkpoint into dir: model-prefixed, a
// 3×2 float32 sharded over 2 ranks and a bfloat16 scalar.
func goldenCommit(t *testing.T, dir string) []expectation {
	f := makeST(t, 0, spec{"w", safetensors.F32, []int64{3, 2}}, spec{"s", safetensors.BF16, nil})
	return commitAll(t, dir, Target{WorldSize: 2, Prefix: "model"}, f)
}

func goldenMetadata(t *testing.T) []byte {
	dir := t.TempDir()
	goldenCommit(t, dir)
	b, err := os.ReadFile(filepath.Join(dir, ".metadata"))
	require.NoError(t, err)
	return b
}

// TestGoldenMetadata compares the emitted pickle byte for byte with
// testdata/golden.metadata (python -m pickletools shows it; check_load.py
// loads it with torch). Regenerate with -update.
func TestGoldenMetadata(t *testing.T) {
	got := goldenMetadata(t)
	path := filepath.Join("testdata", "golden.metadata")
	if *update {
		require.NoError(t, os.MkdirAll("testdata", 0o755))
		require.NoError(t, os.WriteFile(path, got, 0o644))
	}
	want, err := os.ReadFile(path)
	require.NoError(t, err)
	require.Equal(t, want, got, "emitted .metadata differs from %s (run with -update after checking it with torch)", path)

	m, err := torchdcp.DecodeMetadata(bytes.NewReader(got))
	require.NoError(t, err)
	require.Len(t, m.Items, 2)
	w := m.Items[0].Tensor
	assert.Equal(t, "model.w", m.Items[0].FQN)
	assert.Equal(t, "float32", w.Properties.DType)
	assert.Equal(t, "torch.strided", w.Properties.Layout)
	assert.Equal(t, []int64{3, 2}, w.Size)
	assert.Equal(t, []torchdcp.ChunkMetadata{
		{Offsets: []int64{0, 0}, Sizes: []int64{2, 2}},
		{Offsets: []int64{2, 0}, Sizes: []int64{1, 2}},
	}, w.Chunks)
	assert.Equal(t, "model.s", m.Items[1].FQN)
	assert.Equal(t, "bfloat16", m.Items[1].Tensor.Properties.DType)
	assert.Equal(t, []int64{}, m.Items[1].Tensor.Size)
	assert.Equal(t, map[string][]string{"model.w": {"model", "w"}, "model.s": {"model", "s"}}, m.PlannerData)
	require.Len(t, m.Storage, 3)
	assert.Equal(t, "__0_0.distcp", m.Storage[0].Info.RelativePath)
	assert.Equal(t, "__1_0.distcp", m.Storage[1].Info.RelativePath)
	assert.Equal(t, []int64{2, 0}, m.Storage[1].Index.Offset)
	assert.Equal(t, "__0_0.distcp", m.Storage[2].Info.RelativePath)
	assert.Equal(t, []int64{}, m.Storage[2].Index.Offset)
}
