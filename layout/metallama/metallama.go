// Package metallama reads Meta's original Llama checkpoints, as Meta
// publishes them (the original/ folder of every Llama repo on the hub):
// params.json beside consolidated.00.pth, consolidated.01.pth, ..., one
// torch.save state dict per model-parallel rank, under Meta's names
// (tok_embeddings, layers.N.attention.wq, feed_forward.w1, ...).
//
// The ranks' tensors are merged along the dimension Meta's model-parallel
// layers split them on, as transformers' convert_llama_weights_to_hf
// concatenates them: column-parallel wq/wk/wv/w1/w3/output on dim 0,
// row-parallel wo/w2 on dim 1, the norms (and rope.freqs) replicated. The
// embeddings are split on dim 1 by Llama 1/2's ParallelEmbedding and on
// dim 0 by Llama 3's VocabParallelEmbedding: which one is read from their
// shape against params.json's dim. The merged tensors keep Meta's names,
// which are torchtitan's: the torchtitan-llama mapping makes the HF names,
// q and k permuted to HF's rotate-half order, as the converter permutes
// them. params.json is the model's record (Record), from which the view's
// config.json is written when the checkpoint has none.
package metallama

import (
	"fmt"
	"regexp"
	"slices"
	"strconv"

	"github.com/ckptfs/ckptfs/layout/ckpt"
	"github.com/ckptfs/ckptfs/layout/source"
	"github.com/ckptfs/ckptfs/layout/torchsave"
)

// ParamsFile is Meta's model description.
const ParamsFile = "params.json"

// shardName is one model-parallel rank's file.
var shardName = regexp.MustCompile(`^consolidated\.([0-9]{2,})\.pth$`)

// maxShards bounds the model-parallel ranks (Llama 3.1 405B has 16).
const maxShards = 1024

// Reader is Meta's original Llama format.
var Reader ckpt.Reader = reader{}

type reader struct{}

func (reader) Format() ckpt.Format { return ckpt.FormatMetaLlama }

// Detect reports whether dir has params.json and consolidated.00.pth.
func (reader) Detect(dir source.Tree) bool {
	return source.Exists(dir, ParamsFile) && source.Exists(dir, "consolidated.00.pth")
}

func (reader) Open(dir source.Tree) (*ckpt.Checkpoint, error) { return OpenTree(dir) }

// Internal: the rank files, which the view replaces; params.json shows
// through.
func (reader) Internal(name string) bool { return shardName.MatchString(name) }

// OpenTree opens the checkpoint in dir: params.json, each rank file's zip
// directory and data.pkl; no tensor bytes.
func OpenTree(dir source.Tree) (*ckpt.Checkpoint, error) {
	c := &ckpt.Checkpoint{Dir: dir.Path("."), Format: ckpt.FormatMetaLlama, Files: ckpt.NewFileSet(dir)}
	if err := build(c, dir); err != nil {
		c.Close()
		return nil, err
	}
	return c, nil
}

// shard is one rank's tensors by name, in saved order.
type shard struct {
	file    string
	names   []string
	tensors map[string]*torchsave.Tensor
}

func build(c *ckpt.Checkpoint, dir source.Tree) error {
	p, err := readParams(dir)
	if err != nil {
		return err
	}
	files, err := shardFiles(dir)
	if err != nil {
		return err
	}
	shards := make([]*shard, len(files))
	for i, name := range files {
		if shards[i], err = readShard(c, name); err != nil {
			return err
		}
	}
	for _, s := range shards[1:] {
		if !slices.Equal(sortedNames(s), sortedNames(shards[0])) {
			return fmt.Errorf("%w: metallama: %s and %s hold different tensors (%s)", ckpt.ErrInvalid,
				dir.Path(shards[0].file), dir.Path(s.file), firstDifference(shards[0], s))
		}
	}
	for _, name := range shards[0].names {
		t, err := merge(name, shards, p, dir)
		if err != nil {
			return err
		}
		if t == nil {
			continue
		}
		if err := t.Validate(); err != nil {
			return fmt.Errorf("metallama: %s: %w", c.Dir, err)
		}
		c.Tensors = append(c.Tensors, t)
	}
	c.Record = newRecord(p, c)
	return nil
}

// shardFiles lists consolidated.NN.pth in rank order: 00 up to the last,
// none missing.
func shardFiles(dir source.Tree) ([]string, error) {
	ents, err := dir.ReadDir(".")
	if err != nil {
		return nil, fmt.Errorf("metallama: %w", err)
	}
	byRank := map[int]string{}
	for _, e := range ents {
		m := shardName.FindStringSubmatch(e.Name)
		if m == nil {
			continue
		}
		r, err := strconv.Atoi(m[1])
		if err != nil || r >= maxShards {
			return nil, fmt.Errorf("%w: metallama: %s: rank %s is more than %d", ckpt.ErrInvalid, dir.Path(e.Name), m[1], maxShards)
		}
		if prev, dup := byRank[r]; dup {
			return nil, fmt.Errorf("%w: metallama: %s and %s are both rank %d", ckpt.ErrInvalid, dir.Path(prev), dir.Path(e.Name), r)
		}
		byRank[r] = e.Name
	}
	files := make([]string, len(byRank))
	for r := range files {
		name, ok := byRank[r]
		if !ok {
			return nil, fmt.Errorf("%w: metallama: %s: rank %d of %d is missing (consolidated.%02d.pth)", ckpt.ErrInvalid, dir.Path("."), r, len(byRank), r)
		}
		files[r] = name
	}
	return files, nil
}

