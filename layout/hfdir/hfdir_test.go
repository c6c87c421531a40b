package hfdir

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestShardName(t *testing.T) {
	assert.Equal(t, "model.safetensors", ShardName(0, 1))
	assert.Equal(t, "model-00001-of-00003.safetensors", ShardName(0, 3))
	assert.Equal(t, "model-00003-of-00003.safetensors", ShardName(2, 3))
	for i := range 3 {
		assert.Equal(t, Weights, KindOf(ShardName(i, 3)))
	}
}

func TestKindOf(t *testing.T) {
	for name, want := range map[string]Kind{
		"model.safetensors":                Weights,
		"model-00001-of-00002.safetensors": Weights,
		"model.safetensors.index.json":     Index,
		"adapter.safetensors.index.json":   Index,
		"config.json":                      Sidecar,
		"pytorch_model.bin":                Sidecar,
		"model.safetensors.tmp":            Sidecar,
		"safetensors":                      Sidecar,
	} {
		assert.Equal(t, want, KindOf(name), name)
	}
}

func TestIndexRoundTrip(t *testing.T) {
	x := ShardIndex{TotalSize: 42, WeightMap: map[string]string{"a": ShardName(0, 2), "b": ShardName(1, 2)}}
	b, err := x.Encode()
	require.NoError(t, err)
	assert.True(t, strings.HasSuffix(string(b), "}\n"))
	assert.Contains(t, string(b), `"total_size": 42`)
	got, err := ParseIndex(b, SafetensorsIndex)
	require.NoError(t, err)
	assert.Equal(t, x.WeightMap, got.WeightMap)
}

func TestParseIndexHostile(t *testing.T) {
	for _, tc := range []struct{ name, doc, want string }{
		{"not json", `{"weight_map": `, "is not a shard index"},
		{"no weight_map", `{"metadata": {}}`, "has no weight_map"},
		{"null weight_map", `{"weight_map": null}`, "has no weight_map"},
		{"weight_map not a map", `{"weight_map": ["a"]}`, "is not a shard index"},
		{"file not a string", `{"weight_map": {"a": 1}}`, "is not a shard index"},
		{"too large", `{"weight_map": {}}` + strings.Repeat(" ", MaxIndexBytes), "more than"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := ParseIndex([]byte(tc.doc), "x/"+SafetensorsIndex)
			require.Error(t, err)
			assert.Contains(t, err.Error(), tc.want)
			assert.Contains(t, err.Error(), "x/"+SafetensorsIndex)
		})
	}
	idx, err := ParseIndex([]byte(`{"weight_map": {}}`), SafetensorsIndex)
	require.NoError(t, err, "an empty map is an index of a model still being written")
	assert.Empty(t, idx.WeightMap)
}

func FuzzParseIndex(f *testing.F) {
	f.Add([]byte(`{"metadata": {"total_size": 4}, "weight_map": {"a": "model.safetensors"}}`))
	f.Add([]byte(`{"weight_map": {"a": "\u0000"}}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		idx, err := ParseIndex(b, SafetensorsIndex)
		if err != nil {
			return
		}
		enc, err := ShardIndex{WeightMap: idx.WeightMap}.Encode()
		require.NoError(t, err)
		again, err := ParseIndex(enc, SafetensorsIndex)
		require.NoError(t, err)
		assert.Equal(t, idx.WeightMap, again.WeightMap)
	})
}

func TestIsKnownSidecar(t *testing.T) {
	for name, want := range map[string]bool{
		"config.json": true, "tokenizer.json": true, "cl100k_base.tiktoken": true, "chat_template.jinja": true,
		"model.safetensors": false, "notes.txt": false, "config.json.bak": false, "sub/config.json": false,
	} {
		assert.Equal(t, want, IsKnownSidecar(name), name)
	}
}
