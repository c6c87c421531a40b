package metallama

import (
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ckptfs/ckptfs/layout/ckpt"
	"github.com/ckptfs/ckptfs/layout/internal/treetest"
)

func open(dir string) (*ckpt.Checkpoint, error) { return treetest.OpenLocal(dir, OpenTree) }

// TestFixtures: the ranks are merged along Meta's split dims (the
// embeddings by their shape: dim 1 for Llama 2, dim 0 for Llama 3), and
// the config.json written from params.json says what the converter's does.
// (The tensors' bytes against the converter: layout's TestExportMatchesOriginals.)
func TestFixtures(t *testing.T) {
	for _, tc := range []struct {
		name     string
		embedDim int
	}{{"meta_llama2_mp2", 1}, {"meta_llama31_mp2", 0}} {
		t.Run(tc.name, func(t *testing.T) {
			dir := treetest.Testdata(tc.name, "ckpt")
			require.True(t, treetest.Detect(t, Reader, dir))
			c, err := open(dir)
			require.NoError(t, err)
			defer func() { c.Close() }()
			dims := map[string][]int{}
			for _, tn := range c.Tensors {
				dims[tn.Name] = tn.ShardedDims()
			}
			assert.Equal(t, []int{tc.embedDim}, dims["tok_embeddings.weight"])
			assert.Equal(t, []int{0}, dims["layers.1.attention.wk.weight"])
			assert.Equal(t, []int{1}, dims["layers.1.feed_forward.w2.weight"])
			assert.Empty(t, dims["layers.1.ffn_norm.weight"])

			got, err := c.Record.HFConfig(ckpt.HFTarget{Mapping: "torchtitan-llama", Model: ckpt.ModelLlama})
			if tc.name == "meta_llama31_mp2" {
				// Llama 3.1's params.json, like 3.2's, sets use_scaled_rope
				// but not the factor: no config is guessed; with the factor
				// in params.json, it is the converter's.
				require.ErrorContains(t, err, "sets use_scaled_rope but no rope_scaling_factor")
				require.NoError(t, c.Close())
				tmp := t.TempDir()
				treetest.CopyFixture(t, tc.name, tmp)
				b, rerr := os.ReadFile(filepath.Join(tmp, ParamsFile))
				require.NoError(t, rerr)
				var p map[string]any
				require.NoError(t, json.Unmarshal(b, &p))
				p["rope_scaling_factor"] = 8.0
				b, rerr = json.Marshal(p)
				require.NoError(t, rerr)
				require.NoError(t, os.WriteFile(filepath.Join(tmp, ParamsFile), b, 0o644))
				c, rerr = open(tmp)
				require.NoError(t, rerr)
				got, err = c.Record.HFConfig(ckpt.HFTarget{Mapping: "torchtitan-llama", Model: ckpt.ModelLlama})
			}
			require.NoError(t, err)
			var ours, theirs map[string]any
			require.NoError(t, json.Unmarshal(got, &ours))
			b, err := os.ReadFile(treetest.Testdata(tc.name, "converted", "config.json"))
			require.NoError(t, err)
			require.NoError(t, json.Unmarshal(b, &theirs))
			for _, k := range []string{"hidden_size", "intermediate_size", "num_attention_heads", "num_hidden_layers",
				"num_key_value_heads", "rms_norm_eps", "vocab_size", "max_position_embeddings", "bos_token_id",
				"eos_token_id", "tie_word_embeddings", "head_dim"} {
				assert.Equal(t, theirs[k], ours[k], k)
			}
			rope := theirs["rope_parameters"].(map[string]any)
			assert.Equal(t, rope["rope_theta"], ours["rope_theta"])
			if rope["rope_type"] == "default" {
				assert.Nil(t, ours["rope_scaling"])
			} else {
				scaling := ours["rope_scaling"].(map[string]any)
				for k, v := range scaling {
					assert.Equal(t, rope[k], v, k)
				}
			}
			// The spec says what it makes, whatever its name: a Llama, or
			// (megatron-gpt: the checkpoint's arguments decide) not.
			_, err = c.Record.HFConfig(ckpt.HFTarget{Mapping: "my-llama", Model: ckpt.ModelLlama})
			assert.NoError(t, err)
			_, err = c.Record.HFConfig(ckpt.HFTarget{Mapping: "megatron-gpt"})
			assert.Error(t, err)
		})
	}
}

