package view

import (
	"errors"
	"fmt"
	"regexp"
	"slices"
	"strings"
	"time"

	"github.com/ckptfs/ckptfs/layout/mapping"
	"github.com/ckptfs/ckptfs/layout/source"
)

// configName is the HF model config among a view's sidecars.
const configName = "config.json"

// mapTensors turns the selected tensors into the view's tensors: through
// the mapping the options name, or the built-in one the checkpoint's keys
// match, or as stored. A mapping applies wholly or the view is an error;
// only a detected mapping that lacks a hyper-parameter is skipped, with a
// warning, leaving the names as saved.
func (v *View) mapTensors(selected []named, sidecars []*File, opts Options) ([]viewTensor, error) {
	spec := opts.Mapping
	if opts.NoMapping || spec == nil && len(selected) == 0 {
		return stored(selected)
	}
	sources := make([]mapping.Source, len(selected))
	saved := map[string]string{} // selected name → checkpoint name
	for i, t := range selected {
		sources[i] = mapping.Source{Name: t.name, Tensor: t.tensor}
		saved[t.name] = t.tensor.Name
	}
	auto := spec == nil
	if auto {
		if spec = mapping.Detect(sources); spec == nil {
			if w := unmappedWarning(sources); w != "" {
				v.Warnings = append(v.Warnings, w)
			}
			return stored(selected)
		}
	}
	model, err := v.model(sidecars)
	if err != nil {
		return nil, err
	}
	params := model.Merge(mapping.Model{Params: spec.Params}).Params
	res, err := mapping.Apply(spec, sources, params, model.Tied)
	var unknown *mapping.UnknownParamError
	if auto && errors.As(err, &unknown) {
		v.Warnings = append(v.Warnings, fmt.Sprintf("%s mapping not applied, names shown as saved: %s "+
			"(pass --hf-config DIR with the model's config.json)", spec.Name, unknown))
		return stored(selected)
	}
	if err != nil {
		return nil, fmt.Errorf("layout: %s: %w", v.Checkpoint.Dir, err)
	}
	v.Mapping = spec.Name
	v.Warnings = append(v.Warnings, model.Notes...)
	for _, name := range res.Unused {
		v.Omitted = append(v.Omitted, Omission{Name: saved[name], Reason: "not used by the " + spec.Name + " mapping"})
	}
	for _, name := range res.Tied {
		v.Omitted = append(v.Omitted, Omission{Name: saved[name], Tied: true,
			Reason: "tied to the input embeddings (" + model.From + "), as save_pretrained leaves it out"})
	}
	gs := geometries{}
	out := make([]viewTensor, len(res.Tensors))
	for i := range res.Tensors {
		m, err := newMapped(&res.Tensors[i], gs)
		if err != nil {
			return nil, err
		}
		out[i] = viewTensor{res.Tensors[i].Name, m}
	}
	return out, nil
}

// model is what the checkpoint and the view's config.json say about the
// model: the config wins where both say something.
func (v *View) model(sidecars []*File) (mapping.Model, error) {
	var m mapping.Model
	if r := v.Checkpoint.Record; r != nil {
		p, tied, notes := r.Params()
		m = mapping.Model{Params: p, Tied: tied, From: r.Source(), Notes: notes}
	}
	for _, f := range sidecars {
		if f.Name != configName {
			continue
		}
		if f.Size > maxConfigBytes {
			return m, fmt.Errorf("layout: %s is larger than %d bytes", f.Path, maxConfigBytes)
		}
		b := make([]byte, f.Size)
		if err := source.ReadFullAt(f, b, 0); err != nil {
			return m, fmt.Errorf("layout: %w", err)
		}
		cfg, err := mapping.FromHFConfig(b)
		if err != nil {
			return m, fmt.Errorf("layout: %s: %w", f.Path, err)
		}
		return m.Merge(cfg), nil
	}
	return m, nil
}

// maxConfigBytes bounds the config.json read for hyper-parameters.
const maxConfigBytes = 16 << 20

