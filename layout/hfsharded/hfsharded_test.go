package hfsharded

import (
	"encoding/json"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ckptfs/ckptfs/internal/stwrite"
	"github.com/ckptfs/ckptfs/layout/ckpt"
	"github.com/ckptfs/ckptfs/layout/internal/treetest"
	"github.com/ckptfs/ckptfs/layout/source"
	"github.com/ckptfs/ckptfs/safetensors"
)

func fixture(t *testing.T) string {
	t.Helper()
	src := filepath.Join("..", "..", "testdata", "hf_sharded", "ckpt")
	dst := filepath.Join(t.TempDir(), "ckpt")
	require.NoError(t, os.CopyFS(dst, os.DirFS(src)))
	return dst
}

func TestOpenTorchWrittenShards(t *testing.T) {
	dir := fixture(t)
	require.True(t, treetest.Detect(t, Reader, dir))
	c, err := Open(dir)
	require.NoError(t, err)
	defer c.Close()
	require.Equal(t, ckpt.FormatHFSharded, c.Format)
	require.NotEmpty(t, c.Tensors)
	var names []string
	for _, tensor := range c.Tensors {
		require.NoError(t, tensor.Validate())
		require.Contains(t, c.FileIndex, tensor.Name, "the model-N-of-M file split is kept")
		names = append(names, tensor.Name)
	}
	// The order torch saved them in (its DCP_SHARDING_INFO lists), model
	// file by model file; the shard files store them sorted by alignment
	// and name instead (extra.int64_7x2 first).
	require.Equal(t, []string{"emb.weight", "extra.bf16_6x4", "extra.f64_3", "extra.int64_7x2", "extra.int32_5",
		"fc1.weight", "fc1.bias", "fc2.weight", "norm.weight", "norm.bias"}, names)
	// So a view reads the shard files out of their order (they are told so).
	require.True(t, ckpt.OutOfFileOrder(c.Tensors))
}

func TestParseShardingInfo(t *testing.T) {
	cases := map[string]struct {
		raw     string
		names   []string
		offsets map[string][]int64
		err     string
	}{
		"in order":        {raw: `{"b": {"saved_offsets": [1, 0]}, "a": {"saved_offsets": [0]}}`, names: []string{"b", "a"}, offsets: map[string][]int64{"b": {1, 0}, "a": {0}}},
		"empty":           {raw: `{}`, offsets: map[string][]int64{}},
		"null":            {raw: `null`},
		"null entry":      {raw: `{"a": null}`, names: []string{"a"}, offsets: map[string][]int64{"a": nil}},
		"listed twice":    {raw: `{"a": {"saved_offsets": [1]}, "b": {}, "a": {"saved_offsets": [2]}}`, names: []string{"a", "b"}, offsets: map[string][]int64{"a": {2}, "b": nil}},
		"other fields":    {raw: `{"a": {"saved_offsets": [3], "x": 1}}`, names: []string{"a"}, offsets: map[string][]int64{"a": {3}}},
		"not an object":   {raw: `[1]`, err: "not a JSON object"},
		"not JSON":        {raw: `{nope`, err: "invalid character"},
		"cut":             {raw: `{"a": {"saved_offsets": [1`, err: "EOF"},
		"trailing data":   {raw: `{} {}`, err: "data after the JSON value"},
		"bad offsets":     {raw: `{"a": {"saved_offsets": "x"}}`, err: "cannot unmarshal"},
		"entry not dict":  {raw: `{"a": 5}`, err: "cannot unmarshal"},
		"empty input":     {raw: ``, err: "EOF"},
		"trailing spaces": {raw: "{} \n", offsets: map[string][]int64{}},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			names, offsets, err := parseShardingInfo(tc.raw)
			if tc.err != "" {
				require.ErrorContains(t, err, tc.err)
				return
			}
			require.NoError(t, err)
			require.Equal(t, tc.names, names)
			require.Equal(t, tc.offsets, offsets)
		})
	}
}

// Detection is by name; a file named like a shard but without
// DCP_SHARDING_INFO holds whole tensors (offsets 0), as torch's reader takes
// it.
func TestShardWithoutShardingInfo(t *testing.T) {
	dir := t.TempDir()
	require.False(t, treetest.Detect(t, Reader, dir))
	f, err := os.Create(filepath.Join(dir, "shard-00001-model-00001-of-00001.safetensors"))
	require.NoError(t, err)
	w, err := stwrite.NewWriter(f, nil, safetensors.Layout([]safetensors.TensorInfo{{Name: "a", DType: safetensors.F32, Shape: []int64{1}}}))
	require.NoError(t, err)
	_, err = w.Write(make([]byte, 4))
	require.NoError(t, err)
	require.NoError(t, w.Close())
	require.NoError(t, f.Close())
	require.True(t, treetest.Detect(t, Reader, dir))
	c, err := Open(dir)
	require.NoError(t, err)
	defer c.Close()
	require.Len(t, c.Tensors, 1)
	assert.Equal(t, []int64{1}, c.Tensors[0].Shape)
}

