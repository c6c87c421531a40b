package view

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ckptfs/ckptfs/layout/ckpt"
	"github.com/ckptfs/ckptfs/layout/internal/treetest"
)

// TestSavedTied: a checkpoint holding the output projection of a tied pair
// and not the input embeddings (safetensors' save_model of a tied model) is
// shown as save_pretrained writes it only when config.json says the model
// is tied and its model_type names the pair; otherwise it is shown as saved
// and a warning says why. (The real save_model file is the fixture
// savemodel_llama_tied, checked byte for byte by TestExportMatchesOriginals.)
func TestSavedTied(t *testing.T) {
	llama := []string{"lm_head.weight", "model.norm.weight"}
	for _, tc := range []struct {
		name    string
		tensors []string
		config  string // "" for no config.json
		opts    Options
		want    []string
		warning string
	}{
		{"tied llama", llama, `{"model_type": "llama", "tie_word_embeddings": true}`, Options{},
			[]string{"model.embed_tokens.weight", "model.norm.weight"}, "shown as model.embed_tokens.weight, as save_pretrained writes it"},
		{"tied gpt2", []string{"lm_head.weight", "transformer.ln_f.weight"}, `{"model_type": "gpt2", "tie_word_embeddings": true}`, Options{},
			[]string{"transformer.ln_f.weight", "transformer.wte.weight"}, "shown as transformer.wte.weight"},
		{"tie not said", llama, `{"model_type": "llama"}`, Options{},
			llama, "config.json does not say tie_word_embeddings: true: tensors shown as saved"},
		{"untied", llama, `{"model_type": "llama", "tie_word_embeddings": false}`, Options{},
			llama, "config.json does not say tie_word_embeddings: true"},
		{"unknown model type", llama, `{"model_type": "mystery", "tie_word_embeddings": true}`, Options{},
			llama, `model_type "mystery" is not one whose tied names ckptfs knows`},
		{"no config", llama, "", Options{},
			llama, "no config.json says whether they are tied: tensors shown as saved"},
		{"both saved", []string{"lm_head.weight", "model.embed_tokens.weight"}, `{"model_type": "llama", "tie_word_embeddings": true}`, Options{},
			[]string{"lm_head.weight", "model.embed_tokens.weight"}, ""},
		{"names as saved asked", llama, `{"model_type": "llama", "tie_word_embeddings": true}`, Options{NoMapping: true},
			llama, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var ts []*ckpt.Tensor
			for _, n := range tc.tensors {
				ts = append(ts, treetest.Scalar(n, n))
			}
			c := treetest.NewCheckpoint(t, t.TempDir(), ts...)
			opts := tc.opts
			if tc.config != "" {
				opts.HFConfigDir = t.TempDir()
				require.NoError(t, os.WriteFile(filepath.Join(opts.HFConfigDir, "config.json"), []byte(tc.config), 0o644))
			}
			v, err := Plan(c, opts)
			require.NoError(t, err)
			defer v.Close()
			var names []string
			for _, p := range v.Tensors {
				names = append(names, p.Name)
			}
			slices.Sort(names)
			assert.Equal(t, tc.want, names)
			tied := slices.IndexFunc(v.Warnings, func(w string) bool { return strings.Contains(w, "lm_head.weight and no") })
			if tc.warning == "" {
				assert.Equal(t, -1, tied, "%q", v.Warnings)
				return
			}
			require.NotEqual(t, -1, tied, "%q", v.Warnings)
			assert.Contains(t, v.Warnings[tied], tc.warning)
			assert.Contains(t, v.Warnings[tied], c.Dir)
		})
	}
}
