package view

import (
	"cmp"
	"slices"
	"sort"

	"github.com/ckptfs/ckptfs/layout/ckpt"
)

// sourceSet collects the checkpoint files a view file's bytes come from:
// every file of a tensor shown whole, and for a tensor a mapping cuts into
// pieces (a layer, an expert of a stacked tensor) only the files of the
// chunks that hold bytes of a piece. A file of a Megatron MoE view holds
// hundreds of pieces of a few stacked tensors of hundreds of chunks each:
// each tensor's chunks are matched against all its pieces at once, through
// the pieces sorted by their first offset.
type sourceSet struct {
	seen  map[*ckpt.File]bool
	out   []*ckpt.File
	boxes map[*geometry][]sourceBox
	order []*geometry // of boxes' keys, as first seen
}

type sourceBox struct{ offsets, sizes []int64 }

func newSourceSet() *sourceSet {
	return &sourceSet{seen: map[*ckpt.File]bool{}, boxes: map[*geometry][]sourceBox{}}
}

func (s *sourceSet) add(f *ckpt.File) {
	if !s.seen[f] {
		s.seen[f] = true
		s.out = append(s.out, f)
	}
}

// whole adds the files of every chunk of g that holds bytes.
func (s *sourceSet) whole(g *geometry) {
	var last *ckpt.File
	for _, c := range g.tensor.Chunks.All() {
		// Chunks of one file come in runs (a rank's): one look-up a run.
		if f := backingOf(c); f != nil && f != last && holdsBytes(c) {
			last = f
			s.add(f)
		}
	}
}

// box notes the box of g at offsets, sizes (matched in files).
func (s *sourceSet) box(g *geometry, offsets, sizes []int64) {
	if _, ok := s.boxes[g]; !ok {
		s.order = append(s.order, g)
	}
	s.boxes[g] = append(s.boxes[g], sourceBox{offsets, sizes})
}

// files returns the files added, then those of the chunks the boxes meet.
func (s *sourceSet) files() []*ckpt.File {
	for _, g := range s.order {
		bs := s.boxes[g]
		if len(g.tensor.Shape) == 0 { // a scalar: its chunk is all of it
			s.whole(g)
			continue
		}
		slices.SortFunc(bs, func(a, b sourceBox) int { return cmp.Compare(a.offsets[0], b.offsets[0]) })
		var longest int64 // of the boxes along the first axis
		for _, b := range bs {
			longest = max(longest, b.sizes[0])
		}
		for _, c := range g.tensor.Chunks.All() {
			f := backingOf(c)
			if f == nil || s.seen[f] || !holdsBytes(c) {
				continue
			}
			// The boxes that may meet c start after c's first offset less
			// the longest box, and before c's end.
			from, to := c.Offsets[0]-longest, c.Offsets[0]+c.Sizes[0]
			i := sort.Search(len(bs), func(i int) bool { return bs[i].offsets[0] > from })
			for ; i < len(bs) && bs[i].offsets[0] < to; i++ {
				if meets(c, bs[i]) {
					s.add(f)
					break
				}
			}
		}
	}
	return s.out
}

// backingOf is the file a chunk's bytes lie in; nil if none.
func backingOf(c ckpt.Chunk) *ckpt.File {
	if b, ok := c.Source.(ckpt.Backed); ok {
		return b.Backing()
	}
	return nil
}

// holdsBytes reports whether chunk c holds any bytes (boxes leaves out
// those that do not).
func holdsBytes(c ckpt.Chunk) bool {
	for _, n := range c.Sizes {
		if n <= 0 {
			return false
		}
	}
	return true
}

// meets reports whether chunk c and box b share an element.
func meets(c ckpt.Chunk, b sourceBox) bool {
	for d, n := range c.Sizes {
		if b.sizes[d] <= 0 || c.Offsets[d] >= b.offsets[d]+b.sizes[d] || b.offsets[d] >= c.Offsets[d]+n {
			return false
		}
	}
	return true
}
