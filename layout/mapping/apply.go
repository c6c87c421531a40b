package mapping

import (
	"fmt"
	"regexp"
	"sort"
	"strconv"
	"strings"

	"github.com/ckptfs/ckptfs/layout/ckpt"
	"github.com/ckptfs/ckptfs/layout/internal/checked"
)

// MaxLayers bounds the layers of a stacked source: each is a view tensor,
// and the count comes from the checkpoint. Real models have a few hundred.
const MaxLayers = 1 << 14

// MaxTensors bounds the tensors one mapping makes (DeepSeek-V3, 256 experts
// over 61 layers, makes about 48k), so that many rules over many layers
// cannot make a view too large to hold.
const MaxTensors = 1 << 18

// Source is a checkpoint tensor under the name the mapping sees it by (its
// name in the selected subtree).
type Source struct {
	Name   string
	Tensor *ckpt.Tensor
}

// Result is a mapping applied to a checkpoint.
type Result struct {
	Tensors []Tensor
	// Unused are the sources no rule took.
	Unused []string
	// Tied are sources left out because the model ties them to another.
	Tied []string
}

// Apply maps the sources by the spec. params holds the hyper-parameters
// (heads, kv_heads, head_dim, vocab, ...) and tied whether the model ties
// its output projection to its input embeddings. A rule whose source is
// missing (and not optional), a size that does not divide, or two rules
// making one name is an error: a mapping applies wholly or not at all.
func Apply(spec *Spec, sources []Source, params map[string]int64, tied bool) (*Result, error) {
	byName := make(map[string]*ckpt.Tensor, len(sources))
	for _, s := range sources {
		byName[s.Name] = s.Tensor
	}
	used := map[string]bool{}
	made := map[string]bool{}
	res := &Result{}
	var order []position
	for ri, r := range spec.Rules {
		insts, name, err := r.instances(byName)
		if err != nil {
			return nil, fmt.Errorf("mapping %s: %w", spec.Name, err)
		}
		if len(insts) == 0 {
			if r.Optional || r.UnlessTied && tied {
				continue
			}
			return nil, fmt.Errorf("mapping %s: %s needs %s, which the checkpoint does not have", spec.Name, r.To, strings.Join(r.From, " or "))
		}
		if len(res.Tensors)+len(insts) > MaxTensors {
			return nil, fmt.Errorf("mapping %s: makes more than %d tensors", spec.Name, MaxTensors)
		}
		if r.UnlessTied && tied {
			for _, in := range insts {
				res.Tied = append(res.Tied, in.source)
				used[in.source] = true
			}
			continue
		}
		for _, in := range insts {
			t, err := r.tensor(in, params)
			if err != nil {
				return nil, fmt.Errorf("mapping %s: %s from %s: %w", spec.Name, r.To, name, err)
			}
			if made[t.Name] {
				return nil, fmt.Errorf("mapping %s: two rules make %s", spec.Name, t.Name)
			}
			made[t.Name] = true
			used[in.source] = true
			res.Tensors = append(res.Tensors, t)
			order = append(order, position{ri, in.layer})
		}
	}
	sortByLayer(res.Tensors, order)
	for _, s := range sources {
		if !used[s.Name] {
			res.Unused = append(res.Unused, s.Name)
		}
	}
	return res, nil
}

// position is where a view tensor comes from: its rule and layer.
type position struct {
	rule  int
	layer int64 // -1: not per layer
}

// sortByLayer orders the view tensors as a model's state dict is: tensors
// of rules before the first per-layer rule, then each layer's tensors in
// rule order, then the rest.
func sortByLayer(ts []Tensor, pos []position) {
	first := -1
	for _, p := range pos {
		if p.layer >= 0 && (first < 0 || p.rule < first) {
			first = p.rule
		}
	}
	key := func(p position) (int, int64, int) {
		switch {
		case p.layer >= 0:
			return 1, p.layer, p.rule
		case first >= 0 && p.rule > first:
			return 2, 0, p.rule
		}
		return 0, 0, p.rule
	}
	idx := make([]int, len(ts))
	for i := range idx {
		idx[i] = i
	}
	sort.SliceStable(idx, func(a, b int) bool {
		a0, a1, a2 := key(pos[idx[a]])
		b0, b1, b2 := key(pos[idx[b]])
		if a0 != b0 {
			return a0 < b0
		}
		if a1 != b1 {
			return a1 < b1
		}
		return a2 < b2
	})
	sorted := make([]Tensor, len(ts))
	for i, j := range idx {
		sorted[i] = ts[j]
	}
	copy(ts, sorted)
}

