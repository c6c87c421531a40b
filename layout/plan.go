package layout

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"github.com/ckptfs/ckptfs/layout/ckpt"
)

// DefaultMaxShardSize is the HF default split (transformers v4, huggingface_hub).
const DefaultMaxShardSize = 5_000_000_000

// IndexName is the name of the HF shard index in a view.
const IndexName = "model.safetensors.index.json"

// PlanOptions choose what a view holds and how it is split into files.
type PlanOptions struct {
	// Select is the key of the subtree to show (e.g. "model"), matched against
	// the saved nesting; the prefix is removed from view names. Empty means:
	// the "model" subtree when the state was saved nested under "model", else
	// every tensor. Optimizer state is never shown.
	Select string
	// MaxShardSize splits files (bytes of tensor data per file); 0 = default.
	MaxShardSize int64
	// HFConfigDir supplies sidecars (config.json, tokenizer files) the
	// checkpoint lacks.
	HFConfigDir string
}

// View is the HF directory a checkpoint is shown as: safetensors files, the
// index, and sidecars. Views are immutable.
type View struct {
	Checkpoint *ckpt.Checkpoint
	Files      []*File
	// Tensors maps view name → tensor, in file order.
	Tensors []Placement
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

// TotalSize is the sum of the view's safetensors file sizes.
func (v *View) TotalSize() int64 {
	var n int64
	for _, f := range v.Files {
		n += f.Size
	}
	return n
}

// Plan builds the HF view of a checkpoint. It touches no shard data.
func Plan(c *ckpt.Checkpoint, opts PlanOptions) (*View, error) {
	if opts.MaxShardSize <= 0 {
		opts.MaxShardSize = DefaultMaxShardSize
	}
	selected, err := selectTensors(c, opts.Select)
	if err != nil {
		return nil, err
	}
	if len(selected) == 0 {
		return nil, fmt.Errorf("layout: %s: no tensors to show (select %q)", c.Dir, opts.Select)
	}
	groups, err := splitFiles(c, selected, opts.MaxShardSize)
	if err != nil {
		return nil, err
	}
	mtime := newestModTime(c)
	v := &View{Checkpoint: c}
	weightMap := map[string]string{}
	var total int64
	for i, group := range groups {
		name := "model.safetensors"
		if len(groups) > 1 {
			name = fmt.Sprintf("model-%05d-of-%05d.safetensors", i+1, len(groups))
		}
		f, err := newTensorFile(name, group, mtime)
		if err != nil {
			return nil, fmt.Errorf("layout: %s: %w", c.Dir, err)
		}
		v.Files = append(v.Files, f)
		for _, p := range f.placements {
			weightMap[p.Name] = name
			total += p.Size
			v.Tensors = append(v.Tensors, p)
		}
	}
	index, err := json.MarshalIndent(map[string]any{
		"metadata":   map[string]any{"total_size": total},
		"weight_map": weightMap,
	}, "", "  ")
	if err != nil {
		return nil, err
	}
	v.Files = append(v.Files, newBytesFile(IndexName, append(index, '\n'), mtime))
	for _, sc := range sidecars(c, opts.HFConfigDir) {
		v.Files = append(v.Files, sc)
	}
	return v, nil
}

// named is a tensor with the name it has in the view.
type named struct {
	name   string
	tensor *ckpt.Tensor
}

// optimizerRoots are top-level keys whose subtrees are optimizer state.
var optimizerRoots = map[string]bool{"optimizer": true, "optim": true, "optimizers": true, "opt": true}

// selectTensors picks the tensors of the view and their view names.
func selectTensors(c *ckpt.Checkpoint, sel string) ([]named, error) {
	if sel == "" {
		for _, t := range c.Tensors {
			if root, _, ok := splitRoot(t); ok && root == "model" {
				sel = "model"
				break
			}
		}
	}
	var out []named
	seen := map[string]bool{}
	for _, t := range c.Tensors {
		var name string
		if sel == "" {
			if root, _, ok := splitRoot(t); ok && optimizerRoots[root] {
				continue
			}
			name = t.Name
		} else {
			rest, ok := under(t, sel)
			if !ok {
				continue
			}
			name = rest
		}
		if seen[name] {
			return nil, fmt.Errorf("layout: %s: two tensors map to view name %q", c.Dir, name)
		}
		seen[name] = true
		out = append(out, named{name, t})
	}
	if sel != "" && len(out) == 0 {
		return nil, fmt.Errorf("layout: %s: --select %q matches no tensor", c.Dir, sel)
	}
	return out, nil
}

// splitRoot returns the top-level key of a tensor and the rest of its name,
// from the saved nesting when known, else from the first dot of the name.
func splitRoot(t *ckpt.Tensor) (root, rest string, ok bool) {
	if len(t.Path) >= 2 {
		return t.Path[0], strings.Join(t.Path[1:], "."), true
	}
	if len(t.Path) == 1 {
		return "", "", false
	}
	return strings.Cut(t.Name, ".")
}

// under reports whether t lies in the subtree sel (a dotted key matched
// against whole nesting levels) and returns its name relative to sel.
func under(t *ckpt.Tensor, sel string) (string, bool) {
	if len(t.Path) == 0 {
		rest, ok := strings.CutPrefix(t.Name, sel+".")
		return rest, ok && rest != ""
	}
	prefix := ""
	for i, part := range t.Path[:len(t.Path)-1] {
		if i > 0 {
			prefix += "."
		}
		prefix += part
		if prefix == sel {
			return strings.Join(t.Path[i+1:], "."), true
		}
		if !strings.HasPrefix(sel, prefix+".") {
			return "", false
		}
	}
	return "", false
}

// splitFiles groups tensors into files: by the checkpoint's own file index
// when it has one (NeMo, torch's HF writer), else greedily by size in
// checkpoint order, the way save_pretrained splits.
func splitFiles(c *ckpt.Checkpoint, ts []named, maxSize int64) ([][]named, error) {
	if len(c.FileIndex) > 0 {
		byIndex := map[int][]named{}
		var keys []int
		for _, t := range ts {
			i, ok := c.FileIndex[t.tensor.Name]
			if !ok {
				i = c.FileIndex[t.name]
			}
			if _, seen := byIndex[i]; !seen {
				keys = append(keys, i)
			}
			byIndex[i] = append(byIndex[i], t)
		}
		sort.Ints(keys)
		groups := make([][]named, 0, len(keys))
		for _, k := range keys {
			groups = append(groups, byIndex[k])
		}
		return groups, nil
	}
	var groups [][]named
	var cur []named
	var size int64
	for _, t := range ts {
		n := t.tensor.ByteSize()
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
	return groups, nil
}

func newestModTime(c *ckpt.Checkpoint) time.Time {
	var newest time.Time
	for _, name := range []string{".metadata", "metadata.json"} {
		if fi, err := os.Stat(filepath.Join(c.Dir, name)); err == nil && fi.ModTime().After(newest) {
			newest = fi.ModTime()
		}
	}
	if newest.IsZero() {
		if fi, err := os.Stat(c.Dir); err == nil {
			newest = fi.ModTime()
		}
	}
	return newest
}

// sidecarNames are the files an HF model directory carries beside weights.
var sidecarPatterns = []string{
	"config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json",
	"tokenizer.model", "special_tokens_map.json", "added_tokens.json", "vocab.json",
	"vocab.txt", "merges.txt", "chat_template.jinja", "chat_template.json",
	"preprocessor_config.json", "processor_config.json", "*.tiktoken", "spiece.model",
}

func isSidecar(name string) bool {
	for _, p := range sidecarPatterns {
		if ok, _ := filepath.Match(p, name); ok {
			return true
		}
	}
	return false
}

// sidecars finds HF sidecar files next to the checkpoint, in its .hf_metadata
// directory (NeMo), and in the --hf-config directory, first found wins.
func sidecars(c *ckpt.Checkpoint, hfConfigDir string) []*File {
	found := map[string]string{}
	for name, path := range c.Sidecars {
		found[name] = path
	}
	dirs := []string{c.Dir, filepath.Join(c.Dir, ".hf_metadata")}
	if hfConfigDir != "" {
		dirs = append(dirs, hfConfigDir)
	}
	for _, dir := range dirs {
		entries, err := os.ReadDir(dir)
		if err != nil {
			continue
		}
		for _, e := range entries {
			if _, dup := found[e.Name()]; dup || !isSidecar(e.Name()) {
				continue
			}
			if fi, err := os.Stat(filepath.Join(dir, e.Name())); err == nil && fi.Mode().IsRegular() {
				found[e.Name()] = filepath.Join(dir, e.Name())
			}
		}
	}
	names := make([]string, 0, len(found))
	for n := range found {
		names = append(names, n)
	}
	sort.Strings(names)
	var out []*File
	for _, n := range names {
		if f, err := newDiskFile(n, found[n]); err == nil {
			out = append(out, f)
		}
	}
	return out
}