// rewriteShardInfo replaces one shard's DCP_SHARDING_INFO.
func rewriteShardInfo(t *testing.T, path string, edit func(map[string]map[string][]int64)) {
	t.Helper()
	f, err := os.Open(path)
	require.NoError(t, err)
	fi, _ := f.Stat()
	h, err := safetensors.ReadHeader(f, fi.Size())
	require.NoError(t, err)
	data := make([]byte, fi.Size()-h.DataStart)
	_, err = f.ReadAt(data, h.DataStart)
	require.NoError(t, err)
	f.Close()
	info := map[string]map[string][]int64{}
	require.NoError(t, json.Unmarshal([]byte(h.Metadata[ShardingInfoKey]), &info))
	edit(info)
	raw, err := json.Marshal(info)
	require.NoError(t, err)
	h.Metadata[ShardingInfoKey] = string(raw)
	header, err := safetensors.EncodeHeader(h.Metadata, h.Tensors)
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(path, append(header, data...), 0o644))
}

func TestBadShards(t *testing.T) {
	cases := map[string]struct {
		damage func(t *testing.T, dir string, shards []string)
		want   string
	}{
		"missing shard leaves a hole": {
			func(t *testing.T, dir string, shards []string) { require.NoError(t, os.Remove(shards[1])) },
			"hole in chunk coverage",
		},
		"truncated shard": {
			func(t *testing.T, dir string, shards []string) { require.NoError(t, os.Truncate(shards[0], 20)) },
			shards0,
		},
		"offsets overlap another shard": {
			func(t *testing.T, dir string, shards []string) {
				rewriteShardInfo(t, shards[1], func(m map[string]map[string][]int64) {
					for _, v := range m {
						for i := range v["saved_offsets"] {
							v["saved_offsets"][i] = 0
						}
					}
				})
			},
			"overlap",
		},
		"sharding info not JSON": {
			func(t *testing.T, dir string, shards []string) {
				f, _ := os.Open(shards[0])
				fi, _ := f.Stat()
				h, err := safetensors.ReadHeader(f, fi.Size())
				require.NoError(t, err)
				data := make([]byte, fi.Size()-h.DataStart)
				f.ReadAt(data, h.DataStart)
				f.Close()
				h.Metadata[ShardingInfoKey] = "{nope"
				header, err := safetensors.EncodeHeader(h.Metadata, h.Tensors)
				require.NoError(t, err)
				require.NoError(t, os.WriteFile(shards[0], append(header, data...), 0o644))
			},
			"not valid JSON",
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			dir := fixture(t)
			tree, err := source.OpenLocal(dir)
			require.NoError(t, err)
			shards, err := shardFiles(tree)
			tree.Close()
			require.NoError(t, err)
			for i := range shards {
				shards[i] = filepath.Join(dir, shards[i])
			}
			tc.damage(t, dir, shards)
			_, err = Open(dir)
			require.Error(t, err)
			if tc.want == shards0 {
				require.Contains(t, err.Error(), filepath.Base(shards[0]))
			} else {
				require.Contains(t, err.Error(), tc.want)
			}
		})
	}
}

// shards0 marks an expectation that the error names the first shard file.
const shards0 = "\x00first shard"

// Headers are read several at a time; of several damaged shards, the error
// names the first in order, every time.
func TestFirstBadShardIsReported(t *testing.T) {
	dir := fixture(t)
	tree, err := source.OpenLocal(dir)
	require.NoError(t, err)
	shards, err := shardFiles(tree)
	tree.Close()
	require.NoError(t, err)
	require.GreaterOrEqual(t, len(shards), 2)
	for _, s := range shards {
		require.NoError(t, os.Truncate(filepath.Join(dir, s), 20))
	}
	for range 20 {
		_, err := Open(dir)
		require.Error(t, err)
		require.Contains(t, err.Error(), shards[0])
		for _, s := range shards[1:] {
			require.NotContains(t, err.Error(), s)
		}
	}
}

// torch's form of DCP_SHARDING_INFO (json.dumps of the writer's dict) is
// read by the scanner, not by encoding/json, to the same result.
func TestShardingInfoScanned(t *testing.T) {
	raw := `{"model.layers.0.mlp.up_proj.weight": {"saved_offsets": [28, 0]}, "model.norm.weight": {"saved_offsets": [0]}, "e": {"saved_offsets": []}}`
	names, offsets, ok := scanShardingInfo(raw)
	require.True(t, ok)
	wantNames, wantOffsets, err := decodeShardingInfo(raw)
	require.NoError(t, err)
	require.Equal(t, wantNames, names)
	require.Equal(t, wantOffsets, offsets)
	require.Equal(t, []int64{28, 0}, offsets["model.layers.0.mlp.up_proj.weight"])
	_, _, ok = scanShardingInfo(`{"a": {"saved_offsets": [1], "x": 2}}`)
	require.False(t, ok, "other fields go to encoding/json")
}
