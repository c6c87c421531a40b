// Package deepspeed reads DeepSpeed ZeRO stage 1/2/3 checkpoints
// (global_stepN/: zero_pp_rank_R_mp_rank_00_optim_states.pt per data-parallel
// rank, and mp_rank_00_model_states.pt, or zero_pp_rank_0_mp_rank_00_model_states.pt
// for stage 3) as the fp32 state dict DeepSpeed's zero_to_fp32.py makes of
// them, without reading any tensor bytes at open: each parameter is byte
// ranges of the ranks' flat fp32 partitions.
//
// The algorithm is zero_to_fp32.py's (deepspeed 0.19.8):
//   - ZeRO-1/2: per param group, the ranks' single_partition_of_fp32_groups[g]
//     concatenated in rank order hold the group's params in param_shapes[g]
//     order (plus param_alignment_paddings where saved); what is left must be
//     the alignment padding to 2 × world size.
//   - ZeRO-3: each rank's fp32_flat_groups, concatenated, hold for every
//     param (param_shapes merged in order) ceil(numel / world) elements;
//     a param is its slices of every rank, concatenated, cut to numel. The
//     slices must use up the partitions exactly.
//
// Every pickle is decoded by the restricted VM; the world size comes from
// partition_count and every rank file it implies must exist.
//
// Opening reads two files whatever the world size: the model states
// (param_shapes) and rank 0's optimizer states; the other ranks' files are
// only stat'ed. Where every param lies
// follows from them: ZeRO-3 from the shapes and the world size, ZeRO-1/2
// from the shapes and rank 0's partition sizes, which DeepSpeed makes equal
// on every rank (a flat group is padded to a multiple of the world size and
// split evenly). Another rank's file is opened, and its header checked
// against that placement, on the first read of bytes that lie there
// (rank.go): a rank that disagrees is an error naming its file, never bytes
// from the wrong place. A parameter's bytes are boxes of the tensor, each
// one byte range of one rank's partition (flat.go), which the view's read
// plan merges with their neighbours in the file.
package deepspeed

import (
	"fmt"
	"regexp"
	"strconv"
	"strings"

	"github.com/ckptfs/ckptfs/layout/ckpt"
	"github.com/ckptfs/ckptfs/layout/internal/torchzip"
	"github.com/ckptfs/ckptfs/layout/pickle"
	"github.com/ckptfs/ckptfs/layout/source"
	"github.com/ckptfs/ckptfs/layout/torchsave"
	"github.com/ckptfs/ckptfs/safetensors"
)

// Model state files: stages 1/2 and stage 3.
const (
	ModelStates  = "mp_rank_00_model_states.pt"
	ModelStates3 = "zero_pp_rank_0_mp_rank_00_model_states.pt"
)

var (
	optimName    = regexp.MustCompile(`^(bf16_)?zero_pp_rank_(\d{1,6})_mp_rank_00_optim_states\.pt$`)
	internalName = regexp.MustCompile(`_(model|optim)_states\.pt$`)
)

// maxWorld bounds the partition count.
const maxWorld = 1 << 16

// Reader is the DeepSpeed ZeRO format.
var Reader ckpt.Reader = reader{}

type reader struct{}

func (reader) Format() ckpt.Format { return ckpt.FormatDeepSpeed }

// Detect reports whether dir has a ZeRO model states file and rank 0's
// optimizer states.
func (reader) Detect(dir source.Tree) bool {
	return (source.Exists(dir, ModelStates) || source.Exists(dir, ModelStates3)) &&
		(source.Exists(dir, optimFile("", 0)) || source.Exists(dir, optimFile("bf16_", 0)))
}

func (reader) Open(dir source.Tree) (*ckpt.Checkpoint, error) { return OpenTree(dir) }

// Internal: the model and optimizer states files.
func (reader) Internal(name string) bool { return internalName.MatchString(name) }

func optimFile(prefix string, rank int) string {
	return fmt.Sprintf("%szero_pp_rank_%d_mp_rank_00_optim_states.pt", prefix, rank)
}

// OpenTree opens the checkpoint in dir: pickles only.
func OpenTree(dir source.Tree) (*ckpt.Checkpoint, error) {
	c := &ckpt.Checkpoint{Dir: dir.Path("."), Format: ckpt.FormatDeepSpeed, Files: ckpt.NewFileSet(dir)}
	if err := build(c, dir); err != nil {
		c.Close()
		return nil, fmt.Errorf("deepspeed: %w", err)
	}
	return c, nil
}

