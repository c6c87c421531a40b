package layout

import (
	"encoding/json"
	"io"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/ckptfs/ckptfs/layout/ckpt"
	"github.com/ckptfs/ckptfs/safetensors"
)

func scalar(name string, path ...string) *ckpt.Tensor {
	return &ckpt.Tensor{Name: name, Path: path, DType: safetensors.F32, Shape: []int64{2},
		Chunks: []ckpt.Chunk{{Offsets: []int64{0}, Sizes: []int64{2}, Source: &memSource{data: make([]byte, 8)}}}}
}

func viewNames(t *testing.T, c *ckpt.Checkpoint, opts PlanOptions) []string {
	t.Helper()
	v, err := Plan(c, opts)
	require.NoError(t, err)
	var names []string
	for _, p := range v.Tensors {
		names = append(names, p.Name)
	}
	return names
}

func TestSelect(t *testing.T) {
	nested := &ckpt.Checkpoint{Dir: t.TempDir(), Tensors: []*ckpt.Tensor{
		scalar("model.l1.weight", "model", "l1.weight"),
		scalar("model.layers.0.w", "model", "layers", "0", "w"),
		scalar("optimizer.state.l1.weight.exp_avg", "optimizer", "state", "l1.weight", "exp_avg"),
		scalar("extra.t", "extra", "t"),
	}}
	require.Equal(t, []string{"l1.weight", "layers.0.w"}, viewNames(t, nested, PlanOptions{}))
	require.Equal(t, []string{"t"}, viewNames(t, nested, PlanOptions{Select: "extra"}))
	require.Equal(t, []string{"0.w"}, viewNames(t, nested, PlanOptions{Select: "model.layers"}))
	_, err := Plan(nested, PlanOptions{Select: "nope"})
	require.ErrorContains(t, err, `"nope" matches no tensor`)

	// A flat module state dict whose keys happen to start with "model.":
	// planner_data says there is no nesting, so nothing is stripped.
	flat := &ckpt.Checkpoint{Dir: t.TempDir(), Tensors: []*ckpt.Tensor{
		scalar("model.embed.weight", "model.embed.weight"),
		scalar("lm_head.weight", "lm_head.weight"),
	}}
	require.Equal(t, []string{"model.embed.weight", "lm_head.weight"}, viewNames(t, flat, PlanOptions{}))

	// No nesting information (Megatron, HF-sharded): optimizer keys are dropped by name.
	megatron := &ckpt.Checkpoint{Dir: t.TempDir(), Tensors: []*ckpt.Tensor{
		scalar("decoder.layers.w"),
		scalar("optimizer.state.exp_avg.decoder.layers.w"),
	}}
	require.Equal(t, []string{"decoder.layers.w"}, viewNames(t, megatron, PlanOptions{}))
}

func TestSplitAndIndex(t *testing.T) {
	dir := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(dir, "config.json"), []byte(`{"a":1}`), 0o644))
	require.NoError(t, os.WriteFile(filepath.Join(dir, "train_state.pt"), []byte(`x`), 0o644))
	c := &ckpt.Checkpoint{Dir: dir}
	for _, n := range []string{"a", "b", "c", "d", "e"} {
		c.Tensors = append(c.Tensors, scalar(n, n))
	}
	v, err := Plan(c, PlanOptions{MaxShardSize: 16})
	require.NoError(t, err)
	var names []string
	for _, f := range v.Files {
		names = append(names, f.Name)
	}
	require.Equal(t, []string{"model-00001-of-00003.safetensors", "model-00002-of-00003.safetensors",
		"model-00003-of-00003.safetensors", IndexName, "config.json"}, names)
	data, err := io.ReadAll(io.NewSectionReader(v.Lookup(IndexName), 0, v.Lookup(IndexName).Size))
	require.NoError(t, err)
	var index struct {
		Metadata  map[string]int64  `json:"metadata"`
		WeightMap map[string]string `json:"weight_map"`
	}
	require.NoError(t, json.Unmarshal(data, &index))
	require.Equal(t, int64(40), index.Metadata["total_size"])
	require.Equal(t, "model-00003-of-00003.safetensors", index.WeightMap["e"])

	// every view file is a valid safetensors file of the planned size
	for _, f := range v.Files[:3] {
		h, err := safetensors.ReadHeader(f, f.Size)
		require.NoError(t, err, f.Name)
		require.Equal(t, map[string]string{"format": "pt"}, h.Metadata)
		require.Zero(t, h.DataStart%8, "header padded to 8 bytes")
	}

	// A checkpoint's own file index wins over the size split.
	c.FileIndex = map[string]int{"a": 2, "b": 1, "c": 2, "d": 1, "e": 1}
	v, err = Plan(c, PlanOptions{MaxShardSize: 16})
	require.NoError(t, err)
	require.Equal(t, []string{"b", "d", "e"}, tensorNames(v.Files[0]))
	require.Equal(t, []string{"a", "c"}, tensorNames(v.Files[1]))
}

func tensorNames(f *File) []string {
	var out []string
	for _, p := range f.Placements() {
		out = append(out, p.Name)
	}
	return out
}

func TestHFConfigFallback(t *testing.T) {
	cfg := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(cfg, "config.json"), []byte(`{}`), 0o644))
	require.NoError(t, os.WriteFile(filepath.Join(cfg, "tokenizer.json"), []byte(`{}`), 0o644))
	c := &ckpt.Checkpoint{Dir: t.TempDir(), Tensors: []*ckpt.Tensor{scalar("a", "a")}}
	v, err := Plan(c, PlanOptions{HFConfigDir: cfg})
	require.NoError(t, err)
	require.NotNil(t, v.Lookup("config.json"))
	require.NotNil(t, v.Lookup("tokenizer.json"))
	require.Nil(t, v.Lookup("train_state.pt"))
}
