package megatron

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
)

// FuzzParseConfig: metadata.json is read from checkpoints anyone may have
// written. Parsing never panics, and what it accepts reads back the same.
func FuzzParseConfig(f *testing.F) {
	real, err := os.ReadFile(filepath.Join("..", "..", "testdata", "megatron", "ckpt", ConfigFile))
	require.NoError(f, err)
	for _, seed := range []string{string(real), `{}`, `null`, `[]`, `{"sharded_backend": 5}`,
		`{"sharded_backend": "zarr"}`, `{"sharded_backend": "torch_dist", "sharded_backend": "zarr"}`,
		`{"sharded_backend": "\u0000"}`, `{"a": {"b": [1, 2, {"c": null}]}}`} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		c, err := parseConfig(data)
		if err != nil {
			return
		}
		b, err := json.Marshal(c)
		if err != nil {
			t.Fatalf("%+v does not marshal: %v", c, err)
		}
		back, err := parseConfig(b)
		if err != nil || back != c {
			t.Fatalf("%+v reads back as %+v, %v", c, back, err)
		}
	})
}

// FuzzCommonArgs: the common state (common.pt, common_state) is a pickle
// anyone may have written. Decoding it never panics.
func FuzzCommonArgs(f *testing.F) {
	real, err := os.ReadFile(filepath.Join("..", "..", "testdata", "megatron_gpt_llama_tp2", "ckpt", "iter_0000010", CommonFile))
	require.NoError(f, err)
	f.Add(real, false)
	f.Add(real, true)
	f.Fuzz(func(t *testing.T, data []byte, inList bool) {
		_, _ = commonArgs(bytes.NewReader(data), int64(len(data)), inList)
	})
}
