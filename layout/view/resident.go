package view

import "unsafe"

// ResidentBytes estimates the bytes the view and its checkpoint's index
// hold in memory while it is open (ckpt.Checkpoint.ResidentBytes, the
// generated headers and files, the placements): what a mount's metadata
// budget counts (vfs.Options.MetadataBudget).
func (v *View) ResidentBytes() int64 {
	n := int64(unsafe.Sizeof(*v)) + v.Checkpoint.ResidentBytes()
	for _, f := range v.Files {
		n += int64(unsafe.Sizeof(*f)) + int64(len(f.Name)+len(f.Path)+cap(f.header)+cap(f.data))
		for _, p := range f.placements {
			n += int64(unsafe.Sizeof(p)) + int64(len(p.Name)) + contentBytes(p.content)
		}
	}
	n += int64(len(v.Tensors)) * int64(unsafe.Sizeof(Placement{}))
	for _, o := range v.Omitted {
		n += int64(unsafe.Sizeof(o)) + int64(len(o.Name)+len(o.Reason))
	}
	return n
}

// contentBytes is what a view tensor's content holds: its chunks' boxes
// once read (geometry.boxes); a mapped tensor's, a constant.
func contentBytes(c content) int64 {
	if g, ok := c.(*geometry); ok {
		return int64(unsafe.Sizeof(*g)) + g.built.Load()
	}
	return 64
}
