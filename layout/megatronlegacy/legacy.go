// Package megatronlegacy reads Megatron-LM's legacy checkpoints
// (--ckpt-format torch): a directory iter_NNNNNNN/ holding one torch.save
// file per model-parallel rank, mp_rank_TT/model_optim_rng.pt, or
// mp_rank_TT_PPP/model_optim_rng.pt with pipeline parallelism, each a dict
// {'args', 'iteration', 'model' (or 'model0', 'model1', ... with virtual
// pipeline stages), 'optimizer', 'rng_state', ...} as save_checkpoint
// writes it. The directory is one checkpoint: the ranks' local tensors are
// merged into the global tensors a torch_dist save of the same model holds
// (the same names, layers stacked on a leading axis), so the megatron-gpt
// mapping applies unchanged.
//
// Every file's data.pkl is decoded by the restricted pickle VM (nothing is
// executed; sizes bounded). The structure comes from what the checkpoint
// says: the tensor- and pipeline-parallel sizes from args (every rank file
// they imply must exist, and no other), each stage's layers from the
// layer numbers its file holds, the TP split of a tensor from Megatron's
// layer types: column-parallel linear_qkv / linear_fc1 and the vocabulary
// of word_embeddings / output_layer on dim 0 (linear_fc1 with SwiGLU holds
// [gate_r; up_r] per rank, merged as [gate_0..gate_N; up_0..up_N]),
// row-parallel linear_proj / linear_fc2 on dim 1, everything else
// replicated (and then the same shape on every rank).
package megatronlegacy

import (
	"errors"
	"fmt"
	"path"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"

	"github.com/ckptfs/ckptfs/layout/ckpt"
	"github.com/ckptfs/ckptfs/layout/megatron"
	"github.com/ckptfs/ckptfs/layout/pickle"
	"github.com/ckptfs/ckptfs/layout/source"
	"github.com/ckptfs/ckptfs/layout/torchsave"
)

// RankFile is the name of each rank's file in its mp_rank_* directory.
const RankFile = "model_optim_rng.pt"

// rankDir is mp_rank_TT or mp_rank_TT_PPP (get_checkpoint_name); a third
// number (the expert-parallel rank) is recognised, to be refused by name.
var rankDir = regexp.MustCompile(`^mp_rank_(\d{2,})(?:_(\d{3,}))?(?:_(\d{3,}))?$`)

// maxRanks bounds tensor × pipeline parallel sizes read from args.
const maxRanks = 1 << 16

// Reader is the Megatron-LM legacy (torch) checkpoint format.
var Reader ckpt.Reader = reader{}

type reader struct{}

func (reader) Format() ckpt.Format { return ckpt.FormatMegatronLegacy }

// Detect reports whether dir has an mp_rank_* directory holding a
// model_optim_rng.pt.
func (reader) Detect(dir source.Tree) bool {
	ents, err := dir.ReadDir(".")
	if err != nil {
		return false
	}
	for _, e := range ents {
		if e.IsDir() && rankDir.MatchString(e.Name) && source.Exists(dir, path.Join(e.Name, RankFile)) {
			return true
		}
	}
	return false
}

func (reader) Open(dir source.Tree) (*ckpt.Checkpoint, error) { return OpenTree(dir) }

// Internal: the rank directories, which the view replaces.
func (reader) Internal(name string) bool { return IsInternal(name) }

// IsInternal reports whether name is a rank directory.
func IsInternal(name string) bool { return rankDir.MatchString(name) }

// OpenTree opens the checkpoint in dir: every rank file's zip directory and
// data.pkl, no tensor bytes.
func OpenTree(dir source.Tree) (*ckpt.Checkpoint, error) {
	c := &ckpt.Checkpoint{Dir: dir.Path("."), Format: ckpt.FormatMegatronLegacy, Files: ckpt.NewFileSet(dir)}
	if err := build(c, dir); err != nil {
		c.Close()
		return nil, fmt.Errorf("megatronlegacy: %w", err)
	}
	return c, nil
}

// rankFile is one decoded rank file.
type rankFile struct {
	rel    string // mp_rank_.../model_optim_rng.pt
	tp, pp int
	ar     *torchsave.Archive
	root   *pickle.Dict
	args   map[string]any
}

