package torchdcp

import (
	"encoding/hex"
	"encoding/json"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/ckptfs/ckptfs/layout/ckpt"
	"github.com/ckptfs/ckptfs/layout/internal/treetest"
)

// manifest.json, written by testdata/gen.py from what torch reads back.
type manifest map[string]json.RawMessage

type ckptManifest struct {
	Version string `json:"version"`
	Tensors []struct {
		FQN          string   `json:"fqn"`
		Path         []string `json:"path"`
		DType        string   `json:"dtype"`
		RequiresGrad bool     `json:"requires_grad"`
		Shape        []int64  `json:"shape"`
		Chunks       []struct {
			Offsets []int64 `json:"offsets"`
			Sizes   []int64 `json:"sizes"`
		} `json:"chunks"`
		Hex string `json:"hex"`
	} `json:"tensors"`
	Objects []struct {
		FQN  string   `json:"fqn"`
		Path []string `json:"path"`
	} `json:"objects"`
	Storage []struct {
		FQN                  string   `json:"fqn"`
		Offset               []int64  `json:"offset"`
		RelativePath         string   `json:"relative_path"`
		FileOffset           int64    `json:"file_offset"`
		Length               int64    `json:"length"`
		TransformDescriptors []string `json:"transform_descriptors"`
	} `json:"storage"`
}

type recordManifest map[string]struct {
	DType string  `json:"dtype"`
	Shape []int64 `json:"shape"`
	Hex   string  `json:"hex"`
}

var checkpoints = []string{"plain", "nested", "zstd", "sharded"}

func loadManifest(t testing.TB) manifest {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("testdata", "manifest.json"))
	require.NoError(t, err)
	var m manifest
	require.NoError(t, json.Unmarshal(b, &m))
	return m
}

func (m manifest) ckpt(t testing.TB, name string) ckptManifest {
	t.Helper()
	var c ckptManifest
	require.NoError(t, json.Unmarshal(m[name], &c))
	return c
}

func (m manifest) records(t testing.TB) recordManifest {
	t.Helper()
	var r recordManifest
	require.NoError(t, json.Unmarshal(m["records"], &r))
	return r
}

func unhex(t testing.TB, s string) []byte {
	t.Helper()
	b, err := hex.DecodeString(s)
	require.NoError(t, err)
	return b
}

// copyDir copies a fixture checkpoint into a fresh temporary directory, so a
// test can break it.
func copyDir(t testing.TB, name string) string {
	t.Helper()
	dst := filepath.Join(t.TempDir(), name)
	require.NoError(t, os.MkdirAll(dst, 0o755))
	ents, err := os.ReadDir(filepath.Join("testdata", name))
	require.NoError(t, err)
	for _, e := range ents {
		b, err := os.ReadFile(filepath.Join("testdata", name, e.Name()))
		require.NoError(t, err)
		require.NoError(t, os.WriteFile(filepath.Join(dst, e.Name()), b, 0o644))
	}
	return dst
}

// assemble reads every chunk and scatters it into the C-order bytes of the
// whole tensor.
func assemble(t testing.TB, tn *ckpt.Tensor) []byte {
	t.Helper()
	es := int64(tn.DType.Size())
	total, err := ckpt.NumElements(tn.Shape)
	require.NoError(t, err)
	out := make([]byte, total*es)
	strides := make([]int64, len(tn.Shape))
	s := int64(1)
	for d := len(tn.Shape) - 1; d >= 0; d-- {
		strides[d] = s
		s *= tn.Shape[d]
	}
	for _, c := range tn.Chunks.All() {
		data, err := treetest.ReadChunk(t, tn, c)
		require.NoError(t, err, "tensor %s chunk %v", tn.Name, c.Offsets)
		n := int64(len(data)) / es
		idx := make([]int64, len(c.Sizes))
		for e := int64(0); e < n; e++ {
			g := int64(0)
			for d := range idx {
				g += (c.Offsets[d] + idx[d]) * strides[d]
			}
			copy(out[g*es:(g+1)*es], data[e*es:(e+1)*es])
			for d := len(idx) - 1; d >= 0; d-- {
				idx[d]++
				if idx[d] < c.Sizes[d] {
					break
				}
				idx[d] = 0
			}
		}
	}
	return out
}
