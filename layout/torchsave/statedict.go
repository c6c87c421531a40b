package torchsave

// A torch.save state dict under any file name (model.pt, a Lightning
// .ckpt, checkpoint.pth, weights.bin), recognised by what it holds, not by
// its name: a torch.save zip archive whose data.pkl is a dict of tensors,
// flat (torch.save(model.state_dict(), ...)) or nested, with the model
// under one of the view's model roots (state_dict, model, module,
// model_state_dict, state.model) beside optimizer state, hyper-parameters
// and other training state. Every tensor of a nested file keeps its saved
// nesting (Tensor.Path), so the view picks the model subtree and lists
// optimizer state as optimizer state, as it does for DCP.

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"

	"github.com/ckptfs/ckptfs/layout/ckpt"
	"github.com/ckptfs/ckptfs/layout/pickle"
	"github.com/ckptfs/ckptfs/layout/source"
)

// StateDictReader is a torch.save state dict under any name.
var StateDictReader ckpt.Reader = stateReader{}

// stateExts are the endings torch.save files are given.
var stateExts = []string{".pt", ".pth", ".ckpt", ".bin"}

// Limits on what Detect looks at in one directory.
const (
	// maxCandidates bounds the torch.save files Detect decodes.
	maxCandidates = 16
	// minArchive is the smallest zip: an end record.
	minArchive = 22
)

// modelKeys are the top-level keys a model's state dict is saved under
// (the view's model roots, Composer's "state" holding "model").
var modelKeys = []string{"state_dict", "model", "module", "model_state_dict", "state"}

// foreignKeys mark a top-level dict as another format's file, which its own
// reader opens with what the rest of its directory says: Megatron-LM's
// model_optim_rng.pt (one model-parallel rank), DeepSpeed's model states
// (ZeRO partitions).
var foreignKeys = []string{"checkpoint_version", "ds_version"}

type stateReader struct{}

func (stateReader) Format() ckpt.Format { return ckpt.FormatTorchStateDict }

// Detect reports whether exactly one file of dir is a torch.save state
// dict (see StateDictFile).
func (stateReader) Detect(dir source.Tree) bool {
	name, err := StateDictFile(dir)
	return err == nil && name != ""
}

func (stateReader) Open(dir source.Tree) (*ckpt.Checkpoint, error) { return OpenStateDict(dir) }

// Internal: nothing; the file is shown as it is beside the view (its name
// is no HF name a loader would look for).
func (stateReader) Internal(string) bool { return false }

// detected remembers, per file version, whether it is a state dict: a
// directory that is not a checkpoint is looked at again on later lookups,
// and its files decoded once.
var detected struct {
	sync.Mutex
	m map[string]bool
}

// maxDetected bounds detected.
const maxDetected = 4096

// StateDictFile returns the one file of dir that is a torch.save state
// dict, "" when there is none, and an error naming them when there are
// several (a view shows one model).
func StateDictFile(dir source.Tree) (string, error) {
	ents, err := dir.ReadDir(".")
	if err != nil {
		return "", err
	}
	var found []string
	tried := 0
	ids := map[string]bool{}
	for _, e := range ents {
		if !e.IsRegular() || e.Size < minArchive || !slices.ContainsFunc(stateExts, func(x string) bool { return strings.HasSuffix(e.Name, x) }) {
			continue
		}
		// Two names of one file (Composer's latest-rank0.pt links to the
		// checkpoint it saved last) are one state dict.
		if e.ID != "" {
			if ids[e.ID] {
				continue
			}
			ids[e.ID] = true
		}
		if tried++; tried > maxCandidates {
			return "", fmt.Errorf("more than %d torch.save candidates", maxCandidates)
		}
		if isStateDict(dir, e) {
			found = append(found, e.Name)
		}
	}
	switch len(found) {
	case 0:
		return "", nil
	case 1:
		return found[0], nil
	}
	return "", fmt.Errorf("%d torch.save state dicts (%s): a view shows one", len(found), strings.Join(found, ", "))
}

