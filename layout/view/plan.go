// Package view plans the HF view of a checkpoint and serves its bytes: Plan
// lays the checkpoint's tensors out in virtual safetensors files under HF
// names (mapped, selected, dtype-converted as asked) with their index and
// sidecars, and each File is an io.ReaderAt that gathers its bytes from the
// shard files on demand. Planning reads no tensor data. What an open view
// holds, what its reads keep included (the chunk boxes of the tensors read
// last: boxcache.go), is bounded and counted from the plan (resident.go).
package view

import (
	"fmt"
	"io"
	"path"
	"sort"
	"strings"
	"time"

	"github.com/ckptfs/ckptfs/layout/ckpt"
	"github.com/ckptfs/ckptfs/layout/hfdir"
	"github.com/ckptfs/ckptfs/layout/mapping"
	"github.com/ckptfs/ckptfs/layout/source"
	"github.com/ckptfs/ckptfs/safetensors"
)

// DefaultMaxShardSize is the HF default split (transformers v4, huggingface_hub).
const DefaultMaxShardSize = 5_000_000_000

// Options choose what a view holds and how it is split into files.
type Options struct {
	// Select chooses the tensors of the view (see selectTensors): "" picks
	// by the saved nesting, SelectAll shows every tensor under its saved
	// name, and any other value is the key of the subtree to show, matched
	// against whole nesting levels, with the prefix removed.
	Select string
	// MaxShardSize splits files (bytes of tensor data per file); 0 = default.
	MaxShardSize int64
	// HFConfigDir supplies sidecars (config.json, tokenizer files) the
	// checkpoint lacks.
	HFConfigDir string
	// DType, when set, converts every floating tensor of the view to it on
	// read (an fp32 master copy served as bf16), as torch's .to() rounds.
	DType safetensors.DType
	// Mapping maps the checkpoint's tensors to HF ones. When nil, the
	// built-in mapping the checkpoint's keys match applies (Megatron-Core
	// GPT, torchtitan, ...), if any; NoMapping shows the keys as saved.
	Mapping   *mapping.Spec
	NoMapping bool
	// Verify checks each chunk against its record's CRC32 before its first
	// byte is served (see Verify).
	Verify bool
}

// ParseDType reads a --dtype value: bf16, fp16 or fp32 (or torch's names).
func ParseDType(s string) (safetensors.DType, error) {
	switch strings.ToLower(s) {
	case "":
		return "", nil
	case "bf16", "bfloat16":
		return safetensors.BF16, nil
	case "fp16", "f16", "float16", "half":
		return safetensors.F16, nil
	case "fp32", "f32", "float32", "float":
		return safetensors.F32, nil
	}
	return "", fmt.Errorf("unknown dtype %q (want bf16, fp16 or fp32)", s)
}

// SelectAll is the Select value that shows every tensor, optimizer state
// included, under the name it was saved with.
const SelectAll = "."

// View is the HF directory a checkpoint is shown as: safetensors files, the
// index, and sidecars. Views are immutable.
type View struct {
	Checkpoint *ckpt.Checkpoint
	Files      []*File
	// Tensors maps view name → tensor, in file order.
	Tensors []Placement
	// Omitted lists the checkpoint's tensors the view leaves out, and why.
	Omitted []Omission
	// Note, set when the view holds no tensors (a checkpoint of optimizer
	// state only), says why in one line.
	Note string
	// Mapping names the mapping that made the view's tensors ("" if none).
	Mapping string
	// Warnings say, one line each, what the view could not do as asked or
	// had to assume (a mapping lacking a hyper-parameter, say).
	Warnings []string

	hfTarget ckpt.HFTarget // what the mapping makes, for a generated config.json
	boxes    *boxCache     // the chunk boxes of the tensors read last
	extra    []io.Closer   // file sets of sidecars from outside the checkpoint
}

// Omission is a tensor of the checkpoint that is not in the view.
type Omission struct {
	Name   string `json:"name"`
	Reason string `json:"reason"`
	// Optimizer marks optimizer state, which a view never shows as weights.
	Optimizer bool `json:"optimizer,omitempty"`
	// Tied marks an output projection tied to the input embeddings.
	Tied bool `json:"tied,omitempty"`
}

// Lookup returns the view file of the given name.
func (v *View) Lookup(name string) *File {
	for _, f := range v.Files {
		if f.Name == name {
			return f
		}
	}
	return nil
}

// TotalSize is the sum of the view's file sizes.
func (v *View) TotalSize() int64 {
	var n int64
	for _, f := range v.Files {
		n += f.Size
	}
	return n
}