func build(c *ckpt.Checkpoint, dir source.Tree) error {
	ents, err := dir.ReadDir(".")
	if err != nil {
		return err
	}
	var names []string
	withPP := false
	for _, e := range ents {
		m := rankDir.FindStringSubmatch(e.Name)
		if m == nil || !e.IsDir() {
			continue
		}
		if m[3] != "" {
			return fmt.Errorf("%s: expert-parallel rank directories are not supported", dir.Path(e.Name))
		}
		if len(names) > 0 && withPP != (m[2] != "") {
			return fmt.Errorf("%s: rank directories both with and without a pipeline rank (%s, %s)", c.Dir, names[0], e.Name)
		}
		withPP = m[2] != ""
		names = append(names, e.Name)
	}
	if len(names) == 0 {
		return fmt.Errorf("%s: no mp_rank_* directory", c.Dir)
	}
	first := names[0] // sorted: mp_rank_00 or mp_rank_00_000 if present
	if first != rankName(0, 0, withPP) {
		return fmt.Errorf("%s: missing (rank files present: %s)", dir.Path(path.Join(rankName(0, 0, withPP), RankFile)), strings.Join(names, ", "))
	}
	r0, err := openRank(c, dir, 0, 0, withPP)
	if err != nil {
		return err
	}
	if r0.args == nil {
		return fmt.Errorf("%s: no args (the parallel sizes come from them)", dir.Path(r0.rel))
	}
	c.Record = megatron.Args(r0.args)
	tp, err1 := argInt(r0.args, "tensor_model_parallel_size", 1)
	pp, err2 := argInt(r0.args, "pipeline_model_parallel_size", 1)
	layers, err3 := argInt(r0.args, "num_layers", -1)
	if err := errors.Join(err1, err2, err3); err != nil {
		return fmt.Errorf("%s: args: %w", dir.Path(r0.rel), err)
	}
	if tp < 1 || pp < 1 || tp > maxRanks/pp {
		return fmt.Errorf("%s: args: tensor_model_parallel_size %d × pipeline_model_parallel_size %d is not a valid rank count", dir.Path(r0.rel), tp, pp)
	}
	if withPP != (pp > 1) {
		return fmt.Errorf("%s: pipeline_model_parallel_size %d but rank directories named like %s", c.Dir, pp, first)
	}
	want := map[string]bool{}
	for p := 0; p < pp; p++ {
		for t := 0; t < tp; t++ {
			want[rankName(t, p, withPP)] = true
		}
	}
	for _, n := range names {
		if !want[n] {
			return fmt.Errorf("%s: not a rank of tensor_model_parallel_size %d × pipeline_model_parallel_size %d (args of %s)",
				dir.Path(n), tp, pp, r0.rel)
		}
	}
	ranks := make([][]*rankFile, pp) // [pp][tp]
	for p := range ranks {
		ranks[p] = make([]*rankFile, tp)
		for t := range ranks[p] {
			if p == 0 && t == 0 {
				ranks[p][t] = r0
				continue
			}
			if ranks[p][t], err = openRank(c, dir, t, p, withPP); err != nil {
				return err
			}
		}
	}
	m := merger{c: c, tp: tp, swiglu: argBool(r0.args, "swiglu"), tensors: map[string]*global{}}
	if err := m.collect(ranks); err != nil {
		return err
	}
	if layers >= 0 && m.layers != layers {
		return fmt.Errorf("%s: the rank files hold %d layers, args num_layers is %d", c.Dir, m.layers, layers)
	}
	return m.finish()
}

func rankName(tp, pp int, withPP bool) string {
	if withPP {
		return fmt.Sprintf("mp_rank_%02d_%03d", tp, pp)
	}
	return fmt.Sprintf("mp_rank_%02d", tp)
}

