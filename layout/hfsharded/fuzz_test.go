package hfsharded

import (
	"encoding/json"
	"io"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/ckptfs/ckptfs/layout/ckpt"
)

// fuzzedShard is the name the fuzz input takes among the fixture's shards.
const fuzzedShard = "shard-00001-model-00001-of-00002.safetensors"

// FuzzOpen opens the hf_sharded fixture with one shard replaced by the fuzz
// input (its safetensors header and DCP_SHARDING_INFO) and, when the second
// input is not empty, NeMo's file index beside it. Whatever it holds, Open
// never panics, and a checkpoint it accepts tiles every tensor and serves
// every chunk's bytes from within its shard.
func FuzzOpen(f *testing.F) {
	src := filepath.Join("..", "..", "testdata", "hf_sharded", "ckpt")
	shards, err := filepath.Glob(filepath.Join(src, "shard-*.safetensors"))
	require.NoError(f, err)
	require.NotEmpty(f, shards)
	for _, p := range shards {
		b, err := os.ReadFile(p)
		require.NoError(f, err)
		f.Add(b, []byte(nil))
		f.Add(b, []byte(`{"w": 1}`))
	}
	real, err := os.ReadFile(filepath.Join(src, fuzzedShard))
	require.NoError(f, err)
	f.Add(real[:len(real)/2], []byte(nil))
	f.Add(real, []byte(`{"a": 0, "b": -1, "c": 2}`))
	f.Add(real, []byte(`[]`))

	dir := filepath.Join(f.TempDir(), "ckpt")
	require.NoError(f, os.CopyFS(dir, os.DirFS(src)))
	require.NoError(f, os.MkdirAll(filepath.Join(dir, filepath.Dir(FileIndexName)), 0o755))
	f.Fuzz(func(t *testing.T, shard, index []byte) {
		require.NoError(t, os.WriteFile(filepath.Join(dir, fuzzedShard), shard, 0o644))
		indexPath := filepath.Join(dir, FileIndexName)
		os.Remove(indexPath)
		if len(index) > 0 {
			require.NoError(t, os.WriteFile(indexPath, index, 0o644))
		}
		c, err := Open(dir)
		if err != nil {
			return
		}
		defer c.Close()
		for _, tn := range c.Tensors {
			if err := tn.Validate(); err != nil {
				t.Fatalf("Open accepted tensor %q: %v", tn.Name, err)
			}
			for _, ch := range tn.Chunks.All() {
				n, _ := ckpt.NumElements(ch.Sizes)
				n *= int64(tn.DType.Size())
				if n > 1<<20 {
					continue
				}
				buf := make([]byte, n)
				if k, err := ch.Source.ReadAt(buf, 0); int64(k) != n || (err != nil && err != io.EOF) {
					t.Fatalf("tensor %q chunk %v: read %d of %d bytes: %v", tn.Name, ch.Offsets, k, n, err)
				}
			}
		}
	})
}

// FuzzParseFileIndex: NeMo's file index parses or fails, never panics, and
// what it accepts reads back the same.
func FuzzParseFileIndex(f *testing.F) {
	for _, seed := range []string{`{"model.embed_tokens.weight": 1, "lm_head.weight": 2}`, `{}`, `null`,
		`{"a": 1.5}`, `{"a": 99999999999999999999}`, `{"a": -1, "a": 2}`, `{"\ud800": 1}`, `[1, 2]`} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		m, err := parseFileIndex(data)
		if err != nil {
			return
		}
		b, err := json.Marshal(m)
		if err != nil {
			t.Fatalf("%v does not marshal: %v", m, err)
		}
		back, err := parseFileIndex(b)
		if err != nil || len(back) != len(m) {
			t.Fatalf("%v reads back as %v, %v", m, back, err)
		}
		for k, v := range m {
			if back[k] != v {
				t.Fatalf("%q: %d reads back as %d", k, v, back[k])
			}
		}
	})
}

// FuzzParseShardingInfo checks the ordered decoder of DCP_SHARDING_INFO
// against json.Unmarshal: the same offsets, or an error from both, and
// every name listed once.
func FuzzParseShardingInfo(f *testing.F) {
	for _, s := range []string{`{"a": {"saved_offsets": [1, 0]}, "b": {}}`, `null`, `{}`, `{"a": 1}`, `[]`,
		`{"a": {"saved_offsets": [1]}, "a": null}`, `{"a": {"SAVED_OFFSETS": [2]}}`,
		// The forms scanShardingInfo reads without encoding/json, and near misses.
		`{"a.b": {"saved_offsets": [0, 128]}, "c": {"saved_offsets": []}, "a.b": {"saved_offsets": [7]}}`,
		`{"a":{"saved_offsets":[01]}}`, `{"a":{"saved_offsets":[-0]}}`, `{"a":{"saved_offsets":[9223372036854775808]}}`,
		`{"a":{"saved_offsets":[9223372036854775807]}}`, `{"a":{"saved_offsets":[1.0]}}`, `{"a":{"saved_offsets":[1,]}}`,
		`{"a":{"saved_offsets":[1]},}`, `{"a":{"saved_offsets":[1]}} x`, `{"a":{"saved_offsets":[1]}`, `{"\u0061":{"saved_offsets":[1]}}`,
		"{\"a\x01\":{\"saved_offsets\":[1]}}", "{\"\xff\":{\"saved_offsets\":[1]}}", `{"a":{"saved_offsets":[1],"saved_offsets":[2]}}`,
		`{"a":{"saved_offsets":null}}`, ` { "a" : { "saved_offsets" : [ 1 , 2 ] } } `} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, raw string) {
		names, offsets, err := parseShardingInfo(raw)
		var want map[string]struct {
			SavedOffsets []int64 `json:"saved_offsets"`
		}
		werr := json.Unmarshal([]byte(raw), &want)
		if werr != nil {
			require.Error(t, err, "json.Unmarshal: %v", werr)
			return
		}
		require.NoError(t, err)
		require.Len(t, offsets, len(want))
		require.Len(t, names, len(want))
		for _, n := range names {
			w, ok := want[n]
			require.True(t, ok, n)
			require.Equal(t, w.SavedOffsets, offsets[n], n)
		}
	})
}