// LeavesOutWeights reports whether the view omits a tensor that is not
// optimizer state: worth a line in the log, since a loader then gets a
// model with that tensor freshly initialised.
func (v *View) LeavesOutWeights() []Omission {
	var out []Omission
	for _, o := range v.Omitted {
		if !o.Optimizer && !o.Tied {
			out = append(out, o)
		}
	}
	return out
}

// Close releases the checkpoint and every sidecar file the view opened.
func (v *View) Close() error {
	err := v.Checkpoint.Close()
	for _, c := range v.extra {
		if cerr := c.Close(); err == nil {
			err = cerr
		}
	}
	return err
}

// Plan builds the HF view of a checkpoint. It touches no shard data.
func Plan(c *ckpt.Checkpoint, opts Options) (*View, error) {
	if opts.MaxShardSize <= 0 {
		opts.MaxShardSize = DefaultMaxShardSize
	}
	v := &View{Checkpoint: c, Warnings: append([]string(nil), c.Warnings...)}
	if opts.Verify {
		if _, unchecked := Verify(c); unchecked > 0 {
			v.Warnings = append(v.Warnings, fmt.Sprintf("--verify: %d chunks have no checksum to check them against (safetensors stores none)", unchecked))
		}
	}
	sidecars, err := v.findSidecars(opts.HFConfigDir)
	if err != nil {
		v.closeExtra()
		return nil, err
	}
	selected, omitted, err := selectTensors(c, opts.Select)
	var tensors []viewTensor
	if err == nil && opts.Select == "" {
		selected = v.withoutAttribute(selected, sidecars)
	}
	if err == nil {
		v.Omitted = omitted
		tensors, err = v.mapTensors(selected, sidecars, opts)
	}
	if err == nil && v.Mapping == "" && opts.Select == "" && !opts.NoMapping {
		tensors, err = v.savedTied(tensors, sidecars)
	}
	if err == nil && opts.DType != "" {
		tensors, err = castTo(tensors, opts.DType)
	}
	if err == nil {
		err = v.layoutTensors(tensors, opts)
	}
	if err == nil {
		v.shareBoxes(tensors)
	}
	if err != nil {
		v.closeExtra()
		return nil, err
	}
	if cfg := v.generatedConfig(sidecars, newestModTime(c)); cfg != nil {
		sidecars = append(sidecars, cfg)
		sort.Slice(sidecars, func(i, j int) bool { return sidecars[i].Name < sidecars[j].Name })
	}
	v.Files = append(v.Files, sidecars...)
	v.warnNoConfig()
	return v, nil
}

func (v *View) closeExtra() {
	for _, c := range v.extra {
		c.Close()
	}
}

// layoutTensors makes the view's weight files: the checkpoint's own files
// when it is a plain HF directory shown whole, else generated safetensors
// files and their index. A view with nothing to show gets a Note.
func (v *View) layoutTensors(selected []viewTensor, opts Options) error {
	c := v.Checkpoint
	if len(selected) == 0 {
		if opts.Select != "" {
			return fmt.Errorf("layout: %s: --select %q matches no tensor", c.Dir, opts.Select)
		}
		v.Note = fmt.Sprintf("%s: no model weights to show: the checkpoint holds %d tensors of optimizer state "+
			"and %d other items, and no model tensor (ckptfs inspect lists them)", c.Dir, len(v.Omitted), len(c.Objects))
		if len(v.LeavesOutWeights()) > 0 {
			return fmt.Errorf("layout: %s: no tensor to show (%d left out; ckptfs inspect lists why)", c.Dir, len(v.Omitted))
		}
		return nil
	}
	if len(c.Passthrough) > 0 && len(v.Omitted) == 0 && allUnderSavedNames(selected) {
		for _, name := range c.Passthrough {
			f, err := c.Files.Get(name)
			if err != nil {
				return fmt.Errorf("layout: %w", err)
			}
			v.Files = append(v.Files, newPassthroughFile(name, f))
		}
		for _, f := range v.Files {
			v.Tensors = append(v.Tensors, passthroughPlacements(f.Name, selected, c.FileIndex, c.Passthrough)...)
		}
		return nil
	}
	groups := splitFiles(c, selected, opts.MaxShardSize)
	mtime := newestModTime(c)
	weightMap := map[string]string{}
	var total int64
	for i, group := range groups {
		name := hfdir.ShardName(i, len(groups))
		f, err := newTensorFile(name, group, mtime)
		if err != nil {
			return fmt.Errorf("layout: %s: %w", c.Dir, err)
		}
		v.Files = append(v.Files, f)
		for _, p := range f.placements {
			weightMap[p.Name] = name
			total += p.Size
			v.Tensors = append(v.Tensors, p)
		}
	}
	index, err := hfdir.ShardIndex{TotalSize: total, WeightMap: weightMap}.Encode()
	if err != nil {
		return err
	}
	v.Files = append(v.Files, newBytesFile(hfdir.SafetensorsIndex, index, mtime))
	return nil
}