// open decodes one torch.save file of the checkpoint to its root dict.
func open(c *ckpt.Checkpoint, dir source.Tree, rel string) (*torchsave.Archive, *pickle.Dict, error) {
	if !source.Exists(dir, rel) {
		return nil, nil, fmt.Errorf("%s: missing", dir.Path(rel))
	}
	f, err := c.Files.Get(rel)
	if err != nil {
		return nil, nil, err
	}
	ar, err := torchsave.OpenArchive(f)
	if err != nil {
		return nil, nil, err
	}
	v, err := ar.Decode()
	if err != nil {
		return nil, nil, err
	}
	d, err := rootDict(ar, v)
	return ar, d, err
}

// rootDict is a decoded data.pkl's root, a dict.
func rootDict(ar *torchsave.Archive, v any) (*pickle.Dict, error) {
	d, ok := v.(*pickle.Dict)
	if !ok {
		return nil, fmt.Errorf("%w: %s: data.pkl holds %s, not a dict", ckpt.ErrInvalid, ar.File().Path, pickle.TypeName(v))
	}
	return d, nil
}

func get(d *pickle.Dict, key string) any {
	v, _ := d.Get(key)
	return v
}

func build(c *ckpt.Checkpoint, dir source.Tree) error {
	prefix := ""
	if !source.Exists(dir, optimFile("", 0)) && source.Exists(dir, optimFile("bf16_", 0)) {
		prefix = "bf16_"
	}
	ar0, root0, err := open(c, dir, optimFile(prefix, 0))
	if err != nil {
		return err
	}
	p0 := ar0.File().Path
	osd, ok := get(root0, "optimizer_state_dict").(*pickle.Dict)
	if !ok {
		return fmt.Errorf("%w: %s: no optimizer_state_dict dict (not a ZeRO optimizer states file)", ckpt.ErrInvalid, p0)
	}
	stage, ok := stageOf(get(osd, "zero_stage"))
	if !ok || stage < 1 || stage > 3 {
		return fmt.Errorf("%w: %s: zero_stage is %s, not 1, 2 or 3", ckpt.ErrInvalid, p0, pickle.Repr(get(osd, "zero_stage")))
	}
	world, err := partitionCount(get(osd, "partition_count"))
	if err != nil {
		return fmt.Errorf("%w: %s: %w", ckpt.ErrInvalid, p0, err)
	}
	ents, err := dir.ReadDir(".")
	if err != nil {
		return err
	}
	present := map[int]bool{}
	for _, e := range ents {
		if m := optimName.FindStringSubmatch(e.Name); m != nil {
			n, _ := strconv.Atoi(m[2])
			if n >= world || m[1] != prefix {
				return fmt.Errorf("%s: not a rank of partition_count %d (%s)", dir.Path(e.Name), world, p0)
			}
			present[n] = true
		}
	}
	for r := range world {
		if !present[r] {
			return fmt.Errorf("%s: missing", dir.Path(optimFile(prefix, r)))
		}
	}
	want := expect{stage: stage, world: world, key: "single_partition_of_fp32_groups"}
	if stage == 3 {
		want.key = "fp32_flat_groups"
	}
	r0, err := readRank(ar0, root0, want)
	if err != nil {
		return err
	}
	want.elems = r0.elems
	ranks := make([]*rank, world)
	ranks[0] = r0
	for r := 1; r < world; r++ {
		// A stat, not a read: the file a view's bytes come from is known
		// at open (its owner and mode bound the view's, its freshness is
		// checked from then on); its header is read on first use.
		f, err := c.Files.Get(optimFile(prefix, r))
		if err != nil {
			return err
		}
		ranks[r] = &rank{file: f, path: f.Path, want: &want, rank0: p0}
	}
	msName := ModelStates
	if stage == 3 {
		msName = ModelStates3
	}
	msAr, ms, err := open(c, dir, msName)
	if err != nil {
		return err
	}
	shapes, err := paramShapes(msAr.File().Path, get(ms, "param_shapes"))
	if err != nil {
		return err
	}
	var pad [][]int64
	if v := get(osd, "param_alignment_paddings"); v != nil && stage < 3 {
		if pad, err = paddings(p0, v, shapes); err != nil {
			return err
		}
	}
	if stage < 3 {
		err = zero2(c, ranks, shapes, pad, world, msAr.File().Path)
	} else {
		err = zero3(c, ranks, shapes, world, msAr.File().Path)
	}
	if err != nil {
		return err
	}
	extras(c, ms)
	for _, t := range c.Tensors {
		if err := t.Validate(); err != nil {
			return fmt.Errorf("%s: %w", c.Dir, err)
		}
	}
	return nil
}

