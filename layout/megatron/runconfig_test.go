package megatron

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ckptfs/ckptfs/layout/internal/treetest"
)

// bridgeModel is testdata/run_config.yaml: a run_config.yaml written by
// hand in the form Megatron-Bridge writes it, not by Megatron-Bridge.
var bridgeModel = func() string {
	b, err := os.ReadFile(filepath.Join("testdata", RunConfigFile))
	if err != nil {
		panic(err)
	}
	return string(b)
}()

// writeBridge makes dir a Megatron-Bridge-like iter_N/: the torch_dist
// files megatron-core wrote for megatron_gpt_llama_tp2 without common.pt
// (Megatron-Bridge stores no args there), and run_config.yaml.
func writeBridge(t testing.TB, dir, runConfig string) {
	t.Helper()
	require.NoError(t, os.CopyFS(dir, os.DirFS(treetest.Testdata("megatron_gpt_llama_tp2", "ckpt", "iter_0000010"))))
	require.NoError(t, os.Remove(filepath.Join(dir, CommonFile)))
	require.NoError(t, os.WriteFile(filepath.Join(dir, RunConfigFile), []byte(runConfig), 0o644))
}

func TestRunConfigArgs(t *testing.T) {
	args, err := parseRunConfig([]byte(bridgeModel))
	require.NoError(t, err)
	assert.Equal(t, Args{
		"num_layers": int64(2), "hidden_size": int64(48), "num_attention_heads": int64(4), "ffn_hidden_size": int64(96),
		"kv_channels": int64(12), "vocab_size": int64(120), "num_query_groups": int64(2), "normalization": "RMSNorm",
		"position_embedding_type": "rope", "rotary_base": 10000.0, "rotary_percent": 1.0, "rotary_interleaved": false,
		"add_bias_linear": false, "add_qkv_bias": false, "qk_layernorm": false, "bf16": false,
		"make_vocab_size_divisible_by": int64(128), "norm_epsilon": 1e-05, "max_position_embeddings": int64(256),
		"group_query_attention": true, "untie_embeddings_and_output_weights": true, "swiglu": true,
		"use_rope_scaling": false,
	}, args)

	// Llama 3.1's provider scales RoPE: said, so that no config.json
	// claims plain RoPE.
	scaled, err := parseRunConfig([]byte(strings.Replace(bridgeModel, "  vocab_size: 120\n", "  vocab_size: 120\n  scale_factor: 32.0\n", 1)))
	require.NoError(t, err)
	assert.Equal(t, true, scaled["use_rope_scaling"])
	_, err = runConfigRecord{args: scaled}.HFConfig(target("megatron-gpt"))
	assert.ErrorContains(t, err, "RoPE scaling")
}

// TestBridgeRecord: a Megatron-Bridge directory's record is its
// run_config.yaml, and the config.json it makes says so.
func TestBridgeRecord(t *testing.T) {
	dir := t.TempDir()
	writeBridge(t, dir, bridgeModel)
	c, err := Open(dir)
	require.NoError(t, err)
	defer c.Close()
	assert.Empty(t, c.Warnings)
	require.NotNil(t, c.Record)
	assert.Equal(t, "run_config.yaml model", c.Record.Source())
	p, tied, _ := c.Record.Params()
	assert.False(t, tied)
	assert.Equal(t, map[string]int64{"heads": 4, "kv_heads": 2, "head_dim": 12, "hidden": 48, "vocab": 120, "layers": 2, "ffn": 96}, p)
	b, err := c.Record.HFConfig(target("megatron-gpt"))
	require.NoError(t, err)
	assert.Contains(t, string(b), `"ckptfs_generated_from": "Megatron-Bridge run_config.yaml"`)

	// A run_config.yaml that cannot be read is a warning naming it; the
	// tensors are still shown.
	bad := t.TempDir()
	writeBridge(t, bad, "model: [1, 2]\n")
	c2, err := Open(bad)
	require.NoError(t, err)
	defer c2.Close()
	require.Len(t, c2.Warnings, 1)
	assert.Contains(t, c2.Warnings[0], filepath.Join(bad, RunConfigFile))
	assert.Nil(t, c2.Record)
}

func TestRunConfigHostile(t *testing.T) {
	for _, tc := range []struct{ name, yaml, err string }{
		{"not yaml", "model: {", "yaml:"},
		{"no model", "train: {train_iters: 1}\n", "no model section"},
		{"model a list", "model: [1, 2]\n", "cannot unmarshal"},
		{"not a GPT provider", "model: {_target_: x.Y, hidden_size: 4}\n", "no num_layers: not a GPT model provider (model._target_ x.Y)"},
		{"num_layers a string", "model: {num_layers: two}\n", "no num_layers"},
		{"alias bomb", aliasBomb(), "excessive aliasing"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := parseRunConfig([]byte(tc.yaml))
			require.ErrorContains(t, err, tc.err)
		})
	}
	dir := t.TempDir()
	writeBridge(t, dir, "model:\n"+strings.Repeat("  # padding\n", maxRunConfigBytes/12+1))
	c, err := Open(dir)
	require.NoError(t, err)
	defer c.Close()
	require.Len(t, c.Warnings, 1)
	assert.Contains(t, c.Warnings[0], RunConfigFile)
}

// aliasBomb is a YAML "billion laughs" under model.
func aliasBomb() string {
	var b bytes.Buffer
	b.WriteString("a0: &a0 [x, x, x, x, x, x, x, x, x, x]\n")
	for i := 1; i < 9; i++ {
		b.WriteString("a" + string(rune('0'+i)) + ": &a" + string(rune('0'+i)) + " [")
		for j := 0; j < 10; j++ {
			if j > 0 {
				b.WriteString(", ")
			}
			b.WriteString("*a" + string(rune('0'+i-1)))
		}
		b.WriteString("]\n")
	}
	b.WriteString("model: {num_layers: 2, x: *a8}\n")
	return b.String()
}

func FuzzRunConfig(f *testing.F) {
	f.Add([]byte(bridgeModel))
	f.Add([]byte(aliasBomb()))
	f.Fuzz(func(t *testing.T, b []byte) {
		args, err := parseRunConfig(b)
		if err == nil {
			_, _, _ = args.Params()
			_, _ = args.HFConfig(target("megatron-gpt"))
		}
	})
}

// A torch_dist folder with no model configuration whose model keys are all
// under "module." (NeMo 2's weights/) gets one line saying what is missing
// and what to pass. The keys are renamed in memory: no NeMo 2 fixture was
// written by NeMo here.
func TestNeMo2Note(t *testing.T) {
	dir := t.TempDir()
	writeBridge(t, dir, "")
	require.NoError(t, os.Remove(filepath.Join(dir, RunConfigFile)))
	c, err := Open(dir)
	require.NoError(t, err)
	defer c.Close()
	assert.Nil(t, c.Record)
	assert.Empty(t, nemo2Note(c), "Megatron-LM's own keys are not NeMo 2's")
	for _, tn := range c.Tensors {
		tn.Name = nemo2Prefix + tn.Name
	}
	note := nemo2Note(c)
	assert.Contains(t, note, dir+": no model configuration")
	assert.Contains(t, note, `the 9 model keys are under "module."`)
	assert.Contains(t, note, "pass --select module --hf-config DIR")
	c.Tensors[0].Name = "embedding.word_embeddings.weight"
	assert.Empty(t, nemo2Note(c), "one key outside module.: not NeMo 2's layout")
}