// allUnderSavedNames reports whether every tensor is a checkpoint tensor
// as stored, under its own name.
func allUnderSavedNames(ts []viewTensor) bool {
	for _, t := range ts {
		o := t.content.origin()
		if o.Transform != "" || len(o.Sources) != 1 || o.Sources[0] != t.name {
			return false
		}
	}
	return true
}

// passthroughPlacements describes where the tensors of a plain HF file sit,
// for inspect; the bytes are the file's own.
func passthroughPlacements(file string, ts []viewTensor, index map[string]int, files []string) []Placement {
	var out []Placement
	for _, t := range ts {
		if i := index[t.name]; i >= 1 && i <= len(files) && files[i-1] == file {
			out = append(out, Placement{Name: t.name, File: file, Size: t.content.size(), content: t.content})
		}
	}
	return out
}

// splitFiles groups tensors into files: by the checkpoint's own file index
// when it has one (NeMo, torch's HF writer, a plain HF index), else greedily
// by size in checkpoint order, the way save_pretrained splits.
func splitFiles(c *ckpt.Checkpoint, ts []viewTensor, maxSize int64) [][]viewTensor {
	if len(c.FileIndex) > 0 {
		byIndex := map[int][]viewTensor{}
		var keys []int
		for _, t := range ts {
			i, ok := c.FileIndex[t.content.origin().Sources[0]]
			if !ok {
				i = c.FileIndex[t.name]
			}
			if _, seen := byIndex[i]; !seen {
				keys = append(keys, i)
			}
			byIndex[i] = append(byIndex[i], t)
		}
		sort.Ints(keys)
		groups := make([][]viewTensor, 0, len(keys))
		for _, k := range keys {
			groups = append(groups, byIndex[k])
		}
		return groups
	}
	var groups [][]viewTensor
	var cur []viewTensor
	var size int64
	for _, t := range ts {
		n := t.content.size()
		if len(cur) > 0 && size+n > maxSize {
			groups = append(groups, cur)
			cur, size = nil, 0
		}
		cur = append(cur, t)
		size += n
	}
	if len(cur) > 0 {
		groups = append(groups, cur)
	}
	return groups
}

// newestModTime is the view's mtime: the checkpoint's (its index file's),
// else its directory's.
func newestModTime(c *ckpt.Checkpoint) time.Time {
	if !c.ModTime.IsZero() {
		return c.ModTime
	}
	return source.ModTime(c.Files.Tree(), ".")
}

// findSidecars finds HF sidecar files in the checkpoint directory, in its
// .hf_metadata directory (NeMo), and in the --hf-config directory; the
// first found of a name wins. Without a config.json in any of them, the one
// the checkpoint holds inside (ckpt.Checkpoint.HFConfig) is the view's.
func (v *View) findSidecars(hfConfigDir string) ([]*File, error) {
	c := v.Checkpoint
	type place struct {
		set *ckpt.FileSet
		dir string
	}
	places := []place{{c.Files, "."}, {c.Files, ".hf_metadata"}}
	if hfConfigDir != "" {
		tree, err := source.OpenLocal(hfConfigDir)
		if err != nil {
			return nil, fmt.Errorf("layout: --hf-config: %w", err)
		}
		extra := ckpt.NewFileSet(tree)
		extra.Adopt(tree)
		v.extra = append(v.extra, extra)
		places = append(places, place{extra, "."})
	}
	found := map[string]*ckpt.File{}
	for _, p := range places {
		ents, err := p.set.Tree().ReadDir(p.dir)
		if err != nil {
			continue
		}
		for _, e := range ents {
			if _, dup := found[e.Name]; dup || !e.IsRegular() || !hfdir.IsKnownSidecar(e.Name) {
				continue
			}
			if f, err := p.set.Get(path.Join(p.dir, e.Name)); err == nil {
				found[e.Name] = f
			}
		}
	}
	names := make([]string, 0, len(found))
	for n := range found {
		names = append(names, n)
	}
	sort.Strings(names)
	out := make([]*File, 0, len(names)+1)
	for _, n := range names {
		out = append(out, newPassthroughFile(n, found[n]))
	}
	if _, ok := found[configName]; !ok && len(c.HFConfig) > 0 {
		out = append(out, newBytesFile(configName, c.HFConfig, newestModTime(c)))
		sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	}
	return out, nil
}
