package dcpwrite

import (
	"bufio"
	"fmt"
	"io"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"

	"github.com/ckptfs/ckptfs/layout/ckpt"
)

// Replicate is the Rule.Dim of a tensor stored whole, once, by rank 0.
const Replicate = -1

// Target is the layout to reshard into, chosen at mount time.
type Target struct {
	// WorldSize is the number of ranks; 0 or less means 1.
	WorldSize int
	// Rules pick the placement of each tensor by its name as written in the
	// safetensors file (without Prefix); the first match wins. Tensors no
	// rule matches are sharded on dim 0 the way FSDP2 does (Shard(0)).
	Rules []Rule
	// Like, when set, supplies chunk boxes: a tensor whose FQN (or, failing
	// that, plain name) and shape match a tensor of Like reuses that
	// tensor's chunk boxes, chunk i going to rank i mod WorldSize. Rules are
	// not consulted for such tensors.
	Like *ckpt.Checkpoint
	// Prefix nests every tensor under a key: Prefix "model" stores name as
	// the FQN "model.<name>" with planner path ("model", "<name>"), which is
	// what dcp.save of {"model": model.state_dict()} writes. A dotted prefix
	// "a.b" nests twice: ("a", "b", "<name>"). Empty: FQN = name, path (name,).
	Prefix string
}

// Rule places the tensors whose name matches Pattern: Shard(Dim), or
// Replicate when Dim is -1.
type Rule struct {
	Pattern *regexp.Regexp
	Dim     int
}

// RankChunk is one rank's box of a tensor.
type RankChunk struct {
	Rank    int
	Offsets []int64
	Sizes   []int64
}

// ParseRules reads a plan file: one rule per line, "REGEX DIM" or
// "REGEX replicate" (separated by white space; the regex may not contain
// spaces), blank lines and '#' comments ignored. The regex matches anywhere
// in the name unless anchored. Errors name the line.
func ParseRules(r io.Reader) ([]Rule, error) {
	var rules []Rule
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for n := 1; sc.Scan(); n++ {
		line := sc.Text()
		if i := strings.IndexByte(line, '#'); i >= 0 {
			line = line[:i]
		}
		fields := strings.Fields(line)
		if len(fields) == 0 {
			continue
		}
		if len(fields) != 2 {
			return nil, fmt.Errorf("dcpwrite: plan line %d: want \"REGEX DIM\" or \"REGEX replicate\", got %d fields", n, len(fields))
		}
		re, err := regexp.Compile(fields[0])
		if err != nil {
			return nil, fmt.Errorf("dcpwrite: plan line %d: %w", n, err)
		}
		dim := Replicate
		if !strings.EqualFold(fields[1], "replicate") {
			d, err := strconv.Atoi(fields[1])
			if err != nil || d < 0 {
				return nil, fmt.Errorf("dcpwrite: plan line %d: placement %q is neither a dimension (0, 1, ...) nor \"replicate\"", n, fields[1])
			}
			dim = d
		}
		rules = append(rules, Rule{Pattern: re, Dim: dim})
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("dcpwrite: reading plan: %w", err)
	}
	return rules, nil
}

func (t Target) world() int {
	if t.WorldSize <= 0 {
		return 1
	}
	return t.WorldSize
}

// FQN is the DCP key a tensor written as name is stored under.
func (t Target) FQN(name string) string {
	if t.Prefix == "" {
		return name
	}
	return t.Prefix + "." + name
}

// plannerPath is the planner_data path of name.
func (t Target) plannerPath(name string) []any {
	var p []any
	if t.Prefix != "" {
		for _, s := range strings.Split(t.Prefix, ".") {
			p = append(p, s)
		}
	}
	return append(p, name)
}

// Dim returns the placement of name for a tensor of rank ndim: the dim it
// is sharded on, or Replicate. A rule naming a dim the tensor lacks, and
// any 0-dim tensor, give Replicate.
func (t Target) Dim(name string, ndim int) int {
	dim := 0
	for _, r := range t.Rules {
		if r.Pattern != nil && r.Pattern.MatchString(name) {
			dim = r.Dim
			break
		}
	}
	if dim >= ndim {
		return Replicate
	}
	return dim
}

// Chunks returns the per-rank boxes of the tensor written as name, in rank
// order. Shard(d) follows torch.chunk / DTensor: chunk size ceil(n/W) on d,
// rank r gets [min(r*c, n), min((r+1)*c, n)); ranks past the data get an
// empty box with offset n on d, and equal empty boxes of several ranks are
// kept once (for the lowest rank), as DCP's dedup does. Replicate gives one
// box, the whole tensor, for rank 0. See Target.Like for reused boxes.
func (t Target) Chunks(name string, shape []int64) []RankChunk {
	w := t.world()
	if like := t.likeChunks(name, shape); like != nil {
		out := make([]RankChunk, len(like))
		for i, c := range like {
			out[i] = RankChunk{Rank: i % w, Offsets: clone(c.Offsets), Sizes: clone(c.Sizes)}
		}
		sort.SliceStable(out, func(a, b int) bool { return out[a].Rank < out[b].Rank })
		return out
	}
	dim := t.Dim(name, len(shape))
	if dim == Replicate || w == 1 {
		return []RankChunk{{Rank: 0, Offsets: make([]int64, len(shape)), Sizes: clone(shape)}}
	}
	n := shape[dim]
	c := (n + int64(w) - 1) / int64(w)
	var out []RankChunk
	seen := map[int64]bool{}
	for r := 0; r < w; r++ {
		start := min(c*int64(r), n)
		end := min(start+c, n)
		if seen[start] { // only empty boxes repeat a start
			continue
		}
		seen[start] = true
		off := make([]int64, len(shape))
		sz := clone(shape)
		off[dim], sz[dim] = start, end-start
		out = append(out, RankChunk{Rank: r, Offsets: off, Sizes: sz})
	}
	return out
}

// likeChunks returns the chunks of the tensor of Like with the same FQN (or
// name) and shape, or nil.
func (t Target) likeChunks(name string, shape []int64) []ckpt.Chunk {
	if t.Like == nil {
		return nil
	}
	var byName *ckpt.Tensor
	fqn := t.FQN(name)
	for _, lt := range t.Like.Tensors {
		if lt.Name == fqn {
			byName = lt
			break
		}
		if lt.Name == name && byName == nil {
			byName = lt
		}
	}
	if byName == nil || !slices.Equal(byName.Shape, shape) || byName.Chunks.Len() == 0 {
		return nil
	}
	return byName.Chunks.Values()
}

func clone(s []int64) []int64 { return append(make([]int64, 0, len(s)), s...) }