// generatedConfig is the file ckptfs adds to a view: the config.json of a
// mapped view whose checkpoint has none but records its hyper-parameters
// (Megatron-LM args), or, in a view whose keys look like a framework's but
// match no built-in mapping, InfoName holding that warning.
func (v *View) generatedConfig(sidecars []*File, mtime time.Time) *File {
	for _, w := range v.Warnings {
		if strings.HasPrefix(w, unmappedPrefix) {
			return newBytesFile(InfoName, []byte(w+"\n"), mtime)
		}
	}
	r := v.Checkpoint.Record
	if v.Mapping == "" || r == nil {
		return nil
	}
	for _, f := range sidecars {
		if f.Name == configName {
			return nil
		}
	}
	b, err := r.HFConfig(v.Mapping)
	if err != nil {
		v.Warnings = append(v.Warnings, "no config.json for the view: "+err.Error()+" (pass --hf-config DIR)")
		return nil
	}
	return newBytesFile(configName, append(b, '\n'), mtime)
}

// InfoName is the note a view carries when its keys look like a framework's
// but no built-in mapping applies.
const InfoName = "CKPTFS_INFO.txt"

// unmappedPrefix starts the warning of unmappedWarning.
const unmappedPrefix = "no built-in mapping applies: "

// frameworks are key shapes that only a framework's own saves have, with
// the built-in mappings for that framework. Keys of that shape that no
// mapping applies to are a model the built-ins do not cover (MoE, MLA, a
// renamed module), which is worth saying rather than showing names silently.
var frameworks = []struct {
	name  string
	keys  *regexp.Regexp
	specs []string
}{
	{"Megatron-Core", regexp.MustCompile(`^decoder\.`), []string{"megatron-gpt"}},
	{"torchtitan", regexp.MustCompile(`^layers\.[0-9]+\.attention\.`),
		[]string{"torchtitan-llama", "torchtitan-qwen3", "kempnerforge-llama"}},
}

// unmappedWarning says, when the sources look like a framework's keys but
// no built-in mapping applied, which keys the closest mapping has no rule
// for and which required sources it lacks; "" otherwise.
func unmappedWarning(sources []mapping.Source) string {
	for _, fw := range frameworks {
		looks := false
		for _, s := range sources {
			looks = looks || fw.keys.MatchString(s.Name)
		}
		if !looks {
			continue
		}
		best, bestUncovered, bestMissing := "", []string(nil), []string(nil)
		for _, name := range fw.specs {
			spec := mapping.ByName(name)
			if spec == nil {
				continue
			}
			uncovered, missing := coverage(spec, sources)
			if best == "" || len(uncovered)+len(missing) < len(bestUncovered)+len(bestMissing) {
				best, bestUncovered, bestMissing = name, uncovered, missing
			}
		}
		msg := fmt.Sprintf("%skeys look like %s's, names shown as saved (pass --map FILE);", unmappedPrefix, fw.name)
		if len(bestUncovered) > 0 {
			msg += fmt.Sprintf(" no %s rule covers %d keys: %s;", best, len(bestUncovered), firstNames(bestUncovered))
		}
		if len(bestMissing) > 0 {
			msg += fmt.Sprintf(" %s needs %s;", best, firstNames(bestMissing))
		}
		return strings.TrimSuffix(msg, ";")
	}
	return ""
}

// coverage returns the sources no rule of spec takes (by name: "{l}" is
// any layer number) and the first source name of each required rule that
// no source matches.
func coverage(spec *mapping.Spec, sources []mapping.Source) (uncovered, missing []string) {
	var pats []*regexp.Regexp
	for _, r := range spec.Rules {
		found := false
		for _, from := range r.From {
			re := regexp.MustCompile("^" + strings.ReplaceAll(regexp.QuoteMeta(from), `\{l\}`, "[0-9]+") + "$")
			pats = append(pats, re)
			for _, s := range sources {
				found = found || re.MatchString(s.Name)
			}
		}
		if !found && !r.Optional && !r.UnlessTied && len(r.From) > 0 && !slices.Contains(missing, r.From[0]) {
			missing = append(missing, r.From[0])
		}
	}
	for _, s := range sources {
		covered := false
		for _, re := range pats {
			covered = covered || re.MatchString(s.Name)
		}
		if !covered {
			uncovered = append(uncovered, s.Name)
		}
	}
	return uncovered, missing
}

// firstNames lists up to 8 names, then how many more there are.
func firstNames(names []string) string {
	if len(names) <= 8 {
		return strings.Join(names, ", ")
	}
	return fmt.Sprintf("%s and %d more", strings.Join(names[:8], ", "), len(names)-8)
}