// instance is one application of a rule: a source, and the layer it makes.
type instance struct {
	source string
	tensor *ckpt.Tensor
	layer  int64 // -1 when the rule is not per layer
}

// instances finds the rule's source (the first alternative that exists) and
// the layers it makes.
func (r *Rule) instances(byName map[string]*ckpt.Tensor) ([]instance, string, error) {
	for _, from := range r.From {
		if !strings.Contains(from, "{l}") {
			t := byName[from]
			if t == nil {
				continue
			}
			if !r.Stacked {
				return []instance{{from, t, -1}}, from, nil
			}
			if err := stackable(from, t); err != nil {
				return nil, from, err
			}
			out := make([]instance, t.Shape[0])
			for l := range out {
				out[l] = instance{from, t, int64(l)}
			}
			return out, from, nil
		}
		re := regexp.MustCompile("^" + strings.ReplaceAll(regexp.QuoteMeta(from), `\{l\}`, `(0|[1-9][0-9]{0,5})`) + "$")
		var out []instance
		for name, t := range byName {
			if m := re.FindStringSubmatch(name); m != nil {
				l, _ := strconv.ParseInt(m[1], 10, 64)
				out = append(out, instance{name, t, l})
			}
		}
		if len(out) > 0 {
			sort.Slice(out, func(i, j int) bool { return out[i].layer < out[j].layer })
			return out, from, nil
		}
	}
	return nil, "", nil
}

// stackable checks the leading axis of a source stacked by layer before it
// sizes anything: a layer count from the checkpoint, bounded, over layers
// that hold bytes (a [2^40, 0] tensor is 2^40 empty layers in no bytes).
func stackable(name string, t *ckpt.Tensor) error {
	if len(t.Shape) == 0 {
		return fmt.Errorf("%s is stacked by layer but has no dimensions", name)
	}
	if n, err := ckpt.NumElements(t.Shape[1:]); err != nil || n == 0 {
		return fmt.Errorf("%s is stacked by layer but its layers hold no elements (shape %v)", name, t.Shape)
	}
	if layers := t.Shape[0]; layers < 0 || layers > MaxLayers {
		return fmt.Errorf("%s is stacked over %d layers (at most %d)", name, layers, MaxLayers)
	}
	return nil
}

// tensor builds the view tensor of one instance.
func (r *Rule) tensor(in instance, params map[string]int64) (Tensor, error) {
	src := in.tensor
	name := r.To
	if in.layer >= 0 {
		name = strings.ReplaceAll(name, "{l}", strconv.FormatInt(in.layer, 10))
	}
	// The slice of the source the rule works on: one layer of a stacked
	// tensor, else all of it; shape is its shape without the layer axis.
	off := make([]int64, len(src.Shape))
	size := append([]int64(nil), src.Shape...)
	shape := src.Shape
	if r.Stacked {
		off[0], size[0] = in.layer, 1
		shape = src.Shape[1:]
	}
	if len(shape) == 0 {
		if r.Rows != "" || r.Split != nil || r.Permute != nil {
			return Tensor{}, fmt.Errorf("rows, split or permute of a 0-dim tensor")
		}
		return Tensor{Name: name, Shape: shape, Pieces: []Piece{{Source: src, Offsets: off, Sizes: size}}}, nil
	}
	axis := len(src.Shape) - len(shape) // dimension 0 of the slice, in the source
	rows := shape[0]
	// Rows, splits and permutations are sized by rows: an empty slice
	// bounds nothing (a [2^40, 0] tensor), so it may not have them.
	if n, err := ckpt.NumElements(shape); err != nil || n == 0 {
		if r.Rows != "" || r.Split != nil || r.Permute != nil {
			return Tensor{}, fmt.Errorf("rows, split or permute of an empty tensor (shape %v)", shape)
		}
	}
	env := withRows(params, rows)
	var transform []string
	if r.Rows != "" {
		a, b, err := rowRange(r.Rows, env)
		if err != nil {
			return Tensor{}, err
		}
		if a < 0 || b > rows || a > b {
			return Tensor{}, fmt.Errorf("rows %d:%d outside %d", a, b, rows)
		}
		if a != 0 || b != rows {
			transform = append(transform, fmt.Sprintf("rows %d:%d", a, b))
		}
		off[axis] += a
		size[axis] = b - a
		rows = b - a
		env = withRows(params, rows)
	}
	pieces := []Piece{{Source: src, Offsets: off, Sizes: size}}
	if r.Split != nil {
		var err error
		pieces, rows, err = r.Split.apply(pieces[0], axis, rows, env)
		if err != nil {
			return Tensor{}, err
		}
		transform = append(transform, r.Split.describe())
	}
	if in.layer >= 0 && r.Stacked {
		transform = append([]string{fmt.Sprintf("layer %d", in.layer)}, transform...)
	}
	if r.Permute != nil {
		heads, err := eval(r.Permute.Rope, params)
		if err != nil {
			return Tensor{}, err
		}
		if len(pieces) != 1 {
			return Tensor{}, fmt.Errorf("permute of a split tensor")
		}
		perm, err := ropeHalves(rows, heads)
		if err != nil {
			return Tensor{}, err
		}
		pieces[0].Rows = perm
		transform = append(transform, fmt.Sprintf("RoPE pairs to halves, %d heads", heads))
	}
	viewShape := append([]int64{rows}, shape[1:]...)
	return Tensor{Name: name, Shape: viewShape, Pieces: pieces, Transform: strings.Join(transform, ", ")}, nil
}