// stageOf reads zero_stage: an int, or DeepSpeed's ZeroStageEnum (an
// int enum pickled as a call of the class with the value).
func stageOf(v any) (int64, bool) {
	if o, ok := v.(*pickle.Object); ok && o.Class.Name == "ZeroStageEnum" &&
		strings.HasPrefix(o.Class.Module, "deepspeed.") && len(o.Args) == 1 {
		v = o.Args[0]
	}
	return pickle.Int(v)
}

func partitionCount(v any) (int, error) {
	n, ok := pickle.Int(v)
	if l, isList := v.(*pickle.List); isList {
		ok = len(l.Items) > 0
		for _, it := range l.Items {
			m, ok1 := pickle.Int(it)
			ok = ok && ok1
			n = max(n, m)
		}
	}
	if !ok || n < 1 || n > maxWorld {
		return 0, fmt.Errorf("partition_count %s is not a world size", pickle.Repr(v))
	}
	return int(n), nil
}

// readRank reads a rank's flat fp32 partitions from its decoded file and
// checks them against what the placement expects of every rank.
func readRank(ar *torchsave.Archive, root *pickle.Dict, want expect) (*rank, error) {
	path := ar.File().Path
	osd, ok := get(root, "optimizer_state_dict").(*pickle.Dict)
	if !ok {
		return nil, fmt.Errorf("%w: %s: no optimizer_state_dict dict", ckpt.ErrInvalid, path)
	}
	if s, _ := stageOf(get(osd, "zero_stage")); s != want.stage {
		return nil, fmt.Errorf("%w: %s: zero_stage %s, rank 0 says %d", ckpt.ErrInvalid, path, pickle.Repr(get(osd, "zero_stage")), want.stage)
	}
	if w, err := partitionCount(get(osd, "partition_count")); err != nil || w != want.world {
		return nil, fmt.Errorf("%w: %s: partition_count %s, rank 0 says %d", ckpt.ErrInvalid, path, pickle.Repr(get(osd, "partition_count")), want.world)
	}
	v := get(osd, want.key)
	items, ok := pickle.Seq(v)
	switch {
	case ok:
	case want.stage == 3 && v != nil: // older DeepSpeed: one flat tensor
		items = []any{v}
	default:
		return nil, fmt.Errorf("%w: %s: optimizer_state_dict[%q] is %s, not a list of tensors", ckpt.ErrInvalid, path, want.key, pickle.TypeName(v))
	}
	if want.elems != nil && len(items) != len(want.elems) {
		return nil, fmt.Errorf("%w: %s: %d param groups, rank 0 has %d", ckpt.ErrInvalid, path, len(items), len(want.elems))
	}
	r := &rank{path: path, file: ar.File()}
	var parts []*torchsave.Tensor
	for i, it := range items {
		what := fmt.Sprintf("data.pkl[\"optimizer_state_dict\"][%q][%d]", want.key, i)
		t, reason, err := ar.Tensor(it, what)
		if err != nil {
			return nil, err
		}
		if reason != "" {
			return nil, fmt.Errorf("%w: %s: %s: %s", ckpt.ErrInvalid, path, what, reason)
		}
		if t.DType != safetensors.F32 || len(t.Shape) != 1 {
			return nil, fmt.Errorf("%w: %s: %s is %s %v, not a flat fp32 partition", ckpt.ErrInvalid, path, what, t.DType, t.Shape)
		}
		if want.elems != nil && t.Shape[0] != want.elems[i] {
			return nil, fmt.Errorf("%w: %s: %s has %d elements, rank 0's %d (every rank's partition is the same size)", ckpt.ErrInvalid, path, what, t.Shape[0], want.elems[i])
		}
		parts = append(parts, t)
		r.elems = append(r.elems, t.Shape[0])
	}
	r.setOpened(parts)
	return r, nil
}

// param is one trainable parameter of param_shapes.
type param struct {
	name  string
	shape []int64
	numel int64
}