// openRank opens and decodes one rank's file; a missing one is an error
// naming it.
func openRank(c *ckpt.Checkpoint, dir source.Tree, tp, pp int, withPP bool) (*rankFile, error) {
	rel := path.Join(rankName(tp, pp, withPP), RankFile)
	if !source.Exists(dir, rel) {
		return nil, fmt.Errorf("%s: missing (rank tp %d, pp %d of the checkpoint)", dir.Path(rel), tp, pp)
	}
	f, err := c.Files.Get(rel)
	if err != nil {
		return nil, err
	}
	ar, err := torchsave.OpenArchive(f)
	if err != nil {
		return nil, err
	}
	v, err := ar.Decode()
	if err != nil {
		return nil, err
	}
	root, ok := v.(*pickle.Dict)
	if !ok {
		return nil, fmt.Errorf("%w: %s: data.pkl holds %s, not a dict", ckpt.ErrInvalid, f.Path, pickle.TypeName(v))
	}
	r := &rankFile{rel: rel, tp: tp, pp: pp, ar: ar, root: root}
	if a, ok := root.Get("args"); ok && a != nil {
		if r.args, err = megatron.NamespaceArgs(a); err != nil {
			return nil, fmt.Errorf("%w: %s: %w", ckpt.ErrInvalid, f.Path, err)
		}
	}
	return r, nil
}

func argInt(args map[string]any, name string, def int64) (int, error) {
	v, ok := args[name]
	if !ok || v == nil {
		if def == -1 {
			return -1, nil
		}
		return int(def), nil
	}
	n, ok := v.(int64)
	if !ok || n < 0 || n > maxRanks*1024 {
		return 0, fmt.Errorf("%s is %v, not a count", name, v)
	}
	return int(n), nil
}

func argBool(args map[string]any, name string) bool {
	b, _ := args[name].(bool)
	return b
}

// layerKey is a local layer's key: decoder.layers.<i>.<rest>.
var layerKey = regexp.MustCompile(`^(decoder\.layers\.)(\d{1,6})\.(.+)$`)

// piece is one rank's local tensor of a global one (one layer of it).
type piece struct {
	t     *torchsave.Tensor
	rank  *rankFile
	what  string
	layer int // global layer; -1 for a tensor outside the layers
}

// global is a global tensor being assembled.
type global struct {
	name    string
	stacked bool
	pieces  map[[2]int]*piece // (layer or 0, tp rank) → piece
	order   int
}

type merger struct {
	c       *ckpt.Checkpoint
	tp      int
	swiglu  bool
	tensors map[string]*global
	skipped map[string]bool
	layers  int
}

// collect reads every rank's model dicts: stage p's layers follow those of
// the stages before it (with virtual stages, chunk v of every stage
// follows chunk v-1 of the last stage), numbered by what each file holds.
func (m *merger) collect(ranks [][]*rankFile) error {
	m.skipped = map[string]bool{}
	chunks, err := modelKeys(ranks[0][0])
	if err != nil {
		return err
	}
	offset := 0
	for _, key := range chunks {
		for p := range ranks {
			n := -1
			for t, r := range ranks[p] {
				got, err := m.addModel(r, key, offset)
				if err != nil {
					return err
				}
				if t > 0 && got != n {
					return fmt.Errorf("%w: %s[%q] holds %d layers, %s[%q] holds %d", ckpt.ErrInvalid,
						r.ar.File().Path, key, got, ranks[p][0].ar.File().Path, key, n)
				}
				n = got
			}
			offset += n
		}
	}
	m.layers = offset
	return nil
}

// modelKeys returns the model dicts a rank file holds: "model", or
// "model0", "model1", ... (virtual pipeline stages).
func modelKeys(r *rankFile) ([]string, error) {
	if _, ok := r.root.Get("model"); ok {
		return []string{"model"}, nil
	}
	var keys []string
	for i := 0; ; i++ {
		k := "model" + strconv.Itoa(i)
		if _, ok := r.root.Get(k); !ok {
			break
		}
		keys = append(keys, k)
	}
	if len(keys) == 0 {
		return nil, fmt.Errorf("%w: %s: no 'model' (or 'model0') in the checkpoint dict", ckpt.ErrInvalid, r.ar.File().Path)
	}
	return keys, nil
}

