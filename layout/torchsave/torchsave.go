// Package torchsave reads HuggingFace PyTorch weights: pytorch_model.bin, or
// pytorch_model-0000N-of-0000M.bin files named by a
// pytorch_model.bin.index.json, as transformers' save_pretrained(...,
// safe_serialization=False) wrote them: each file a torch.save zip archive
// of a {name: tensor} state dict.
//
// data.pkl is decoded by the restricted pickle VM (nothing is executed;
// every size is bounded) and must be a dict of tensor rebuilds. Records are
// stored uncompressed, so a tensor is a byte range of its storage's data
// entry: storage offset × element size, numel × element size long, for
// C-contiguous strides. Where each entry's bytes start (its local zip
// header) is read on a tensor's first read and remembered, as torchdcp does
// for its records; Open reads the zip directory and data.pkl only.
//
// What a view cannot show right is left out with a reason (ckpt.Skipped),
// never served wrong: non-contiguous strides, dtypes safetensors lacks. A
// tensor that is the very same bytes as an earlier one (a tied lm_head
// saved as an alias of the embeddings) is left out as its alias, as
// save_pretrained leaves it out of safetensors.
package torchsave

import (
	"fmt"
	"regexp"
	"slices"
	"strings"

	"github.com/ckptfs/ckptfs/layout/ckpt"
	"github.com/ckptfs/ckptfs/layout/hfdir"
	"github.com/ckptfs/ckptfs/layout/internal/torchzip"
	"github.com/ckptfs/ckptfs/layout/pickle"
	"github.com/ckptfs/ckptfs/layout/source"
	"github.com/ckptfs/ckptfs/safetensors"
)

const (
	// SingleFile is the weights file of an unsharded model.
	SingleFile = hfdir.TorchFile
	// IndexFile names the file of each tensor of a sharded model.
	IndexFile = hfdir.TorchIndex
)

var shardName = regexp.MustCompile(`^pytorch_model-\d+-of-\d+\.bin$`)

// Reader is the HF PyTorch weights format.
var Reader ckpt.Reader = reader{}

type reader struct{}

func (reader) Format() ckpt.Format { return ckpt.FormatTorchSave }

// Detect reports whether dir has a pytorch_model.bin or its index.
func (reader) Detect(dir source.Tree) bool {
	return source.Exists(dir, IndexFile) || source.Exists(dir, SingleFile)
}

func (reader) Open(dir source.Tree) (*ckpt.Checkpoint, error) { return OpenTree(dir) }

// Internal: the weights files and their index, which the view replaces.
func (reader) Internal(name string) bool { return IsInternal(name) }

// IsInternal reports whether name is a weights file or the index.
func IsInternal(name string) bool {
	return name == SingleFile || name == IndexFile || shardName.MatchString(name)
}

// OpenTree opens the model in the directory tree dir: the index, each
// file's zip directory and data.pkl; no tensor bytes.
func OpenTree(dir source.Tree) (*ckpt.Checkpoint, error) {
	c := &ckpt.Checkpoint{Dir: dir.Path("."), Format: ckpt.FormatTorchSave, Files: ckpt.NewFileSet(dir)}
	if err := build(c, dir); err != nil {
		c.Close()
		return nil, err
	}
	return c, nil
}

func build(c *ckpt.Checkpoint, dir source.Tree) error {
	files, weightMap, err := listFiles(dir)
	if err != nil {
		return err
	}
	o := opener{c: c, weightMap: weightMap, names: map[string]string{}}
	if weightMap != nil {
		c.FileIndex = map[string]int{}
	}
	for i, name := range files {
		if err := o.addFile(name, i+1); err != nil {
			return err
		}
	}
	if weightMap != nil {
		o.unindexed(dir, files)
	}
	for name, file := range weightMap {
		if _, ok := o.names[name]; !ok {
			return fmt.Errorf("%w: torchsave: %s says tensor %q is in %s, which does not hold it",
				ckpt.ErrInvalid, dir.Path(IndexFile), name, file)
		}
	}
	for _, t := range c.Tensors {
		if err := t.Validate(); err != nil {
			return fmt.Errorf("torchsave: %s: %w", c.Dir, err)
		}
	}
	return nil
}

// listFiles returns the weight files of dir in index order, and the index's
// weight map (nil for a single file).
func listFiles(dir source.Tree) ([]string, map[string]string, error) {
	files, weightMap, err := hfdir.WeightFiles(dir, IndexFile, SingleFile)
	if err != nil {
		return nil, nil, fmt.Errorf("torchsave: %w", err)
	}
	return files, weightMap, nil
}

