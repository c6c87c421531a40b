package view

import (
	"strings"

	"github.com/ckptfs/ckptfs/layout/mapping"
)

// withoutAttribute removes the attribute prefix a framework's wrapper puts
// before an HF model's names (a LightningModule's self.model saves
// "model.model.layers.0...", "model.lm_head.weight"): when every selected
// name is under one first component, the names under it are, by the
// mapping tables (mapping.HFModel), exactly an HF model with the layers of
// the view's config.json (so the names as saved are not one). Without a
// config, or when the names are no HF model the tables know, they are
// shown as saved: the prefix is never cut because of how it looks.
func (v *View) withoutAttribute(selected []named, sidecars []*File) []named {
	if len(selected) == 0 {
		return selected
	}
	prefix, _, ok := strings.Cut(selected[0].name, ".")
	if !ok {
		return selected
	}
	under := make([]string, len(selected))
	for i, t := range selected {
		rest, ok := strings.CutPrefix(t.name, prefix+".")
		if !ok || rest == "" {
			return selected
		}
		under[i] = rest
	}
	model, err := v.model(sidecars)
	layers := model.Params["layers"]
	if err != nil || layers <= 0 || mapping.HFModel(under, layers, model.Tied) == nil {
		return selected
	}
	out := make([]named, len(selected))
	for i, t := range selected {
		out[i] = named{under[i], t.tensor}
	}
	return out
}