// readShard reads one rank file: a flat {name: tensor} dict.
func readShard(c *ckpt.Checkpoint, name string) (*shard, error) {
	f, err := c.Files.Get(name)
	if err != nil {
		return nil, fmt.Errorf("metallama: %w", err)
	}
	ar, err := torchsave.OpenArchive(f)
	if err != nil {
		return nil, err
	}
	v, err := ar.Decode()
	if err != nil {
		return nil, err
	}
	items, ok := torchsave.DictItems(v)
	if !ok {
		return nil, fmt.Errorf("%w: metallama: %s: data.pkl is not a state dict", ckpt.ErrInvalid, f.Path)
	}
	s := &shard{file: name, tensors: map[string]*torchsave.Tensor{}}
	for _, it := range items {
		key, ok := it.Key.(string)
		if !ok {
			return nil, fmt.Errorf("%w: metallama: %s: data.pkl: a key is not a str", ckpt.ErrInvalid, f.Path)
		}
		if _, dup := s.tensors[key]; dup {
			return nil, fmt.Errorf("%w: metallama: %s: %q twice", ckpt.ErrInvalid, f.Path, key)
		}
		t, reason, err := ar.Tensor(it.Value, fmt.Sprintf("data.pkl[%q]", key))
		if err != nil {
			return nil, err
		}
		if reason != "" {
			return nil, fmt.Errorf("%w: metallama: %s: %q: %s", ckpt.ErrInvalid, f.Path, key, reason)
		}
		s.names = append(s.names, key)
		s.tensors[key] = t
	}
	return s, nil
}

func sortedNames(s *shard) []string { return slices.Sorted(slices.Values(s.names)) }

// firstDifference names a tensor one shard has and the other lacks.
func firstDifference(a, b *shard) string {
	for _, n := range a.names {
		if b.tensors[n] == nil {
			return fmt.Sprintf("%q only in %s", n, a.file)
		}
	}
	for _, n := range b.names {
		if a.tensors[n] == nil {
			return fmt.Sprintf("%q only in %s", n, b.file)
		}
	}
	return ""
}

// Meta's model-parallel layers: what each splits across ranks.
var (
	columnParallel = regexp.MustCompile(`^(layers\.[0-9]+\.(attention\.w[qkv]|feed_forward\.w[13])|output)\.weight$`)
	rowParallel    = regexp.MustCompile(`^layers\.[0-9]+\.(attention\.wo|feed_forward\.w2)\.weight$`)
	replicated     = regexp.MustCompile(`^(layers\.[0-9]+\.(attention_norm|ffn_norm)\.weight|norm\.weight|rope\.freqs)$`)
)

// splitDim is the dimension name is split on across n ranks whose first
// holds t, -1 when it is replicated.
func splitDim(name string, t *torchsave.Tensor, n int, p params) (int, error) {
	switch {
	case n == 1 || replicated.MatchString(name):
		return -1, nil
	case columnParallel.MatchString(name):
		return 0, nil
	case rowParallel.MatchString(name):
		return 1, nil
	case name == "tok_embeddings.weight":
		// ParallelEmbedding (Llama 1/2) splits the embedding dim,
		// VocabParallelEmbedding (Llama 3) the vocabulary.
		if len(t.Shape) == 2 && t.Shape[1] == p.Dim {
			return 0, nil
		}
		if len(t.Shape) == 2 && t.Shape[1]*int64(n) == p.Dim {
			return 1, nil
		}
		return 0, fmt.Errorf("shape %v over %d ranks is neither a vocabulary- nor an embedding-split of dim %d", t.Shape, n, p.Dim)
	}
	return 0, fmt.Errorf("how Meta's model splits it over %d ranks is not known", n)
}

// merge makes the global tensor name of every rank's part.
func merge(name string, shards []*shard, p params, dir source.Tree) (*ckpt.Tensor, error) {
	first := shards[0].tensors[name]
	fail := func(format string, a ...any) error {
		return fmt.Errorf("%w: metallama: %s: %s: %s", ckpt.ErrInvalid, dir.Path("."), name, fmt.Sprintf(format, a...))
	}
	dim, err := splitDim(name, first, len(shards), p)
	if err != nil {
		return nil, fail("%v", err)
	}
	if dim >= len(first.Shape) {
		return nil, fail("split on dim %d of shape %v", dim, first.Shape)
	}
	t := &ckpt.Tensor{Name: name, DType: first.DType, Shape: slices.Clone(first.Shape)}
	if dim < 0 {
		for _, s := range shards[1:] {
			if u := s.tensors[name]; u.DType != first.DType || !slices.Equal(u.Shape, first.Shape) {
				return nil, fail("replicated, but %s %v in %s and %s %v in %s", first.DType, first.Shape, shards[0].file, u.DType, u.Shape, s.file)
			}
		}
		t.Chunks = ckpt.MakeChunks(ckpt.Chunk{Offsets: make([]int64, len(t.Shape)), Sizes: t.Shape, Source: first.Source(name, 0, first.Size)})
		return t, nil
	}
	var at int64
	for _, s := range shards {
		u := s.tensors[name]
		if u.DType != first.DType || len(u.Shape) != len(first.Shape) {
			return nil, fail("%s %v in %s and %s %v in %s", first.DType, first.Shape, shards[0].file, u.DType, u.Shape, s.file)
		}
		for d := range u.Shape {
			if d != dim && u.Shape[d] != first.Shape[d] {
				return nil, fail("shapes %v in %s and %v in %s differ outside the split dim %d", first.Shape, shards[0].file, u.Shape, s.file, dim)
			}
		}
		off := make([]int64, len(u.Shape))
		off[dim] = at
		if u.Shape[dim] > (1<<62)-at {
			return nil, fail("split dim overflows")
		}
		at += u.Shape[dim]
		t.Chunks.Append(ckpt.Chunk{Offsets: off, Sizes: u.Shape, Source: u.Source(name, 0, u.Size)})
	}
	t.Shape[dim] = at
	return t, nil
}
