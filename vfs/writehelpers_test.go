package vfs

// Helpers of the write path tests: model files, and what a target holds.

import (
	"bytes"
	"encoding/json"
	"math/rand"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/ckptfs/ckptfs/internal/stwrite"
	"github.com/ckptfs/ckptfs/layout/dcpwrite"
	"github.com/ckptfs/ckptfs/layout/hfdir"
	"github.com/ckptfs/ckptfs/layout/hfwrite"
	"github.com/ckptfs/ckptfs/safetensors"
)

// tspec is one tensor of a test safetensors file.
type tspec struct {
	name  string
	dtype safetensors.DType
	shape []int64
}

// llamaA and llamaB are the two shards of a tiny Llama-style model, with odd
// sizes so shards are uneven, plus a scalar and an empty tensor.
var (
	llamaA = []tspec{
		{"model.embed_tokens.weight", safetensors.BF16, []int64{131, 64}},
		{"model.layers.0.self_attn.q_proj.weight", safetensors.F32, []int64{64, 64}},
		{"model.layers.0.self_attn.o_proj.weight", safetensors.F32, []int64{64, 64}},
		{"model.layers.0.input_layernorm.weight", safetensors.F32, []int64{64}},
	}
	llamaB = []tspec{
		{"model.layers.0.mlp.gate_proj.weight", safetensors.F16, []int64{88, 64}},
		{"model.layers.0.mlp.down_proj.weight", safetensors.F16, []int64{64, 88}},
		{"model.norm.weight", safetensors.F32, []int64{64}},
		{"lm_head.weight", safetensors.BF16, []int64{131, 64}},
		{"step", safetensors.I64, []int64{}},
		{"empty", safetensors.F32, []int64{0, 4}},
	}
)

// writeST writes a safetensors file of specs with random bytes and returns
// the bytes of each tensor.
func writeST(t *testing.T, path string, seed int64, specs ...tspec) map[string][]byte {
	t.Helper()
	infos := make([]safetensors.TensorInfo, len(specs))
	for i, s := range specs {
		infos[i] = safetensors.TensorInfo{Name: s.name, DType: s.dtype, Shape: s.shape}
	}
	stwrite.SortForWrite(infos)
	infos = safetensors.Layout(infos)
	var buf bytes.Buffer
	w, err := stwrite.NewWriter(&buf, map[string]string{"format": "pt"}, infos)
	require.NoError(t, err)
	rng := rand.New(rand.NewSource(seed))
	out := map[string][]byte{}
	for _, ti := range infos {
		b := make([]byte, ti.Size())
		rng.Read(b)
		out[ti.Name] = b
		_, err := w.Write(b)
		require.NoError(t, err)
	}
	require.NoError(t, w.Close())
	require.NoError(t, os.WriteFile(path, buf.Bytes(), 0o644))
	return out
}

// readTensors reads every tensor of the safetensors files in dir.
func readTensors(t *testing.T, dir string) map[string][]byte {
	t.Helper()
	out := map[string][]byte{}
	paths, err := filepath.Glob(filepath.Join(dir, "*.safetensors"))
	require.NoError(t, err)
	for _, p := range paths {
		data, err := os.ReadFile(p)
		require.NoError(t, err)
		h, err := safetensors.ReadHeader(bytes.NewReader(data), int64(len(data)))
		require.NoError(t, err, p)
		for _, ti := range h.Tensors {
			_, dup := out[ti.Name]
			require.False(t, dup, ti.Name)
			out[ti.Name] = data[h.DataStart+ti.Begin : h.DataStart+ti.End]
		}
	}
	return out
}

func merge(ms ...map[string][]byte) map[string][]byte {
	out := map[string][]byte{}
	for _, m := range ms {
		for k, v := range m {
			out[k] = v
		}
	}
	return out
}

func writable(target dcpwrite.Target) func(*Options) {
	return func(o *Options) { o.Writable, o.Target = true, target }
}

// writeFile writes data to path through the mount and returns close's error.
func writeFile(t *testing.T, path string, data []byte) error {
	t.Helper()
	f, err := os.Create(path)
	require.NoError(t, err)
	_, err = f.Write(data)
	require.NoError(t, err)
	// fsync waits for the queued writes and reports none failed.
	require.NoError(t, f.Sync())
	return f.Close()
}

// spoolFiles lists what is left in a target's spool.
func spoolFiles(t *testing.T, dir string) []string {
	t.Helper()
	ents, err := os.ReadDir(filepath.Join(dir, hfwrite.SpoolDir))
	if os.IsNotExist(err) {
		return nil
	}
	require.NoError(t, err)
	var names []string
	for _, e := range ents {
		names = append(names, e.Name())
	}
	return names
}

// shardFiles lists the DCP files of a backing directory.
func shardFiles(t *testing.T, dir string) []string {
	t.Helper()
	var out []string
	for _, n := range listDir(t, dir) {
		if n == ".metadata" || strings.HasSuffix(n, ".distcp") || n == ".metadata.tmp" {
			out = append(out, n)
		}
	}
	return out
}

// hfDir writes a two-shard HF model directory and returns it with its
// tensors.
func hfDir(t *testing.T) (string, map[string][]byte) {
	t.Helper()
	in := t.TempDir()
	a := writeST(t, filepath.Join(in, "model-00001-of-00002.safetensors"), 1, llamaA...)
	b := writeST(t, filepath.Join(in, "model-00002-of-00002.safetensors"), 2, llamaB...)
	wm := map[string]string{}
	for n := range a {
		wm[n] = "model-00001-of-00002.safetensors"
	}
	for n := range b {
		wm[n] = "model-00002-of-00002.safetensors"
	}
	idx, err := json.Marshal(map[string]any{"metadata": map[string]any{"total_size": 1}, "weight_map": wm})
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(filepath.Join(in, hfdir.SafetensorsIndex), idx, 0o644))
	require.NoError(t, os.WriteFile(filepath.Join(in, "config.json"), []byte(`{"model_type": "llama"}`+"\n"), 0o644))
	require.NoError(t, os.WriteFile(filepath.Join(in, "tokenizer.json"), []byte(`{"version": "1.0"}`), 0o644))
	return in, merge(a, b)
}