// paramShapes reads param_shapes: a list (one per param group) of dicts
// name → torch.Size.
func paramShapes(path string, v any) ([][]param, error) {
	var groups []any
	switch x := v.(type) {
	case *pickle.List:
		groups = x.Items
	default:
		if _, ok := torchsave.DictItems(v); ok { // one group
			groups = []any{v}
		} else {
			return nil, fmt.Errorf("%w: %s: param_shapes is %s, not a list of dicts", ckpt.ErrInvalid, path, pickle.TypeName(v))
		}
	}
	out := make([][]param, len(groups))
	for g, gv := range groups {
		items, ok := torchsave.DictItems(gv)
		if !ok {
			return nil, fmt.Errorf("%w: %s: param_shapes[%d] is %s, not a dict", ckpt.ErrInvalid, path, g, pickle.TypeName(gv))
		}
		for _, it := range items {
			name, ok := it.Key.(string)
			shape, err := sizeOf(it.Value)
			if !ok || err != nil {
				return nil, fmt.Errorf("%w: %s: param_shapes[%d]: %s → %s is not a name and a shape", ckpt.ErrInvalid, path, g, pickle.Repr(it.Key), pickle.Repr(it.Value))
			}
			n, err := ckpt.NumElements(shape)
			if err != nil {
				return nil, fmt.Errorf("%s: param_shapes[%d][%q]: %w", path, g, name, err)
			}
			out[g] = append(out[g], param{name: name, shape: shape, numel: n})
		}
	}
	return out, nil
}

func sizeOf(v any) ([]int64, error) {
	out, err := torchzip.Ints(v)
	if err != nil || len(out) > 64 {
		return nil, fmt.Errorf("not a shape")
	}
	for _, n := range out {
		if n < 0 {
			return nil, fmt.Errorf("not a shape")
		}
	}
	return out, nil
}

func paddings(path string, v any, shapes [][]param) ([][]int64, error) {
	l, ok := v.(*pickle.List)
	if !ok || len(l.Items) != len(shapes) {
		return nil, fmt.Errorf("%w: %s: param_alignment_paddings %s does not match %d param groups", ckpt.ErrInvalid, path, pickle.TypeName(v), len(shapes))
	}
	out := make([][]int64, len(shapes))
	for g, it := range l.Items {
		gl, ok := it.(*pickle.List)
		if !ok || len(gl.Items) != len(shapes[g]) {
			return nil, fmt.Errorf("%w: %s: param_alignment_paddings[%d] does not have one padding per param (%d)", ckpt.ErrInvalid, path, g, len(shapes[g]))
		}
		for _, p := range gl.Items {
			n, ok := pickle.Int(p)
			if !ok || n < 0 || n > 1<<40 {
				return nil, fmt.Errorf("%w: %s: param_alignment_paddings[%d] holds %s", ckpt.ErrInvalid, path, g, pickle.Repr(p))
			}
			out[g] = append(out[g], n)
		}
	}
	return out, nil
}

// span is elements [off, off+n) of a rank's partition of one group.
type span struct {
	r      *rank
	g      int
	off, n int64
}

// flat is a virtual vector: spans back to back.
type flat []span

// slice returns elements [off, off+n) of f, past its end an error.
func (f flat) slice(off, n int64) (flat, bool) {
	var out flat
	for _, s := range f {
		if n == 0 {
			break
		}
		if off >= s.n {
			off -= s.n
			continue
		}
		k := min(s.n-off, n)
		out = append(out, span{r: s.r, g: s.g, off: s.off + off, n: k})
		off, n = 0, n-k
	}
	return out, n == 0
}

// newTensor is the fp32 tensor whose C-order elements are pieces, back to
// back: a chunk per box of each piece's elements (flatBoxes).
func newTensor(name string, shape []int64, pieces flat) *ckpt.Tensor {
	t := &ckpt.Tensor{Name: name, DType: safetensors.F32, Shape: shape}
	if n, _ := ckpt.NumElements(shape); n == 0 {
		t.Chunks = ckpt.MakeChunks(ckpt.Chunk{Offsets: make([]int64, len(shape)), Sizes: shape, Source: emptySource{}})
		return t
	}
	var at int64
	for _, p := range pieces {
		flatBoxes(shape, at, at+p.n, func(off, size []int64, start, n int64) {
			src := &rankSource{r: p.r, g: p.g, off: (p.off + start - at) * 4, n: n * 4, name: name}
			t.Chunks.Add(off, size, src)
		})
		at += p.n
	}
	return t
}

