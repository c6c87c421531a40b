package view

import (
	"container/list"
	"sync"
	"unsafe"

	"github.com/ckptfs/ckptfs/layout/ckpt"
)

// boxCache keeps the chunk boxes of the tensors a view read last, within a
// bound that the view counts from its open (View.ResidentBytes): kept for
// every tensor read, they would be most of what a view of hundreds of
// thousands of chunks holds (about 256 bytes a chunk of rank 2, twice its
// index), and building a tensor's boxes again costs far less than reading
// its bytes (BENCHMARKS.md, run AD-resident).
type boxCache struct {
	mu    sync.Mutex
	bound int64     // the most the boxes kept hold
	used  int64     // what they hold (boxBytes of each)
	lru   list.List // of *geometry, the most recently read first
}

// boxBudget is a view's bound for its boxes, raised to its largest tensor's
// (which a read of that tensor needs whole). A variable for tests.
var boxBudget int64 = 4 << 20

// shareBoxes makes the tensors' geometries keep their boxes in one cache,
// bounded by boxBudget or the largest tensor's boxes, and by all of them.
func (v *View) shareBoxes(ts []viewTensor) {
	bc := &boxCache{}
	var largest, all int64
	set := func(g *geometry) {
		if g.cache == nil {
			g.cache = bc
			largest, all = max(largest, g.boxBytes()), all+g.boxBytes()
		}
	}
	for _, t := range ts {
		switch c := t.content.(type) {
		case *geometry:
			set(c)
		case *mapped:
			for i := range c.pieces {
				set(c.pieces[i].src)
			}
		}
	}
	bc.bound = min(max(boxBudget, largest), all)
	v.boxes = bc
}

// resident is the cache and what it may keep.
func (bc *boxCache) resident() int64 {
	if bc == nil {
		return 0
	}
	return ckpt.HeapSize(int64(unsafe.Sizeof(*bc))) + bc.bound
}

// use marks g's boxes as read.
func (bc *boxCache) use(g *geometry) {
	if bc == nil {
		return
	}
	bc.mu.Lock()
	if g.elem != nil {
		bc.lru.MoveToFront(g.elem)
	}
	bc.mu.Unlock()
}

// add keeps g's boxes, just built, dropping those of the tensors read
// longest ago while the cache is past its bound.
func (bc *boxCache) add(g *geometry) {
	if bc == nil {
		return
	}
	bc.mu.Lock()
	defer bc.mu.Unlock()
	g.elem = bc.lru.PushFront(g)
	bc.used += g.boxBytes()
	for bc.used > bc.bound && bc.lru.Len() > 1 {
		old := bc.lru.Remove(bc.lru.Back()).(*geometry)
		old.elem = nil
		old.built.Store(nil)
		bc.used -= old.boxBytes()
	}
}
