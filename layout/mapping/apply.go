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
		insts, name, err := r.instances(byName, MaxTensors-len(res.Tensors))
		if err != nil {
			return nil, fmt.Errorf("mapping %s: %w", spec.Name, err)
		}
		if len(insts) == 0 {
			if r.Optional || r.UnlessTied && tied {
				continue
			}
			return nil, fmt.Errorf("mapping %s: %s needs %s, which the checkpoint does not have", spec.Name, r.To, strings.Join(r.From, " or "))
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
			order = append(order, position{ri, in.at})
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

// position is where a view tensor comes from: its rule and indices.
type position struct {
	rule int
	at   indices
}

// sortByLayer orders the view tensors as a model's state dict is: tensors
// of rules before the first per-layer rule, then each layer's tensors in
// rule order, with a layer's experts together, each expert's tensors in
// rule order (as an HF MoE block's ModuleList registers them), then the
// rest.
func sortByLayer(ts []Tensor, pos []position) {
	first, firstExpert := -1, -1
	for _, p := range pos {
		if p.at[layerIndex] >= 0 && (first < 0 || p.rule < first) {
			first = p.rule
		}
		if p.at[expertIndex] >= 0 && (firstExpert < 0 || p.rule < firstExpert) {
			firstExpert = p.rule
		}
	}
	key := func(p position) [5]int64 {
		group := int64(p.rule)
		if p.at[expertIndex] >= 0 {
			group = int64(firstExpert)
		}
		switch {
		case p.at[layerIndex] >= 0:
			return [5]int64{1, p.at[layerIndex], group, p.at[expertIndex], int64(p.rule)}
		case first >= 0 && p.rule > first:
			return [5]int64{2, 0, group, p.at[expertIndex], int64(p.rule)}
		}
		return [5]int64{0, 0, group, p.at[expertIndex], int64(p.rule)}
	}
	idx := make([]int, len(ts))
	for i := range idx {
		idx[i] = i
	}
	sort.SliceStable(idx, func(a, b int) bool {
		ka, kb := key(pos[idx[a]]), key(pos[idx[b]])
		for i := range ka {
			if ka[i] != kb[i] {
				return ka[i] < kb[i]
			}
		}
		return false
	})
	sorted := make([]Tensor, len(ts))
	for i, j := range idx {
		sorted[i] = ts[j]
	}
	copy(ts, sorted)
}

// indices are the layer and expert a view tensor is made for, -1 where the
// rule has no such index.
type indices [numIndices]int64

const (
	layerIndex = iota
	expertIndex
	numIndices
)

// indexNames are the placeholders of the indices in names: "{l}", "{e}".
var indexNames = [numIndices]string{"l", "e"}

// indexWords name the indices in inspect's transforms.
var indexWords = [numIndices]string{"layer", "expert"}

func placeholder(i int) string { return "{" + indexNames[i] + "}" }

// noIndices is the position of a rule with neither index.
var noIndices = indices{-1, -1}

// instance is one application of a rule: a source, and the indices of the
// tensor it makes.
type instance struct {
	source string
	tensor *ckpt.Tensor
	at     indices
	axes   Axes // the stacked axes of the source: see Rule.axesOf
}

// instances finds the rule's source (the first alternative that exists)
// and the layers and experts it makes: from indices matched in the
// source's name, then from its stacked axes. At most limit instances are
// made; more is an error, found before anything is allocated for them.
func (r *Rule) instances(byName map[string]*ckpt.Tensor, limit int) ([]instance, string, error) {
	for _, from := range r.From {
		var named []instance
		if re := nameTemplate(from); re != nil {
			for name, t := range byName {
				if at, ok := matchIndices(re, name); ok {
					named = append(named, instance{source: name, tensor: t, at: at})
				}
			}
			// Map order is random: the order of layers and experts is not.
			sort.Slice(named, func(i, j int) bool {
				a, b := named[i].at, named[j].at
				if a[layerIndex] != b[layerIndex] {
					return a[layerIndex] < b[layerIndex]
				}
				return a[expertIndex] < b[expertIndex]
			})
		} else if t := byName[from]; t != nil {
			named = []instance{{source: from, tensor: t, at: noIndices}}
		}
		if len(named) == 0 {
			continue
		}
		axes := r.axesOf(from)
		for i := range named {
			named[i].axes = axes
		}
		if len(axes) == 0 {
			if len(named) > limit {
				return nil, from, fmt.Errorf("%s makes more than %d tensors", from, limit)
			}
			return named, from, nil
		}
		var out []instance
		for _, in := range named {
			counts, err := stackable(in.source, in.tensor, axes)
			if err != nil {
				return nil, from, err
			}
			n := int64(1)
			for _, c := range counts {
				n *= c // each at most MaxLayers, and there are at most numIndices
			}
			if n > int64(limit-len(out)) {
				return nil, from, fmt.Errorf("%s makes more than %d tensors", from, limit)
			}
			out = append(out, expand(in, axes, counts)...)
		}
		return out, from, nil
	}
	return nil, "", nil
}

// axesOf is the stacked axes of the source name from: the rule's, less
// the indices the name itself gives.
func (r *Rule) axesOf(from string) Axes {
	var axes Axes
	for _, ax := range r.Stacked {
		if !strings.Contains(from, placeholder(indexOf(ax))) {
			axes = append(axes, ax)
		}
	}
	return axes
}

// stackable checks the leading axes of a source stacked by layer or expert
// before they size anything: counts from the checkpoint, bounded, over
// slices that hold elements (a [2^40, 0] tensor is 2^40 empty layers in no
// bytes). It returns the count of each stacked axis.
func stackable(name string, t *ckpt.Tensor, axes Axes) ([]int64, error) {
	k := len(axes)
	if len(t.Shape) < k {
		return nil, fmt.Errorf("%s is stacked on %d axes but has %d dimensions", name, k, len(t.Shape))
	}
	if n, err := ckpt.NumElements(t.Shape[k:]); err != nil || n == 0 {
		return nil, fmt.Errorf("%s is stacked by %s but its slices hold no elements (shape %v)", name, axes, t.Shape)
	}
	for i, c := range t.Shape[:k] {
		if c < 0 || c > MaxLayers {
			return nil, fmt.Errorf("%s is stacked over %d along axis %d (at most %d)", name, c, i, MaxLayers)
		}
	}
	return t.Shape[:k], nil
}

// expand makes one instance per index tuple of the stacked axes.
func expand(in instance, axes Axes, counts []int64) []instance {
	out := []instance{in}
	for k, ax := range axes {
		next := make([]instance, 0, int64(len(out))*counts[k])
		for _, o := range out {
			for i := int64(0); i < counts[k]; i++ {
				o.at[indexOf(ax)] = i
				next = append(next, o)
			}
		}
		out = next
	}
	return out
}

// indexOf is the position of an index name in indices; Spec.validate
// rejects other names.
func indexOf(name string) int {
	for i, n := range indexNames {
		if n == name {
			return i
		}
	}
	return -1
}

// nameTemplate is the pattern of a source name with index placeholders,
// or nil when it has none.
func nameTemplate(from string) *regexp.Regexp {
	q := regexp.QuoteMeta(from)
	found := false
	for i := range indexNames {
		ph := regexp.QuoteMeta(placeholder(i))
		if strings.Contains(q, ph) {
			found = true
			q = strings.ReplaceAll(q, ph, "(?P<"+indexNames[i]+">0|[1-9][0-9]{0,5})")
		}
	}
	if !found {
		return nil
	}
	return regexp.MustCompile("^" + q + "$")
}

// matchIndices matches name against a template: the indices it names, and
// whether it matched (one index named twice must have one value).
func matchIndices(re *regexp.Regexp, name string) (indices, bool) {
	m := re.FindStringSubmatch(name)
	if m == nil {
		return indices{}, false
	}
	at := noIndices
	for gi, g := range re.SubexpNames() {
		i := indexOf(g)
		if i < 0 {
			continue
		}
		v, _ := strconv.ParseInt(m[gi], 10, 64)
		if at[i] >= 0 && at[i] != v {
			return indices{}, false
		}
		at[i] = v
	}
	return at, true
}

// tensor builds the view tensor of one instance.
func (r *Rule) tensor(in instance, params map[string]int64) (Tensor, error) {
	src := in.tensor
	name := r.To
	for i, v := range in.at {
		if v >= 0 {
			name = strings.ReplaceAll(name, placeholder(i), strconv.FormatInt(v, 10))
		}
	}
	// The slice of the source the rule works on: one layer (and expert) of
	// a stacked tensor, else all of it; shape is its shape without the
	// stacked axes.
	off := make([]int64, len(src.Shape))
	size := append([]int64(nil), src.Shape...)
	var stacked []string // "layer 3", "expert 1", for inspect
	for k, ax := range in.axes {
		off[k], size[k] = in.at[indexOf(ax)], 1
		stacked = append(stacked, fmt.Sprintf("%s %d", indexWords[indexOf(ax)], off[k]))
	}
	shape := src.Shape[len(in.axes):]
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
	transform = append(stacked, transform...)
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