// isStateDict reports whether the file e of dir is a torch.save state dict.
func isStateDict(dir source.Tree, e source.Info) bool {
	key := dir.Path(e.Name) + "\x00" + e.Version
	detected.Lock()
	ok, seen := detected.m[key]
	detected.Unlock()
	if seen {
		return ok
	}
	ok = func() bool {
		fs := ckpt.NewFileSet(dir)
		defer fs.Close()
		f, err := fs.Get(e.Name)
		if err != nil {
			return false
		}
		a, err := openArchive(f)
		if err != nil {
			return false
		}
		v, err := a.decode()
		if err != nil {
			return false
		}
		_, ok := stateTensors(v)
		return ok
	}()
	detected.Lock()
	if detected.m == nil || len(detected.m) >= maxDetected {
		detected.m = map[string]bool{}
	}
	detected.m[key] = ok
	detected.Unlock()
	return ok
}

// found is a tensor value of a decoded state dict and its saved nesting.
type found struct {
	path  []string
	value any
}

// stateTensors returns the tensors of v, each with its saved nesting, when
// v is a state dict: a dict whose values are all tensors (flat: no
// nesting recorded), or a dict with a model root (modelKeys; Composer's
// state.model) that is a dict of tensors. Anything else is no state dict.
func stateTensors(v any) ([]found, bool) {
	items, ok := DictItems(v)
	if !ok || len(items) == 0 {
		return nil, false
	}
	if flat, ok := tensorItems(items); ok {
		out := make([]found, len(flat))
		for i, it := range flat {
			out[i] = found{path: []string{it.Key.(string)}, value: it.Value}
		}
		return out, true
	}
	top := map[string]any{}
	for _, it := range items {
		if k, ok := it.Key.(string); ok {
			top[k] = it.Value
		}
	}
	for _, k := range foreignKeys {
		if _, ok := top[k]; ok {
			return nil, false
		}
	}
	model := false
	for _, k := range modelKeys {
		sub, ok := DictItems(top[k])
		if ok && k == "state" {
			sub, ok = DictItems(dictGet(sub, "model"))
		}
		if _, isModel := tensorItems(sub); ok && len(sub) > 0 && isModel {
			model = true
			break
		}
	}
	if !model {
		return nil, false
	}
	var out []found
	walk(v, nil, &out, 0)
	return out, true
}

// dictGet returns the value of key in items, or nil.
func dictGet(items []pickle.DictItem, key string) any {
	for _, it := range items {
		if k, ok := it.Key.(string); ok && k == key {
			return it.Value
		}
	}
	return nil
}

// tensorItems returns items when every key is a str and every value a
// tensor.
func tensorItems(items []pickle.DictItem) ([]pickle.DictItem, bool) {
	for _, it := range items {
		if _, ok := it.Key.(string); !ok || !looksTensor(it.Value) {
			return nil, false
		}
	}
	return items, true
}

// looksTensor reports whether v is a torch tensor rebuild (a Parameter or
// subclass too), well formed or not: Open resolves it or says what is
// wrong, rather than take a broken tensor for a non-tensor value.
func looksTensor(v any) bool {
	o, ok := v.(*pickle.Object)
	return ok && (o.Class.Module == "torch._utils" || o.Class.Module == "torch._tensor") && strings.HasPrefix(o.Class.Name, "_rebuild")
}

// maxNesting bounds how deep walk follows dicts and sequences (the
// decoder bounds the depth of what it builds too).
const maxNesting = 64

// walk collects the tensors under v, keyed by the path of dict keys and
// sequence indices that leads to each. Other values (hyper-parameters,
// counters, RNG states of Python objects) are no tensors and no view's.
func walk(v any, at []string, out *[]found, depth int) {
	if depth > maxNesting {
		return
	}
	if looksTensor(v) {
		*out = append(*out, found{path: slices.Clone(at), value: v})
		return
	}
	if items, ok := DictItems(v); ok {
		for _, it := range items {
			walk(it.Value, append(at, keyString(it.Key)), out, depth+1)
		}
		return
	}
	if seq, ok := pickle.Seq(v); ok {
		for i, x := range seq {
			walk(x, append(at, strconv.Itoa(i)), out, depth+1)
		}
	}
}