// addModel adds the tensors of r's model dict key, its layers numbered from
// offset, and returns how many layers it holds (local layers must be
// numbered 0..n-1).
func (m *merger) addModel(r *rankFile, key string, offset int) (int, error) {
	path := r.ar.File().Path
	v, ok := r.root.Get(key)
	if !ok {
		return 0, fmt.Errorf("%w: %s: no %q in the checkpoint dict (rank tp %d, pp %d)", ckpt.ErrInvalid, path, key, r.tp, r.pp)
	}
	items, ok := torchsave.DictItems(v)
	if !ok {
		return 0, fmt.Errorf("%w: %s: %q is %s, not a state dict", ckpt.ErrInvalid, path, key, pickle.TypeName(v))
	}
	seen := map[int]bool{}
	for _, it := range items {
		name, ok := it.Key.(string)
		if !ok {
			return 0, fmt.Errorf("%w: %s: %q has key %s, not a str", ckpt.ErrInvalid, path, key, pickle.Repr(it.Key))
		}
		what := fmt.Sprintf("data.pkl[%q][%q]", key, name)
		gname, layer := name, -1
		if sub := layerKey.FindStringSubmatch(name); sub != nil {
			i, _ := strconv.Atoi(sub[2])
			seen[i] = true
			gname, layer = sub[1]+sub[3], offset+i
		}
		if strings.HasSuffix(name, "._extra_state") || name == "_extra_state" {
			m.skip(gname, "Transformer Engine _extra_state (FP8 metadata), not a weight")
			continue
		}
		if it.Value == nil {
			m.skip(gname, "saved as None")
			continue
		}
		t, reason, err := r.ar.Tensor(it.Value, what)
		if err != nil {
			return 0, err
		}
		if reason != "" {
			m.skip(gname, reason)
			continue
		}
		g := m.tensors[gname]
		if g == nil {
			g = &global{name: gname, stacked: layer >= 0, pieces: map[[2]int]*piece{}, order: len(m.tensors)}
			m.tensors[gname] = g
		}
		at := [2]int{max(layer, 0), r.tp}
		if prev := g.pieces[at]; prev != nil {
			if layer >= 0 || prev.rank.pp == r.pp {
				return 0, fmt.Errorf("%w: %s: %s is also in %s", ckpt.ErrInvalid, path, what, prev.rank.ar.File().Path)
			}
			// Outside the layers, a later stage's copy (embeddings an output
			// layer shares) is not a second tensor: the first stage's stays.
			m.c.Warnings = append(m.c.Warnings, fmt.Sprintf("%s: %s left out: the same name is in %s", path, what, prev.rank.ar.File().Path))
			continue
		}
		g.pieces[at] = &piece{t: t, rank: r, what: what, layer: layer}
	}
	for i := range len(seen) {
		if !seen[i] {
			return 0, fmt.Errorf("%w: %s: %q holds layers up to %d but not layer %d", ckpt.ErrInvalid, path, key, len(seen), i)
		}
	}
	return len(seen), nil
}

func (m *merger) skip(name, reason string) {
	if !m.skipped[name] {
		m.skipped[name] = true
		m.c.Skipped = append(m.c.Skipped, ckpt.Skipped{Name: name, Reason: reason})
	}
}

// splitDim is the dimension Megatron's layer type splits name on across
// TP ranks, -1 when the tensor is replicated.
func splitDim(name string) int {
	switch {
	case strings.HasSuffix(name, "linear_qkv.weight"), strings.HasSuffix(name, "linear_qkv.bias"),
		strings.HasSuffix(name, "linear_fc1.weight"), strings.HasSuffix(name, "linear_fc1.bias"),
		name == "embedding.word_embeddings.weight", name == "output_layer.weight":
		return 0
	case strings.HasSuffix(name, "linear_proj.weight"), strings.HasSuffix(name, "linear_fc2.weight"):
		return 1
	}
	return -1
}

// finish builds the global tensors in the order of their first appearance.
func (m *merger) finish() error {
	gs := make([]*global, 0, len(m.tensors))
	for _, g := range m.tensors {
		gs = append(gs, g)
	}
	sort.Slice(gs, func(i, j int) bool { return gs[i].order < gs[j].order })
	for _, g := range gs {
		t, err := m.assemble(g)
		if err != nil {
			return err
		}
		if err := t.Validate(); err != nil {
			return fmt.Errorf("%s: %w", m.c.Dir, err)
		}
		m.c.Tensors = append(m.c.Tensors, t)
	}
	return nil
}