// TestHostile: shards that disagree, a missing rank, a tensor whose split
// is not known and a bad params.json are errors naming the file and the
// cause, never a merged model.
func TestHostile(t *testing.T) {
	fixture := treetest.Testdata("meta_llama2_mp2", "ckpt")
	hostile := treetest.Testdata("meta_llama2_mp2", "hostile")
	other := treetest.Testdata("meta_llama31_mp2", "ckpt")
	for _, tc := range []struct {
		name   string
		files  map[string]string // name in the checkpoint → file to copy
		params string            // "" : the fixture's
		err    string
	}{
		{"a split tensor's other dim differs", map[string]string{"consolidated.01.pth": filepath.Join(hostile, "wq_cols.pth")}, "",
			"layers.0.attention.wq.weight: shapes [32 64] in consolidated.00.pth and [32 32] in consolidated.01.pth differ outside the split dim 0"},
		{"a replicated tensor's size differs", map[string]string{"consolidated.01.pth": filepath.Join(hostile, "norm_size.pth")}, "",
			"layers.1.ffn_norm.weight: replicated, but BF16 [64] in consolidated.00.pth and BF16 [63] in consolidated.01.pth"},
		{"a tensor whose split is not known", map[string]string{"consolidated.00.pth": filepath.Join(hostile, "unknown_0.pth"),
			"consolidated.01.pth": filepath.Join(hostile, "unknown_1.pth")}, "",
			"layers.0.attention.extra.weight: how Meta's model splits it over 2 ranks is not known"},
		{"ranks of two models", map[string]string{"consolidated.01.pth": filepath.Join(other, "consolidated.01.pth")}, "",
			`hold different tensors ("rope.freqs" only in consolidated.00.pth)`},
		{"a rank missing", map[string]string{"consolidated.02.pth": filepath.Join(fixture, "consolidated.01.pth")}, "",
			"rank 1 of 2 is missing (consolidated.01.pth)"},
		{"embeddings that fit no split", map[string]string{}, `{"dim": 96, "n_heads": 4, "n_layers": 2, "norm_eps": 1e-5, "vocab_size": -1}`,
			"tok_embeddings.weight: shape [128 32] over 2 ranks is neither a vocabulary- nor an embedding-split of dim 96"},
		{"params.json not JSON", map[string]string{}, `{"dim": `, "params.json: unexpected end of JSON input"},
		{"heads that do not divide", map[string]string{}, `{"dim": 64, "n_heads": 5, "n_layers": 2}`, "do not divide"},
		{"huge dim", map[string]string{}, `{"dim": 1e18, "n_heads": 4, "n_layers": 2}`, "params.json"},
		{"not a zip", map[string]string{"consolidated.01.pth": filepath.Join(fixture, "params.json")}, "", "consolidated.01.pth"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			treetest.CopyFixture(t, "meta_llama2_mp2", dir)
			if _, ok := tc.files["consolidated.02.pth"]; ok {
				require.NoError(t, os.Remove(filepath.Join(dir, "consolidated.01.pth")))
			}
			for name, from := range tc.files {
				b, err := os.ReadFile(from)
				require.NoError(t, err)
				require.NoError(t, os.WriteFile(filepath.Join(dir, name), b, 0o644))
			}
			if tc.params != "" {
				require.NoError(t, os.WriteFile(filepath.Join(dir, ParamsFile), []byte(tc.params), 0o644))
			}
			c, err := open(dir)
			if err == nil {
				c.Close()
			}
			require.Error(t, err)
			assert.ErrorContains(t, err, tc.err)
			assert.NotContains(t, err.Error(), "\n")
			assert.True(t, errors.Is(err, ckpt.ErrInvalid), err)
		})
	}
}

// FuzzParams opens the fixture with an arbitrary params.json: errors,
// never a panic or an allocation beyond the bounds.
func FuzzParams(f *testing.F) {
	f.Add([]byte(`{"dim": 64, "multiple_of": 32, "n_heads": 4, "n_layers": 2, "norm_eps": 1e-05, "vocab_size": -1}`))
	f.Add([]byte(`{"model": {"dim": 64, "n_heads": 4, "n_kv_heads": 0, "n_layers": 2}}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		dir := t.TempDir()
		treetest.CopyFixture(t, "meta_llama2_mp2", dir)
		if err := os.WriteFile(filepath.Join(dir, ParamsFile), b, 0o644); err != nil {
			t.Fatal(err)
		}
		c, err := open(dir)
		if err != nil {
			return
		}
		defer c.Close()
		_, _ = c.Record.HFConfig(ckpt.HFTarget{Mapping: "torchtitan-llama", Model: ckpt.ModelLlama})
	})
}

// FuzzOpen opens an arbitrary rank 1 beside the fixture's rank 0 and reads
// every tensor: errors, never a panic, a hang or an allocation beyond the
// bounds.
func FuzzOpen(f *testing.F) {
	if b, err := os.ReadFile(treetest.Testdata("meta_llama2_mp2", "ckpt", "consolidated.01.pth")); err == nil {
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		dir := t.TempDir()
		treetest.CopyFixture(t, "meta_llama2_mp2", dir)
		if err := os.WriteFile(filepath.Join(dir, "consolidated.01.pth"), b, 0o644); err != nil {
			t.Fatal(err)
		}
		c, err := open(dir)
		if err != nil {
			return
		}
		defer c.Close()
		for _, tn := range c.Tensors {
			for _, ch := range tn.Chunks.All() {
				_, _ = treetest.ReadChunk(t, tn, ch)
			}
		}
	})
}