func withRows(params map[string]int64, rows int64) map[string]int64 {
	env := make(map[string]int64, len(params)+1)
	for k, v := range params {
		env[k] = v
	}
	env["rows"] = rows
	return env
}

func rowRange(spec string, env map[string]int64) (int64, int64, error) {
	as, bs, _ := strings.Cut(spec, ":")
	a, err := eval(as, env)
	if err != nil {
		return 0, 0, err
	}
	b, err := eval(bs, env)
	return a, b, err
}

// apply cuts piece p (whose dimension axis has rows rows) into the split's
// groups and parts and returns the pieces of part Take, and their rows.
func (s *Split) apply(p Piece, axis int, rows int64, env map[string]int64) ([]Piece, int64, error) {
	groups := int64(1)
	if s.Groups != "" {
		var err error
		if groups, err = eval(s.Groups, env); err != nil {
			return nil, 0, err
		}
	}
	if groups <= 0 {
		return nil, 0, fmt.Errorf("split into %d groups", groups)
	}
	sizes := make([]int64, len(s.Sizes))
	var group, at int64
	for i, e := range s.Sizes {
		v, err := eval(e, env)
		if err != nil {
			return nil, 0, err
		}
		if v < 0 {
			return nil, 0, fmt.Errorf("split size %s is %d", e, v)
		}
		if i == s.Take {
			at = group
		}
		sizes[i] = v
		var ok bool
		if group, ok = checked.Add(group, v); !ok {
			return nil, 0, fmt.Errorf("split sizes %v overflow", s.Sizes[:i+1])
		}
	}
	// Checked: a product that wraps could match rows and pass.
	if total, ok := checked.Mul(group, groups); !ok || total != rows {
		return nil, 0, fmt.Errorf("split into %d groups of %v rows does not cover %d rows", groups, sizes, rows)
	}
	out := make([]Piece, groups)
	for g := range out {
		q := Piece{Source: p.Source, Offsets: append([]int64(nil), p.Offsets...), Sizes: append([]int64(nil), p.Sizes...)}
		q.Offsets[axis] += int64(g)*group + at
		q.Sizes[axis] = sizes[s.Take]
		out[g] = q
	}
	return out, groups * sizes[s.Take], nil
}

func (s *Split) describe() string {
	d := fmt.Sprintf("part %d of [%s]", s.Take, strings.Join(s.Sizes, ", "))
	if s.Groups != "" {
		d += " in each of " + s.Groups + " groups"
	}
	return d
}

// ropeHalves is the row order that shows heads stored in interleaved-pair
// RoPE order in rotate-half order: in each head of d rows, view row i is
// stored row 2i for i < d/2, and view row d/2+i is stored row 2i+1 (what
// torchtitan's state dict adapter does with view/transpose/reshape).
func ropeHalves(rows, heads int64) ([]int64, error) {
	if heads <= 0 || rows%heads != 0 || (rows/heads)%2 != 0 {
		return nil, fmt.Errorf("%d rows are not %d heads of an even size", rows, heads)
	}
	d := rows / heads
	perm := make([]int64, rows)
	for h := int64(0); h < heads; h++ {
		for i := int64(0); i < d/2; i++ {
			perm[h*d+i] = h*d + 2*i
			perm[h*d+d/2+i] = h*d + 2*i + 1
		}
	}
	return perm, nil
}