// unindexed reports the shard files in dir that the index does not name
// (files): hidden as the format's own, so each is said in a warning and
// its tensors listed as skipped, never dropped in silence.
func (o *opener) unindexed(dir source.Tree, files []string) {
	ents, err := dir.ReadDir(".")
	if err != nil {
		o.c.Warnings = append(o.c.Warnings, fmt.Sprintf("torchsave: listing %s: %v", dir.Path("."), err))
		return
	}
	for _, e := range ents {
		if !shardName.MatchString(e.Name) || slices.Contains(files, e.Name) {
			continue
		}
		reason := fmt.Sprintf("in %s, which %s does not name", e.Name, IndexFile)
		names, err := o.tensorNames(e.Name)
		if err != nil {
			o.c.Warnings = append(o.c.Warnings, fmt.Sprintf("%s: not in the view: %s does not name it (and it cannot be read: %v)",
				dir.Path(e.Name), IndexFile, err))
			continue
		}
		o.c.Warnings = append(o.c.Warnings, fmt.Sprintf("%s: not in the view: %s does not name it; its %d tensors are skipped",
			dir.Path(e.Name), IndexFile, len(names)))
		for _, n := range names {
			o.c.Skipped = append(o.c.Skipped, ckpt.Skipped{Name: n, Reason: reason})
		}
	}
}

// tensorNames lists the keys of the state dict in the weights file name.
func (o *opener) tensorNames(name string) ([]string, error) {
	f, err := o.c.Files.Get(name)
	if err != nil {
		return nil, err
	}
	a, err := openArchive(f)
	if err != nil {
		return nil, err
	}
	items, err := a.stateDict()
	if err != nil {
		return nil, err
	}
	var names []string
	for _, it := range items {
		n, ok := it.Key.(string)
		if !ok {
			return nil, fmt.Errorf("data.pkl: key %s is not a str", pickle.Repr(it.Key))
		}
		names = append(names, n)
	}
	return names, nil
}

type opener struct {
	c         *ckpt.Checkpoint
	weightMap map[string]string
	names     map[string]string // tensor (or alias) name → file holding it
}

// addFile adds the tensors of one weights file.
func (o *opener) addFile(name string, index int) error {
	f, err := o.c.Files.Get(name)
	if err != nil {
		return fmt.Errorf("torchsave: %w", err)
	}
	a, err := openArchive(f)
	if err != nil {
		return fmt.Errorf("%w: torchsave: %s: %w", ckpt.ErrInvalid, f.Path, err)
	}
	items, err := a.stateDict()
	if err != nil {
		return fmt.Errorf("%w: torchsave: %s: %w", ckpt.ErrInvalid, f.Path, err)
	}
	if err := o.addTensors(a, name, index, items); err != nil {
		return fmt.Errorf("%w: torchsave: %s: %w", ckpt.ErrInvalid, f.Path, err)
	}
	return nil
}

// openArchive opens f through torchzip.Open, the one way into a torch.save
// archive, with its checks.
func openArchive(f *ckpt.File) (*Archive, error) {
	z, err := torchzip.Open(f, f.Size())
	if err != nil {
		return nil, err
	}
	return &Archive{z: z, file: f, storages: map[string]*storage{}}, nil
}

// stateDict decodes data.pkl: the items of a dict (or OrderedDict).
func (a *Archive) stateDict() ([]pickle.DictItem, error) {
	v, err := a.decode()
	if err != nil {
		return nil, err
	}
	if items, ok := DictItems(v); ok {
		return items, nil
	}
	return nil, fmt.Errorf("data.pkl holds %s, not a state dict of tensors", describe(v))
}

// decode decodes data.pkl within the limits of a whole torch.save file.
func (a *Archive) decode() (any, error) { return a.z.Decode(torchzip.WholeFile) }

// DictItems returns the items of v when it is a dict or an
// collections.OrderedDict (as torch.save writes a state dict).
func DictItems(v any) ([]pickle.DictItem, bool) {
	switch x := v.(type) {
	case *pickle.Dict:
		return x.Items(), true
	case *pickle.Object:
		if x.Is("collections", "OrderedDict") && len(x.Args) == 0 && len(x.Extras().Appended) == 0 {
			if x.Extras().Items == nil {
				return nil, true
			}
			return x.Extras().Items.Items(), true
		}
	}
	return nil, false
}

// describe names a decoded value in messages: its class for an object.
func describe(v any) string {
	if o, ok := v.(*pickle.Object); ok && o.Class.Module != "" {
		return o.Class.String() + "(...)"
	}
	return pickle.TypeName(v)
}

// stored is where a tensor's bytes are: a range of one storage.
type stored struct {
	key         string
	start, size int64
	dtype       safetensors.DType
	shape       []int64
	name        string
	st          *storage
}

