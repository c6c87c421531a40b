// Package sttest writes safetensors files for tests, and reads their tensors
// back.
package sttest

import (
	"bytes"
	"io"
	"os"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/ckptfs/ckptfs/internal/stwrite"
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
	w, err := stwrite.NewWriter(&buf, meta, infos)
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

// Tensors is every tensor of the safetensors file r of size bytes, by name,
// with its header, read with the package's strict reader.
func Tensors(t testing.TB, r io.ReaderAt, size int64) (map[string][]byte, *safetensors.Header) {
	t.Helper()
	h, err := safetensors.ReadHeader(r, size)
	require.NoError(t, err)
	out := make(map[string][]byte, len(h.Tensors))
	for _, info := range h.Tensors {
		b, err := io.ReadAll(h.Section(r, info))
		require.NoError(t, err, info.Name)
		out[info.Name] = b
	}
	return out, h
}

// FileTensors is Tensors of the file at path.
func FileTensors(t testing.TB, path string) map[string][]byte {
	t.Helper()
	f, err := os.Open(path)
	require.NoError(t, err)
	defer f.Close()
	fi, err := f.Stat()
	require.NoError(t, err)
	out, _ := Tensors(t, f, fi.Size())
	return out
}
