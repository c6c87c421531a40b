package view

import (
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/ckptfs/ckptfs/layout/ckpt"
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
	v.hfTarget = ckpt.HFTarget{Mapping: spec.Name, MoE: spec.MoE, Model: spec.Model}
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
	cfg, found, err := configModel(sidecars)
	if err != nil || !found {
		return m, err
	}
	return m.Merge(cfg), nil
}

// configModel reads the view's config.json, if it has one.
func configModel(sidecars []*File) (mapping.Model, bool, error) {
	for _, f := range sidecars {
		if f.Name != configName {
			continue
		}
		if f.Size > maxConfigBytes {
			return mapping.Model{}, false, fmt.Errorf("layout: %s is larger than %d bytes", f.Path, maxConfigBytes)
		}
		b := make([]byte, f.Size)
		if err := source.ReadFullAt(f, b, 0); err != nil {
			return mapping.Model{}, false, fmt.Errorf("layout: %w", err)
		}
		cfg, err := mapping.FromHFConfig(b)
		if err != nil {
			return mapping.Model{}, false, fmt.Errorf("layout: %s: %w", f.Path, err)
		}
		return cfg, true, nil
	}
	return mapping.Model{}, false, nil
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
	b, err := r.HFConfig(v.hfTarget)
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

// unmappedWarning says, when the sources look like a framework's keys but
// no built-in mapping applied, which keys the closest mapping has no rule
// for and which required sources it lacks; "" otherwise.
func unmappedWarning(sources []mapping.Source) string {
	fw := mapping.FrameworkOf(sources)
	if fw == nil {
		return ""
	}
	best, bestUncovered, bestMissing := "", []string(nil), []string(nil)
	for _, name := range fw.Specs {
		spec := mapping.ByName(name)
		if spec == nil {
			continue
		}
		uncovered, missing := spec.Coverage(sources)
		if best == "" || len(uncovered)+len(missing) < len(bestUncovered)+len(bestMissing) {
			best, bestUncovered, bestMissing = name, uncovered, missing
		}
	}
	msg := fmt.Sprintf("%skeys look like %s's, names shown as saved (pass --map FILE);", unmappedPrefix, fw.Name)
	if len(bestUncovered) > 0 {
		msg += fmt.Sprintf(" no %s rule covers %d keys: %s;", best, len(bestUncovered), firstNames(bestUncovered))
	}
	if len(bestMissing) > 0 {
		msg += fmt.Sprintf(" %s needs %s;", best, firstNames(bestMissing))
	}
	return strings.TrimSuffix(msg, ";")
}

// firstNames lists up to 8 names, then how many more there are.
func firstNames(names []string) string {
	if len(names) <= 8 {
		return strings.Join(names, ", ")
	}
	return fmt.Sprintf("%s and %d more", strings.Join(names[:8], ", "), len(names)-8)
}
