package dcpwrite

import (
	"bytes"
	"flag"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ckptfs/ckptfs/layout/pickle"
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

// TestTensorPickle checks data.pkl against what torch.save writes for the
// same tensors, modulo torch's memo opcodes (BINPUT), which a loader does
// not need: the structure is decoded and compared.
func TestTensorPickle(t *testing.T) {
	for _, tc := range []struct {
		dtype   string
		es      int
		shape   []int64
		rebuild string
		storage pickle.Global
		numel   int64
		stride  pickle.Tuple
		extra   int // trailing dtype argument
	}{
		{"float32", 4, []int64{3, 4}, "_rebuild_tensor_v2", pickle.Global{Module: "torch", Name: "FloatStorage"}, 12, pickle.Tuple{int64(4), int64(1)}, 0},
		{"bool", 1, []int64{}, "_rebuild_tensor_v2", pickle.Global{Module: "torch", Name: "BoolStorage"}, 1, pickle.Tuple{}, 0},
		{"uint16", 2, []int64{2, 0, 3}, "_rebuild_tensor_v3", pickle.Global{Module: "torch.storage", Name: "UntypedStorage"}, 0, pickle.Tuple{int64(3), int64(3), int64(1)}, 1},
		{"float8_e4m3fn", 1, []int64{5}, "_rebuild_tensor_v3", pickle.Global{Module: "torch.storage", Name: "UntypedStorage"}, 5, pickle.Tuple{int64(1)}, 1},
		{"uint64", 8, []int64{2}, "_rebuild_tensor_v3", pickle.Global{Module: "torch.storage", Name: "UntypedStorage"}, 16, pickle.Tuple{int64(1)}, 1},
	} {
		b, err := tensorPickle(tc.dtype, tc.es, tc.shape)
		require.NoError(t, err)
		var pid pickle.Tuple
		v, err := pickle.DecodeBytes(b, pickle.Options{PersistentLoad: func(p any) (any, error) {
			pid = p.(pickle.Tuple)
			return "STORAGE", nil
		}})
		require.NoError(t, err)
		obj := v.(*pickle.Object)
		assert.Equal(t, pickle.Global{Module: "torch._utils", Name: tc.rebuild}, obj.Class)
		assert.Equal(t, pickle.Tuple{"storage", tc.storage, "0", "cpu", tc.numel}, pid)
		require.Len(t, obj.Args, 6+tc.extra)
		assert.Equal(t, "STORAGE", obj.Args[0])
		assert.Equal(t, int64(0), obj.Args[1])
		shape := pickle.Tuple{}
		for _, d := range tc.shape {
			shape = append(shape, d)
		}
		assert.Equal(t, shape, obj.Args[2])
		assert.Equal(t, tc.stride, obj.Args[3])
		assert.Equal(t, false, obj.Args[4])
		assert.True(t, obj.Args[5].(*pickle.Object).Is("collections", "OrderedDict"))
		if tc.extra == 1 {
			assert.Equal(t, pickle.Global{Module: "torch", Name: tc.dtype}, obj.Args[6])
		}
	}
	_, err := tensorPickle("float4_e2m1fn_x2", 1, nil)
	assert.ErrorIs(t, err, ErrDType)
}