// assemble makes one global tensor of its pieces: every layer (for a
// stacked tensor) of every TP rank (for a split one) present, shapes
// agreeing.
func (m *merger) assemble(g *global) (*ckpt.Tensor, error) {
	nl := 1
	if g.stacked {
		nl = m.layers
	}
	dim := splitDim(g.name)
	gate := m.swiglu && dim == 0 && strings.Contains(g.name, "linear_fc1.")
	ref := g.pieces[[2]int{0, 0}]
	if ref == nil {
		return nil, fmt.Errorf("%w: %s: tensor %q: no piece for layer 0 of TP rank 0 (the file of that rank and stage does not hold it)",
			ckpt.ErrInvalid, m.c.Dir, g.name)
	}
	local := ref.t.Shape
	if dim >= len(local) {
		return nil, fmt.Errorf("%w: %s: %s has shape %v, no dim %d to split over TP ranks", ckpt.ErrInvalid, ref.rank.ar.File().Path, ref.what, local, dim)
	}
	shape := append([]int64(nil), local...)
	if dim >= 0 {
		shape[dim] *= int64(m.tp)
	}
	if g.stacked {
		shape = append([]int64{int64(nl)}, shape...)
	}
	t := &ckpt.Tensor{Name: g.name, DType: ref.t.DType, Shape: shape}
	tps := m.tp
	if dim < 0 {
		tps = 1 // replicated: rank 0's, the others checked to agree
	}
	rowBytes := int64(ref.t.DType.Size())
	for i, d := range local {
		if i > 0 {
			rowBytes *= d
		}
	}
	for l := 0; l < nl; l++ {
		for r := 0; r < m.tp; r++ {
			p := g.pieces[[2]int{l, r}]
			if p == nil {
				return nil, fmt.Errorf("%w: %s: tensor %q: no piece for layer %d of TP rank %d (the file of that rank and stage does not hold it)",
					ckpt.ErrInvalid, m.c.Dir, g.name, l, r)
			}
			if p.t.DType != ref.t.DType || !slices.Equal(p.t.Shape, local) {
				return nil, fmt.Errorf("%w: %s: %s is %s %v, but %s is %s %v (shapes that do not add up)", ckpt.ErrInvalid,
					p.rank.ar.File().Path, p.what, p.t.DType, p.t.Shape, ref.rank.ar.File().Path+": "+ref.what, ref.t.DType, local)
			}
			if r >= tps {
				continue
			}
			m.addChunks(t, p, g.stacked, l, r, dim, gate, rowBytes)
			if gate && local[0]%2 != 0 {
				return nil, fmt.Errorf("%w: %s: %s has %d rows, not [gate; up] halves (args swiglu)", ckpt.ErrInvalid,
					p.rank.ar.File().Path, p.what, local[0])
			}
		}
	}
	return t, nil
}

// addChunks adds the chunks of piece p (layer l, TP rank r) to t.
func (m *merger) addChunks(t *ckpt.Tensor, p *piece, stacked bool, l, r, dim int, gate bool, rowBytes int64) {
	local := p.t.Shape
	box := func(offs, sizes []int64) ([]int64, []int64) {
		if stacked {
			return append([]int64{int64(l)}, offs...), append([]int64{1}, sizes...)
		}
		return offs, sizes
	}
	if gate {
		// [gate_r; up_r] → rows r·h of the gate half, tp·h + r·h of the up half
		h := local[0] / 2
		for half := int64(0); half < 2; half++ {
			offs := make([]int64, len(local))
			offs[0] = half*int64(m.tp)*h + int64(r)*h
			sizes := append([]int64{h}, local[1:]...)
			o, s := box(offs, sizes)
			t.Chunks.Append(ckpt.Chunk{Offsets: o, Sizes: s,
				Source: p.t.Source(t.Name, half*h*rowBytes, h*rowBytes)})
		}
		return
	}
	offs := make([]int64, len(local))
	if dim >= 0 {
		offs[dim] = int64(r) * local[dim]
	}
	o, s := box(offs, append([]int64(nil), local...))
	t.Chunks.Append(ckpt.Chunk{Offsets: o, Sizes: s, Source: p.t.Source(t.Name, 0, p.t.Size)})
}
