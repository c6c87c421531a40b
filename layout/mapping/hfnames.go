package mapping

import (
	"strconv"
	"strings"
)

// maxHFLayers bounds the layers HFModel looks for.
const maxHFLayers = 1 << 14

// HFModel returns the built-in mapping whose HF names (its rules' To) are
// exactly names, for a model of layers layers (tied: the output projection
// shares the input embeddings): every name is one a rule makes, and every
// tensor a required rule makes is there. nil when none is: names are no HF
// model the tables know. It tells a framework's wrapper around an HF model
// (a LightningModule's attribute) from the model itself by what the
// checkpoint holds.
func HFModel(names []string, layers int64, tied bool) *Spec {
	if layers <= 0 || layers > maxHFLayers {
		return nil
	}
	have := make(map[string]bool, len(names))
	for _, n := range names {
		have[n] = true
	}
	for _, spec := range Builtin {
		if spec.makes(have, layers, tied) {
			return spec
		}
	}
	return nil
}

// makes reports whether have is exactly what s's rules make (see HFModel).
func (s *Spec) makes(have map[string]bool, layers int64, tied bool) bool {
	covered := 0
	for _, r := range s.Rules {
		re := nameTemplate(r.To)
		n := 0
		if re == nil {
			if have[r.To] {
				n = 1
			}
		} else {
			for name := range have {
				if at, ok := matchIndices(re, name); ok && at[layerIndex] < layers {
					n++
				}
			}
		}
		covered += n
		required := !r.Optional && !(r.UnlessTied && tied)
		switch {
		case !required:
		case re == nil && n == 0:
			return false
		case strings.Contains(r.To, placeholder(expertIndex)):
			if n == 0 {
				return false
			}
		case re != nil:
			for l := range layers {
				if !have[strings.ReplaceAll(r.To, placeholder(layerIndex), strconv.FormatInt(l, 10))] {
					return false
				}
			}
		}
	}
	return covered == len(have)
}