// keyString names a dict key in a tensor's path: a str as it is, an int
// (an optimizer's parameter index) in decimal, anything else as Python
// prints it.
func keyString(k any) string {
	if s, ok := k.(string); ok {
		return s
	}
	if n, ok := pickle.Int(k); ok {
		return strconv.FormatInt(n, 10)
	}
	return pickle.Repr(k)
}

// OpenStateDict opens the torch.save state dict of dir (StateDictFile):
// its zip directory and data.pkl; no tensor bytes.
func OpenStateDict(dir source.Tree) (*ckpt.Checkpoint, error) {
	name, err := StateDictFile(dir)
	if err != nil {
		return nil, fmt.Errorf("%w: torchsave: %s: %w", ckpt.ErrInvalid, dir.Path("."), err)
	}
	if name == "" {
		return nil, fmt.Errorf("%w: torchsave: %s holds no torch.save state dict", ckpt.ErrInvalid, dir.Path("."))
	}
	c := &ckpt.Checkpoint{Dir: dir.Path("."), Format: ckpt.FormatTorchStateDict, Files: ckpt.NewFileSet(dir)}
	if err := buildStateDict(c, name); err != nil {
		c.Close()
		return nil, err
	}
	return c, nil
}

func buildStateDict(c *ckpt.Checkpoint, name string) error {
	f, err := c.Files.Get(name)
	if err != nil {
		return fmt.Errorf("torchsave: %w", err)
	}
	fail := func(err error) error { return fmt.Errorf("%w: torchsave: %s: %w", ckpt.ErrInvalid, f.Path, err) }
	a, err := openArchive(f)
	if err != nil {
		return fail(err)
	}
	v, err := a.decode()
	if err != nil {
		return fail(err)
	}
	tensors, ok := stateTensors(v)
	if !ok {
		return fail(fmt.Errorf("data.pkl holds %s, not a state dict of tensors", describe(v)))
	}
	nested := !isFlat(v)
	if cfg, err := embeddedConfig(v); err != nil {
		c.Warnings = append(c.Warnings, fmt.Sprintf("%s: no config.json from the checkpoint: %v", f.Path, err))
	} else {
		c.HFConfig = cfg
	}
	seen := map[string]bool{}
	var kept []stored
	for _, t := range tensors {
		tname := strings.Join(t.path, ".")
		if seen[tname] {
			return fail(fmt.Errorf("two tensors are named %q", tname))
		}
		seen[tname] = true
		what := "data.pkl" + pyPath(t.path)
		s, skip, err := a.tensor(t.value, what)
		if err != nil {
			return fail(err)
		}
		if skip != "" {
			c.Skipped = append(c.Skipped, ckpt.Skipped{Name: tname, Reason: skip})
			continue
		}
		s.name = tname
		if alias := aliasOf(kept, s); alias != "" {
			c.Skipped = append(c.Skipped, ckpt.Skipped{Name: tname, Reason: fmt.Sprintf(
				"the same bytes as %s (tied weights saved as one storage), as save_pretrained leaves it out", alias)})
			continue
		}
		kept = append(kept, s)
		tn := &ckpt.Tensor{
			Name: tname, DType: s.dtype, Shape: s.shape,
			Chunks: ckpt.MakeChunks(ckpt.Chunk{
				Offsets: make([]int64, len(s.shape)),
				Sizes:   s.shape,
				Source:  &tensorSource{st: s.st, start: s.start, n: s.size, tensor: tname},
			}),
		}
		if nested {
			tn.Path = t.path
		}
		if err := tn.Validate(); err != nil {
			return fail(err)
		}
		c.Tensors = append(c.Tensors, tn)
	}
	return nil
}

// isFlat reports whether v is a dict of tensors alone.
func isFlat(v any) bool {
	items, _ := DictItems(v)
	_, ok := tensorItems(items)
	return ok
}

// pyPath words a path as Python indexes it: ["state_dict"]["w"].
func pyPath(p []string) string {
	var b strings.Builder
	for _, k := range p {
		b.WriteString(fmt.Sprintf("[%q]", k))
	}
	return b.String()
}
