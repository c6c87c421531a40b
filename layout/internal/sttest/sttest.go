// Package sttest writes safetensors files for the write path's tests.
package sttest

import (
	"bytes"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/ckptfs/ckptfs/safetensors"
)

// Spec is one tensor of a test file.
type Spec struct {
	Name  string
	DType safetensors.DType
	Shape []int64
}

// Build writes a safetensors file of specs, laid out in their order, with
// the given metadata, through the safetensors package's streaming Writer;
// fill gives each tensor's bytes. It returns the file and the bytes of
// each tensor.
func Build(t testing.TB, meta map[string]string, fill func(safetensors.TensorInfo) []byte, specs ...Spec) ([]byte, map[string][]byte) {
	t.Helper()
	infos := make([]safetensors.TensorInfo, len(specs))
	for i, s := range specs {
		infos[i] = safetensors.TensorInfo{Name: s.Name, DType: s.DType, Shape: s.Shape}
	}
	infos = safetensors.Layout(infos)
	var buf bytes.Buffer
	w, err := safetensors.NewWriter(&buf, meta, infos)
	require.NoError(t, err)
	raw := make(map[string][]byte, len(infos))
	for _, ti := range infos {
		b := fill(ti)
		raw[ti.Name] = b
		_, err := w.Write(b)
		require.NoError(t, err)
	}
	require.NoError(t, w.Close())
	return buf.Bytes(), raw
}
