package view

import (
	"fmt"

	"github.com/ckptfs/ckptfs/layout/mapping"
)

// savedTied shows a checkpoint that kept only the output projection of a
// tied pair (safetensors.torch.save_model keeps lm_head.weight of a tied
// Llama and drops model.embed_tokens.weight) as save_pretrained writes it:
// those bytes under the input embeddings' name. The tie must come from the
// checkpoint: config.json says tie_word_embeddings: true, and its
// model_type names the pair. Otherwise the tensors are shown as saved and a
// warning says why.
func (v *View) savedTied(ts []viewTensor, sidecars []*File) ([]viewTensor, error) {
	at := make(map[string]int, len(ts))
	for i, t := range ts {
		at[t.name] = i
	}
	lone := func(p mapping.TiedPair) bool {
		_, out := at[p.Output]
		_, in := at[p.Input]
		return out && !in
	}
	dir := v.Checkpoint.Dir
	cfg, found, err := configModel(sidecars)
	if err != nil {
		return nil, err
	}
	if !found {
		for _, p := range mapping.TiedPairs() {
			if lone(p) {
				v.Warnings = append(v.Warnings, fmt.Sprintf("%s holds %s and no %s, and no config.json says whether they are tied: "+
					"tensors shown as saved (pass --hf-config DIR)", dir, p.Output, p.Input))
				break
			}
		}
		return ts, nil
	}
	pair, known := mapping.TiedNames(cfg.Type)
	if !known {
		for _, p := range mapping.TiedPairs() {
			if lone(p) {
				v.Warnings = append(v.Warnings, fmt.Sprintf("%s holds %s and no %s, and config.json's model_type %q is not one whose tied names ckptfs knows: "+
					"tensors shown as saved", dir, p.Output, p.Input, cfg.Type))
				break
			}
		}
		return ts, nil
	}
	if !lone(pair) {
		return ts, nil
	}
	if !cfg.TiedSaid || !cfg.Tied {
		v.Warnings = append(v.Warnings, fmt.Sprintf("%s holds %s and no %s, and config.json does not say tie_word_embeddings: true: "+
			"tensors shown as saved", dir, pair.Output, pair.Input))
		return ts, nil
	}
	ts[at[pair.Output]].name = pair.Input
	v.Warnings = append(v.Warnings, fmt.Sprintf("%s holds %s and no %s (as safetensors' save_model writes a tied model): "+
		"shown as %s, as save_pretrained writes it, since config.json ties them (%s, tie_word_embeddings: true)",
		dir, pair.Output, pair.Input, pair.Input, cfg.Type))
	return ts, nil
}
