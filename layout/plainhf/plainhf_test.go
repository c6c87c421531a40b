package plainhf

import (
	"encoding/json"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ckptfs/ckptfs/internal/stwrite"
	"github.com/ckptfs/ckptfs/layout/ckpt"
	"github.com/ckptfs/ckptfs/safetensors"
)

// writeFile writes a safetensors file of F32 tensors, each 2 elements,
// filled with the byte b.
func writeFile(t *testing.T, path string, b byte, names ...string) {
	t.Helper()
	var infos []safetensors.TensorInfo
	for _, n := range names {
		infos = append(infos, safetensors.TensorInfo{Name: n, DType: safetensors.F32, Shape: []int64{2}})
	}
	f, err := os.Create(path)
	require.NoError(t, err)
	defer f.Close()
	infos = safetensors.Layout(infos)
	w, err := stwrite.NewWriter(f, map[string]string{"format": "pt"}, infos)
	require.NoError(t, err)
	data := make([]byte, 8*len(names))
	for i := range data {
		data[i] = b
	}
	_, err = w.Write(data)
	require.NoError(t, err)
	require.NoError(t, w.Close())
}

func writeIndex(t *testing.T, dir string, weightMap map[string]string) {
	t.Helper()
	b, err := json.Marshal(map[string]any{"metadata": map[string]any{"total_size": 0}, "weight_map": weightMap})
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(filepath.Join(dir, IndexFile), b, 0o644))
}

// sharded writes model-00001-of-00002 (a, b) and model-00002-of-00002 (c)
// with their index.
func sharded(t *testing.T) string {
	dir := t.TempDir()
	writeFile(t, filepath.Join(dir, "model-00001-of-00002.safetensors"), 1, "a", "b")
	writeFile(t, filepath.Join(dir, "model-00002-of-00002.safetensors"), 2, "c")
	writeIndex(t, dir, map[string]string{
		"a": "model-00001-of-00002.safetensors", "b": "model-00001-of-00002.safetensors",
		"c": "model-00002-of-00002.safetensors",
	})
	return dir
}

func TestOpenSharded(t *testing.T) {
	c, err := Open(sharded(t))
	require.NoError(t, err)
	defer c.Close()
	assert.Equal(t, ckpt.FormatPlainHF, c.Format)
	assert.Equal(t, []string{"model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors", IndexFile}, c.Passthrough)
	assert.Equal(t, map[string]int{"a": 1, "b": 1, "c": 2}, c.FileIndex)
	buf := make([]byte, 8)
	_, err = c.Tensors[2].Chunks.At(0).Source.ReadAt(buf, 0)
	require.NoError(t, err)
	assert.Equal(t, []byte{2, 2, 2, 2, 2, 2, 2, 2}, buf)
}

func TestOpenSingleFile(t *testing.T) {
	dir := t.TempDir()
	writeFile(t, filepath.Join(dir, SingleFile), 7, "w")
	c, err := Open(dir)
	require.NoError(t, err)
	defer c.Close()
	assert.Equal(t, []string{SingleFile}, c.Passthrough)
	require.Len(t, c.Tensors, 1)
}

// Damaged directories are errors that name the file and the cause.
func TestOpenBad(t *testing.T) {
	for _, tc := range []struct {
		name   string
		damage func(t *testing.T, dir string)
		err    string
	}{
		{"index names a tensor its file lacks", func(t *testing.T, dir string) {
			writeIndex(t, dir, map[string]string{"a": "model-00001-of-00002.safetensors", "b": "model-00001-of-00002.safetensors",
				"c": "model-00002-of-00002.safetensors", "d": "model-00002-of-00002.safetensors"})
		}, `says tensor "d" is in model-00002-of-00002.safetensors, which does not hold it`},
		{"a file holds a tensor indexed elsewhere", func(t *testing.T, dir string) {
			writeIndex(t, dir, map[string]string{"a": "model-00001-of-00002.safetensors",
				"b": "model-00002-of-00002.safetensors", "c": "model-00002-of-00002.safetensors"})
		}, `model-00001-of-00002.safetensors: tensor "b" is not indexed to this file`},
		{"index names a missing file", func(t *testing.T, dir string) {
			require.NoError(t, os.Remove(filepath.Join(dir, "model-00002-of-00002.safetensors")))
		}, "model-00002-of-00002.safetensors: no such file"},
		{"index names a file outside", func(t *testing.T, dir string) {
			writeIndex(t, dir, map[string]string{"a": "../model.safetensors"})
		}, `"../model.safetensors" escapes the checkpoint directory`},
		{"corrupt header", func(t *testing.T, dir string) {
			require.NoError(t, os.WriteFile(filepath.Join(dir, "model-00002-of-00002.safetensors"), []byte("garbage!garbage"), 0o644))
		}, "model-00002-of-00002.safetensors: safetensors: invalid header"},
		{"index is not JSON", func(t *testing.T, dir string) {
			require.NoError(t, os.WriteFile(filepath.Join(dir, IndexFile), []byte("{"), 0o644))
		}, IndexFile + " is not a shard index: unexpected end of JSON input"},
		{"a weights file is a directory", func(t *testing.T, dir string) {
			p := filepath.Join(dir, "model-00002-of-00002.safetensors")
			require.NoError(t, os.Remove(p))
			require.NoError(t, os.Mkdir(p, 0o755))
		}, "model-00002-of-00002.safetensors is not a regular file"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := sharded(t)
			tc.damage(t, dir)
			_, err := Open(dir)
			require.Error(t, err)
			assert.ErrorContains(t, err, tc.err)
		})
	}
}
