package view

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/ckptfs/ckptfs/layout/ckpt"
	"github.com/ckptfs/ckptfs/layout/internal/treetest"
)

// llamaNames are an HF Llama's tensor names, one layer, each behind prefix.
func llamaNames(prefix string, lmHead bool) []string {
	names := []string{"model.embed_tokens.weight", "model.norm.weight"}
	for _, n := range []string{"self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
		"mlp.gate_proj", "mlp.up_proj", "mlp.down_proj", "input_layernorm", "post_attention_layernorm"} {
		names = append(names, "model.layers.0."+n+".weight")
	}
	if lmHead {
		names = append(names, "lm_head.weight")
	}
	for i := range names {
		names[i] = prefix + names[i]
	}
	return names
}

// TestAttributePrefix: a wrapper's attribute prefix (a LightningModule's
// self.model) is removed only when the names under it are, by the mapping
// tables, exactly the HF model of the view's config.json and the names as
// saved are not; never by the prefix's look.
func TestAttributePrefix(t *testing.T) {
	const config = `{"architectures": ["LlamaForCausalLM"], "num_hidden_layers": 1, "num_attention_heads": 4, "tie_word_embeddings": %s}`
	for _, tc := range []struct {
		name   string
		saved  []string
		config string // "" : none
		want   []string
	}{
		{"Lightning: model. removed", llamaNames("model.", true), "false", llamaNames("", true)},
		{"a tied HF model saved as it is keeps its names", llamaNames("", false), "true", llamaNames("", false)},
		{"no config.json: names as saved", llamaNames("model.", true), "", llamaNames("model.", true)},
		{"a layer missing: names as saved", llamaNames("model.", true)[1:], "false", llamaNames("model.", true)[1:]},
		{"an extra name under the prefix: names as saved", append(llamaNames("net.", true), "net.extra.weight"), "false",
			append(llamaNames("net.", true), "net.extra.weight")},
		{"more layers than the config says: names as saved", append(llamaNames("m.", true), "m.model.layers.1.mlp.up_proj.weight"), "false",
			append(llamaNames("m.", true), "m.model.layers.1.mlp.up_proj.weight")},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			if tc.config != "" {
				require.NoError(t, os.WriteFile(filepath.Join(dir, "config.json"), []byte(fmt.Sprintf(config, tc.config)), 0o644))
			}
			var tensors []*ckpt.Tensor
			for _, n := range tc.saved {
				tensors = append(tensors, treetest.Scalar("state_dict."+n, "state_dict", n))
			}
			c := treetest.NewCheckpoint(t, dir, tensors...)
			names, omitted := viewNames(t, c, Options{NoMapping: true})
			require.ElementsMatch(t, tc.want, names)
			require.Empty(t, omitted)
			// An explicit --select is shown as asked.
			names, _ = viewNames(t, c, Options{NoMapping: true, Select: "state_dict"})
			require.ElementsMatch(t, tc.saved, names)
		})
	}
}
