package view

import (
	"bytes"
	"maps"
	"path/filepath"
	"slices"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ckptfs/ckptfs/layout"
)

// viewBytes plans the default view of the checkpoint in dir and returns
// every view file's bytes by name.
func viewBytes(t *testing.T, dir string) (map[string][]byte, *View) {
	t.Helper()
	c, err := layout.Open(dir)
	require.NoError(t, err)
	v, err := Plan(c, Options{})
	if err != nil {
		c.Close()
	}
	require.NoError(t, err)
	t.Cleanup(func() { v.Close() })
	out := map[string][]byte{}
	for _, f := range v.Files {
		b := make([]byte, f.Size)
		n, err := f.ReadAt(b, 0)
		require.Equal(t, len(b), n, "%s: %v", f.Name, err)
		out[f.Name] = b
	}
	return out, v
}

// megatron-core 0.19.2 keeps the common state (args) inside the DCP files
// (common_state/shard_0_1), not in common.pt: the view of the same model
// saved by it is the view of the 0.16.1 save, file for file and byte for
// byte (config.json made from the args, the megatron-gpt mapping applied),
// with the same warnings (none about the args).
func TestMegatronCore019ViewEqualsMegatronCore016(t *testing.T) {
	old, vOld := viewBytes(t, filepath.Join("..", "..", "testdata", "megatron_gpt_llama_tp2", "ckpt", "iter_0000010"))
	cur, vCur := viewBytes(t, filepath.Join("..", "..", "testdata", "megatron_gpt_llama_tp2_mcore019", "ckpt", "iter_0000010"))
	assert.FileExists(t, filepath.Join("..", "..", "testdata", "megatron_gpt_llama_tp2", "ckpt", "iter_0000010", "common.pt"))
	assert.NoFileExists(t, filepath.Join("..", "..", "testdata", "megatron_gpt_llama_tp2_mcore019", "ckpt", "iter_0000010", "common.pt"))

	assert.Equal(t, "megatron-gpt", vOld.Mapping)
	assert.Equal(t, "megatron-gpt", vCur.Mapping)
	assert.Equal(t, vOld.Warnings, vCur.Warnings)
	assert.Equal(t, vOld.Checkpoint.Record, vCur.Checkpoint.Record)
	require.NotNil(t, cur["config.json"], "0.19.2 view has a config.json made from the args")
	require.Equal(t, slices.Sorted(maps.Keys(old)), slices.Sorted(maps.Keys(cur)))
	for name, b := range old {
		assert.True(t, bytes.Equal(b, cur[name]), "%s differs", name)
	}
	require.Equal(t, len(vOld.Tensors), len(vCur.Tensors))
	for i, p := range vOld.Tensors {
		q := vCur.Tensors[i]
		assert.Equal(t, p.Name, q.Name)
		assert.Equal(t, p.content.dtype(), q.content.dtype(), p.Name)
		assert.Equal(t, p.content.shape(), q.content.shape(), p.Name)
	}
}

// With singleton local shards megatron-core saves one key per layer and
// per expert and splits SwiGLU linear_fc1 into _w and _v: the view of that
// save is the view of the default save of the same model (TP2 × EP2 MoE),
// byte for byte, config.json included.
func TestMegatronSingletonViewEqualsStacked(t *testing.T) {
	stacked, vStacked := viewBytes(t, filepath.Join("..", "..", "testdata", "megatron_gpt_mixtral_tp2ep2", "ckpt", "iter_0000010"))
	single, vSingle := viewBytes(t, filepath.Join("..", "..", "testdata", "megatron_gpt_mixtral_tp2ep2_singleton", "ckpt", "iter_0000010"))
	assert.Equal(t, "megatron-mixtral", vStacked.Mapping)
	assert.Equal(t, "megatron-mixtral", vSingle.Mapping)
	assert.Empty(t, vSingle.Omitted)
	require.Equal(t, slices.Sorted(maps.Keys(stacked)), slices.Sorted(maps.Keys(single)))
	for name, b := range stacked {
		assert.True(t, bytes.Equal(b, single[name]), "%s differs", name)
	}
	assert.Contains(t, string(single["config.json"]), `"MixtralForCausalLM"`)
}
