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
package deepspeed

import (
	"fmt"
	"io"
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
	d, ok := v.(*pickle.Dict)
	if !ok {
		return nil, nil, fmt.Errorf("%w: %s: data.pkl holds %s, not a dict", ckpt.ErrInvalid, f.Path, pickle.TypeName(v))
	}
	return ar, d, nil
}

func get(d *pickle.Dict, key string) any {
	v, _ := d.Get(key)
	return v
}

// rank is one rank's flat fp32 partitions.
type rank struct {
	path  string
	parts []*torchsave.Tensor // per param group
	elems []int64
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
	for _, e := range ents {
		if m := optimName.FindStringSubmatch(e.Name); m != nil {
			if n, _ := strconv.Atoi(m[2]); n >= world || m[1] != prefix {
				return fmt.Errorf("%s: not a rank of partition_count %d (%s)", dir.Path(e.Name), world, p0)
			}
		}
	}
	key := "single_partition_of_fp32_groups"
	if stage == 3 {
		key = "fp32_flat_groups"
	}
	ranks := make([]*rank, world)
	for r := range ranks {
		ar, root := ar0, root0
		if r > 0 {
			if ar, root, err = open(c, dir, optimFile(prefix, r)); err != nil {
				return err
			}
		}
		if ranks[r], err = readRank(ar, root, key, stage); err != nil {
			return err
		}
		if len(ranks[r].parts) != len(ranks[0].parts) {
			return fmt.Errorf("%w: %s: %d param groups, %s has %d", ckpt.ErrInvalid, ranks[r].path, len(ranks[r].parts), p0, len(ranks[0].parts))
		}
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

func readRank(ar *torchsave.Archive, root *pickle.Dict, key string, stage int64) (*rank, error) {
	path := ar.File().Path
	osd, ok := get(root, "optimizer_state_dict").(*pickle.Dict)
	if !ok {
		return nil, fmt.Errorf("%w: %s: no optimizer_state_dict dict", ckpt.ErrInvalid, path)
	}
	if s, _ := stageOf(get(osd, "zero_stage")); s != stage {
		return nil, fmt.Errorf("%w: %s: zero_stage %s, rank 0 says %d", ckpt.ErrInvalid, path, pickle.Repr(get(osd, "zero_stage")), stage)
	}
	v := get(osd, key)
	items, ok := pickle.Seq(v)
	switch {
	case ok:
	case stage == 3 && v != nil: // older DeepSpeed: one flat tensor
		items = []any{v}
	default:
		return nil, fmt.Errorf("%w: %s: optimizer_state_dict[%q] is %s, not a list of tensors", ckpt.ErrInvalid, path, key, pickle.TypeName(v))
	}
	r := &rank{path: path}
	for i, it := range items {
		what := fmt.Sprintf("data.pkl[\"optimizer_state_dict\"][%q][%d]", key, i)
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
		r.parts = append(r.parts, t)
		r.elems = append(r.elems, t.Shape[0])
	}
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
	t      *torchsave.Tensor
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
		out = append(out, span{t: s.t, off: s.off + off, n: k})
		off, n = 0, n-k
	}
	return out, n == 0
}

func newTensor(name string, shape []int64, pieces flat) *ckpt.Tensor {
	src := &multiSource{name: name}
	for _, p := range pieces {
		s := p.t.Source(name, p.off*4, p.n*4)
		src.parts = append(src.parts, s)
		src.sizes = append(src.sizes, p.n*4)
		src.size += p.n * 4
	}
	return &ckpt.Tensor{Name: name, DType: safetensors.F32, Shape: shape,
		Chunks: ckpt.MakeChunks(ckpt.Chunk{Offsets: make([]int64, len(shape)), Sizes: shape, Source: src})}
}

func zero2(c *ckpt.Checkpoint, ranks []*rank, shapes [][]param, pad [][]int64, world int, msPath string) error {
	if len(shapes) != len(ranks[0].parts) {
		return fmt.Errorf("%w: %s: %d param groups in param_shapes, %s has %d partitions", ckpt.ErrInvalid, msPath, len(shapes), ranks[0].path, len(ranks[0].parts))
	}
	align := int64(2 * world)
	for g, ps := range shapes {
		var merged flat
		var avail int64
		for _, r := range ranks {
			merged = append(merged, span{t: r.parts[g], n: r.elems[g]})
			avail += r.elems[g]
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
		for g, t := range r.parts {
			if r.elems[g] != ranks[0].elems[g] {
				return fmt.Errorf("%w: %s: fp32_flat_groups[%d] has %d elements, rank 0's %d", ckpt.ErrInvalid, r.path, g, r.elems[g], ranks[0].elems[g])
			}
			per[i] = append(per[i], span{t: t, n: r.elems[g]})
			if i == 0 {
				avail += r.elems[g]
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
						ckpt.ErrInvalid, msPath, p.name, part, off, avail, ranks[i].path)
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

// multiSource is a tensor's bytes as consecutive byte ranges of partitions.
type multiSource struct {
	name  string
	parts []ckpt.Source
	sizes []int64
	size  int64
}

func (s *multiSource) String() string {
	names := make([]string, len(s.parts))
	for i, p := range s.parts {
		names[i] = p.String()
	}
	return strings.Join(names, ",")
}

// ReadAt reads the tensor's bytes at off from the partitions holding them.
func (s *multiSource) ReadAt(p []byte, off int64) (int, error) {
	if off < 0 || off > s.size {
		return 0, fmt.Errorf("deepspeed: offset %d outside tensor %q of %d bytes", off, s.name, s.size)
	}
	done := 0
	var base int64
	for i, part := range s.parts {
		end := base + s.sizes[i]
		if off+int64(done) < end && done < len(p) {
			at := off + int64(done) - base
			k := int(min(int64(len(p)-done), s.sizes[i]-at))
			n, err := part.ReadAt(p[done:done+k], at)
			done += n
			if err != nil && !(err == io.EOF && n == k) {
				return done, err
			}
		}
		base = end
	}
	if done < len(p) {
		return done, io.EOF
	}
	return done, nil
}