func zero2(c *ckpt.Checkpoint, ranks []*rank, shapes [][]param, pad [][]int64, world int, msPath string) error {
	elems := ranks[0].elems
	if len(shapes) != len(elems) {
		return fmt.Errorf("%w: %s: %d param groups in param_shapes, %s has %d partitions", ckpt.ErrInvalid, msPath, len(shapes), ranks[0].path, len(elems))
	}
	align := int64(2 * world)
	for g, ps := range shapes {
		var merged flat
		var avail int64
		for _, r := range ranks {
			merged = append(merged, span{r: r, g: g, n: elems[g]})
			avail += elems[g]
		}
		var off int64
		for i, p := range ps {
			pieces, ok := merged.slice(off, p.numel)
			if !ok {
				return fmt.Errorf("%w: %s: param %q (%d elements at %d) runs past the %d elements of param group %d's partitions (%s...)",
					ckpt.ErrInvalid, msPath, p.name, p.numel, off, avail, g, ranks[0].path)
			}
			c.Tensors = append(c.Tensors, newTensor(p.name, p.shape, pieces))
			off += p.numel
			if pad != nil {
				off += pad[g][i]
			}
		}
		if a, b := (off+align-1)/align*align, (avail+align-1)/align*align; a != b {
			return fmt.Errorf("%w: %s: param group %d's params take %d elements, its partitions hold %d (%s...): shapes that do not add up",
				ckpt.ErrInvalid, msPath, g, off, avail, ranks[0].path)
		}
	}
	return nil
}

func zero3(c *ckpt.Checkpoint, ranks []*rank, shapes [][]param, world int, msPath string) error {
	per := make([]flat, len(ranks))
	var avail int64
	for i, r := range ranks {
		for g, n := range ranks[0].elems {
			per[i] = append(per[i], span{r: r, g: g, n: n})
			if i == 0 {
				avail += n
			}
		}
	}
	var off int64
	for _, ps := range shapes {
		for _, p := range ps {
			part := (p.numel + int64(world) - 1) / int64(world)
			var pieces flat
			left := p.numel
			for i := range ranks {
				s, ok := per[i].slice(off, part)
				if !ok {
					return fmt.Errorf("%w: %s: param %q (%d elements per rank at %d) runs past the %d elements of %s's fp32_flat_groups",
						ckpt.ErrInvalid, msPath, p.name, part, off, avail, ranks[0].path)
				}
				k := min(part, left)
				s, _ = s.slice(0, k)
				pieces = append(pieces, s...)
				left -= k
			}
			c.Tensors = append(c.Tensors, newTensor(p.name, p.shape, pieces))
			off += part
		}
	}
	if off != avail {
		return fmt.Errorf("%w: %s: the params take %d elements of each rank's partition, which holds %d (%s): shapes that do not add up",
			ckpt.ErrInvalid, msPath, off, avail, ranks[0].path)
	}
	return nil
}

// extras records what zero_to_fp32 would add that this view leaves out:
// buffers, frozen params, shared (tied) params.
func extras(c *ckpt.Checkpoint, ms *pickle.Dict) {
	if l, ok := get(ms, "buffer_names").(*pickle.List); ok {
		for _, it := range l.Items {
			if n, ok := it.(string); ok {
				c.Skipped = append(c.Skipped, ckpt.Skipped{Name: n, Reason: "a buffer (zero_to_fp32 converts it to fp32; not shown yet)"})
			}
		}
	}
	if items, ok := torchsave.DictItems(get(ms, "frozen_param_shapes")); ok {
		for _, it := range items {
			if n, ok := it.Key.(string); ok {
				c.Skipped = append(c.Skipped, ckpt.Skipped{Name: n, Reason: "a frozen parameter (frozen_param_fragments are not read yet)"})
			}
		}
	}
	if items, ok := torchsave.DictItems(get(ms, "shared_params")); ok {
		for _, it := range items {
			n, ok1 := it.Key.(string)
			to, ok2 := it.Value.(string)
			if ok1 && ok2 {
				c.Skipped = append(c.Skipped, ckpt.Skipped{Name: n, Reason: "shares the bytes of " + to + " (tied weights)"})
			}
		}
	}
}
