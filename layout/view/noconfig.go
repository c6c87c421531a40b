package view

import "strings"

// NoConfigWarning is the warning of a view that has weights but no
// config.json: transformers cannot load it ("Unrecognized model"), and
// nothing else would point at the flag that gives it one.
const NoConfigWarning = "no config.json: pass --hf-config DIR (a directory with the model's config.json and tokenizer files) for from_pretrained to load the view"

// warnNoConfig adds NoConfigWarning to a view with weights and no
// config.json, unless a warning says so already (a config that could not
// be generated says why).
func (v *View) warnNoConfig() {
	if v.Note != "" || len(v.Files) == 0 {
		return
	}
	for _, f := range v.Files {
		if f.Name == configName {
			return
		}
	}
	for _, w := range v.Warnings {
		if strings.HasPrefix(w, "no config.json") {
			return
		}
	}
	v.Warnings = append(v.Warnings, NoConfigWarning)
}
