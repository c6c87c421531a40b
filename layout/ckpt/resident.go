package ckpt

import "unsafe"

// Resident memory of an open checkpoint: what its index holds while it is
// open, counted from its own slices and strings (not measured), so that a
// mount can bound the metadata of its open views by bytes
// (vfs.Options.MetadataBudget). It counts what grows with the checkpoint:
// tensors, chunks, their sources, left and skipped tensors, objects.

// Resident is a Source that can say how many bytes it holds in memory
// besides what its tensor's Chunks hold.
type Resident interface {
	ResidentBytes() int64
}

// defaultSourceBytes is counted for a source that does not say.
const defaultSourceBytes = 64

// ResidentBytes estimates the bytes c's index holds in memory.
func (c *Checkpoint) ResidentBytes() int64 {
	if c == nil {
		return 0
	}
	n := int64(unsafe.Sizeof(*c))
	for _, t := range c.Tensors {
		n += int64(unsafe.Sizeof(*t)) + int64(len(t.Name)) + pathBytes(t.Path) + 8*int64(len(t.Shape)) + t.validBytes()
		n += t.Chunks.residentBytes()
		for i := range t.Chunks.Len() {
			src := t.Chunks.Source(i)
			if r, ok := src.(Resident); ok {
				n += r.ResidentBytes()
			} else if src != nil {
				n += defaultSourceBytes
			}
		}
	}
	for _, t := range c.Left {
		n += int64(unsafe.Sizeof(t)) + int64(len(t.Name)) + pathBytes(t.Path) + 8*int64(len(t.Shape)+len(t.ShardedDims))
	}
	for _, s := range c.Skipped {
		n += int64(unsafe.Sizeof(s)) + int64(len(s.Name)+len(s.Reason))
	}
	for _, o := range c.Objects {
		n += int64(unsafe.Sizeof(o)) + int64(len(o.Name)+len(o.Source)) + pathBytes(o.Path) + defaultSourceBytes
	}
	for _, p := range c.Parts {
		n += p.ResidentBytes()
	}
	return n
}

func pathBytes(p []string) int64 {
	n := int64(16 * len(p))
	for _, s := range p {
		n += int64(len(s))
	}
	return n
}

// HeapSize bounds what the Go allocator takes for an object of n bytes, so that
// what is counted from lengths is an upper bound of what is held:
// its size classes are the multiples of 16 up to 256 (and 8, 24), of 32 up
// to 512, and at most a quarter apart up to 32 KiB; larger objects take
// whole 8 KiB pages.
func HeapSize(n int64) int64 {
	switch {
	case n <= 0:
		return 0
	case n <= 8:
		return 8
	case n <= 24 && n > 16:
		return 24
	case n <= 256:
		return (n + 15) &^ 15
	case n <= 512:
		return (n + 31) &^ 31
	case n <= 32<<10:
		return n + n/4 + 16
	}
	return (n + 8<<10 - 1) &^ (8<<10 - 1)
}