// tensor resolves v, a decoded data.pkl value named what in messages, to
// the bytes of a tensor in one of a's storages (remembered by key). A
// tensor a view cannot show right gives a reason to leave it out instead.
func (a *Archive) tensor(v any, what string) (stored, string, error) {
	r, err := torchzip.ParseRebuild(v, what)
	if err != nil {
		if o, ok := v.(*pickle.Object); ok && o.Class.Module != "" && !strings.HasPrefix(o.Class.Module, "torch") {
			err = fmt.Errorf("%s is %s, not a tensor", what, describe(o))
		}
		return stored{}, "", err
	}
	dt, typed, err := r.StorageDType()
	if err != nil {
		return stored{}, "", fmt.Errorf("%s: %w", what, err)
	}
	st, err := a.storage(r.Storage, typed, dt)
	if err != nil {
		return stored{}, "", fmt.Errorf("%s: %w", what, err)
	}
	sdt, elem, ok := torchzip.DType(dt)
	if !ok {
		if torchzip.TorchOnlyDTypes[dt] {
			return stored{}, fmt.Sprintf("dtype torch.%s has no safetensors equivalent", dt), nil
		}
		return stored{}, "", fmt.Errorf("%s: torch.%s is not a torch dtype", what, dt)
	}
	numel, err := ckpt.NumElements(r.Size)
	if err != nil || numel > (1<<62)/elem || r.StorageOffset > (1<<62)/elem {
		return stored{}, "", fmt.Errorf("%s: shape %v at storage offset %d overflows", what, r.Size, r.StorageOffset)
	}
	if !torchzip.Contiguous(r.Size, r.Stride) {
		return stored{}, fmt.Sprintf("strides %v for shape %v are not C-contiguous (saved as a view of a larger tensor)", r.Stride, r.Size), nil
	}
	start, nbytes := r.StorageOffset*elem, numel*elem
	if start > st.size || nbytes > st.size-start {
		return stored{}, "", fmt.Errorf("%s: bytes [%d, %d) outside its storage %s of %d bytes",
			what, start, start+nbytes, st.entry.Name, st.size)
	}
	return stored{key: r.Storage.Key, start: start, size: nbytes, dtype: sdt, shape: r.Size, st: st}, "", nil
}

func (o *opener) addTensors(a *Archive, file string, index int, items []pickle.DictItem) error {
	var kept []stored // tensors shown from this file
	for _, it := range items {
		name, ok := it.Key.(string)
		if !ok {
			return fmt.Errorf("data.pkl: key %s is not a str", pickle.Repr(it.Key))
		}
		if prev, dup := o.names[name]; dup {
			return fmt.Errorf("tensor %q is also in %s", name, prev)
		}
		o.names[name] = file
		if o.weightMap != nil && o.weightMap[name] != file {
			return fmt.Errorf("tensor %q is not indexed to this file by %s", name, IndexFile)
		}
		what := fmt.Sprintf("data.pkl[%q]", name)
		s, skip, err := a.tensor(it.Value, what)
		if err != nil {
			return err
		}
		if skip != "" {
			o.c.Skipped = append(o.c.Skipped, ckpt.Skipped{Name: name, Reason: skip})
			continue
		}
		s.name = name
		if alias := aliasOf(kept, s); alias != "" {
			o.c.Skipped = append(o.c.Skipped, ckpt.Skipped{Name: name, Reason: fmt.Sprintf(
				"the same bytes as %s (tied weights saved as one storage), as save_pretrained leaves it out", alias)})
			continue
		}
		kept = append(kept, s)
		o.c.Tensors = append(o.c.Tensors, &ckpt.Tensor{
			Name: name, DType: s.dtype, Shape: s.shape,
			Chunks: ckpt.MakeChunks(ckpt.Chunk{
				Offsets: make([]int64, len(s.shape)),
				Sizes:   s.shape,
				Source:  &tensorSource{st: s.st, start: s.start, n: s.size, tensor: name},
			}),
		})
		if o.c.FileIndex != nil {
			o.c.FileIndex[name] = index
		}
	}
	return nil
}

// aliasOf returns the name of an earlier tensor that is s exactly: the same
// bytes of the same storage, dtype and shape.
func aliasOf(kept []stored, s stored) string {
	for _, k := range kept {
		if k.key == s.key && k.start == s.start && k.size == s.size && k.dtype == s.dtype && slices.Equal(k.shape, s.shape) {
			return k.name
		}
	}
	return ""
}

// storage returns the data entry of a persistent storage, checked against
// the size data.pkl gives it; every reference to one key must agree.
func (a *Archive) storage(ref *torchzip.Storage, typed bool, dtype string) (*storage, error) {
	if st := a.storages[ref.Key]; st != nil {
		if st.ref.Type != ref.Type || st.ref.Numel != ref.Numel {
			return nil, fmt.Errorf("storage %q is %s of %d and %s of %d", ref.Key, st.ref.Type, st.ref.Numel, ref.Type, ref.Numel)
		}
		return st, nil
	}
	e, err := a.z.Entry("data/" + ref.Key)
	if err != nil {
		return nil, err
	}
	nbytes := ref.Numel
	if typed {
		_, elem, _ := torchzip.DType(dtype) // typed storages all have a safetensors dtype
		if elem <= 0 || ref.Numel > (1<<62)/elem {
			return nil, fmt.Errorf("storage %q of %d elements overflows", ref.Key, ref.Numel)
		}
		nbytes = ref.Numel * elem
	}
	if uint64(nbytes) != e.UncompressedSize64 {
		return nil, fmt.Errorf("storage %q of %d bytes, but %s holds %d", ref.Key, nbytes, e.Name, e.UncompressedSize64)
	}
	st := &storage{file: a.file, entry: e, size: nbytes, ref: *ref}
	a.storages[ref.Key] = st
	return st, nil
}
