package layout

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ckptfs/ckptfs/layout/export"
	"github.com/ckptfs/ckptfs/layout/internal/treetest"
	"github.com/ckptfs/ckptfs/layout/megatron"
	"github.com/ckptfs/ckptfs/layout/view"
)

// TestMegatronBridgeView: a Megatron-Bridge iter_N/ (megatron-core torch_dist
// files whose common state holds no args, the model in run_config.yaml) is
// the HF model with no --hf-config: the tensors of megatron_gpt_llama_tp2's
// HF originals, byte for byte, and a config.json with its sizes. The
// torch_dist files are megatron-core's own; run_config.yaml is written by
// hand in Megatron-Bridge's form (megatron/testdata), not by Megatron-Bridge.
func TestMegatronBridgeView(t *testing.T) {
	dir := t.TempDir()
	require.NoError(t, os.CopyFS(dir, os.DirFS(treetest.Testdata("megatron_gpt_llama_tp2", "ckpt", "iter_0000010"))))
	require.NoError(t, os.Remove(filepath.Join(dir, megatron.CommonFile)))
	rc, err := os.ReadFile(filepath.Join("megatron", "testdata", megatron.RunConfigFile))
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(filepath.Join(dir, megatron.RunConfigFile), rc, 0o644))

	c, err := Open(dir)
	require.NoError(t, err)
	v, err := view.Plan(c, view.Options{})
	if err != nil {
		c.Close()
	}
	require.NoError(t, err)
	defer v.Close()
	assert.Equal(t, "megatron-gpt", v.Mapping)
	out := filepath.Join(t.TempDir(), "out")
	require.NoError(t, export.Write(context.Background(), v, out, export.Options{BlockSize: 4096, Workers: 2}))

	want := readSafetensors(t, treetest.Testdata("megatron_gpt_llama_tp2", "expected_hf.safetensors"))
	files, err := filepath.Glob(filepath.Join(out, "*.safetensors"))
	require.NoError(t, err)
	got := readSafetensors(t, files...)
	require.Equal(t, len(want), len(got))
	for name, w := range want {
		g, ok := got[name]
		require.True(t, ok, name)
		require.Equal(t, w.shape, g.shape, name)
		require.Equal(t, w.data, g.data, name)
	}

	var gen, orig map[string]any
	b, err := os.ReadFile(filepath.Join(out, "config.json"))
	require.NoError(t, err)
	require.NoError(t, json.Unmarshal(b, &gen))
	b, err = os.ReadFile(treetest.Testdata("megatron_gpt_llama_tp2", "hf_config", "config.json"))
	require.NoError(t, err)
	require.NoError(t, json.Unmarshal(b, &orig))
	for _, k := range []string{"architectures", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
		"num_key_value_heads", "head_dim", "vocab_size", "tie_word_embeddings", "rms_norm_eps", "max_position_embeddings", "model_type"} {
		assert.Equal(t, orig[k], gen[k], k)
	}
	assert.Equal(t, 10000.0, gen["rope_theta"])
	assert.Equal(t, "Megatron-Bridge run_config.yaml", gen["ckptfs_generated_from"])
}

// TestNeMo2SelectModule: what the NeMo 2 note tells a user to pass
// (--select module --hf-config DIR) makes the HF model of megatron-core's
// torch_dist files whose keys are under "module." (renamed in memory: no
// NeMo 2 fixture was written by NeMo here).
func TestNeMo2SelectModule(t *testing.T) {
	dir := t.TempDir()
	require.NoError(t, os.CopyFS(dir, os.DirFS(treetest.Testdata("megatron_gpt_llama_tp2", "ckpt", "iter_0000010"))))
	require.NoError(t, os.Remove(filepath.Join(dir, megatron.CommonFile)))
	c, err := Open(dir)
	require.NoError(t, err)
	for _, tn := range c.Tensors {
		tn.Name = "module." + tn.Name
	}
	v, err := view.Plan(c, view.Options{Select: "module", HFConfigDir: treetest.Testdata("megatron_gpt_llama_tp2", "hf_config")})
	if err != nil {
		c.Close()
	}
	require.NoError(t, err)
	defer v.Close()
	assert.Equal(t, "megatron-gpt", v.Mapping)
	out := filepath.Join(t.TempDir(), "out")
	require.NoError(t, export.Write(context.Background(), v, out, export.Options{BlockSize: 4096, Workers: 2}))
	want := readSafetensors(t, treetest.Testdata("megatron_gpt_llama_tp2", "expected_hf.safetensors"))
	files, err := filepath.Glob(filepath.Join(out, "*.safetensors"))
	require.NoError(t, err)
	got := readSafetensors(t, files...)
	require.Equal(t, len(want), len(got))
	for name, w := range want {
		require.Equal(t, w.data, got[name].data, name)
	}
}
