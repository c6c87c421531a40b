package layout

import (
	"github.com/ckptfs/ckptfs/layout/ckpt"
)

// Report is what `ckptfs inspect` prints: the checkpoint as found and the
// view planned from it. It marshals to stable JSON.
type Report struct {
	Dir      string         `json:"dir"`
	Format   Format         `json:"format"`
	Tensors  []TensorReport `json:"tensors"`
	Objects  []ckpt.Object  `json:"objects,omitempty"`
	Skipped  []ckpt.Skipped `json:"skipped,omitempty"`
	Files    []FileReport   `json:"view_files"`
	Selected int            `json:"tensors_in_view"`
	// Omitted lists every tensor left out of the view, and why.
	Omitted []Omission `json:"left_out,omitempty"`
	// Note says why a view holds no tensors (optimizer state only).
	Note string `json:"note,omitempty"`
}

// TensorReport describes one stored tensor.
type TensorReport struct {
	Name        string  `json:"name"`
	ViewName    string  `json:"view_name,omitempty"` // empty when not in the view
	ViewFile    string  `json:"view_file,omitempty"`
	DType       string  `json:"dtype"`
	Shape       []int64 `json:"shape"`
	Chunks      int     `json:"chunks"`
	ShardedDims []int   `json:"sharded_dims"`
	Bytes       int64   `json:"bytes"`
}

// FileReport describes one view file.
type FileReport struct {
	Name    string `json:"name"`
	Size    int64  `json:"size"`
	Tensors int    `json:"tensors,omitempty"`
	Source  string `json:"source,omitempty"` // sidecars: the backing path
}

// NewReport describes c and its view v (v may be nil when planning failed).
func NewReport(c *ckpt.Checkpoint, v *View) Report {
	r := Report{Dir: c.Dir, Format: c.Format, Objects: c.Objects, Skipped: c.Skipped}
	inView := map[string]Placement{}
	if v != nil {
		for _, p := range v.Tensors {
			for _, src := range p.Origin().Sources {
				inView[src] = p
			}
		}
		for _, f := range v.Files {
			r.Files = append(r.Files, FileReport{Name: f.Name, Size: f.Size, Tensors: len(f.placements), Source: f.Path})
		}
		r.Selected = len(v.Tensors)
		r.Omitted, r.Note = v.Omitted, v.Note
	}
	for _, t := range c.Tensors {
		tr := TensorReport{
			Name: t.Name, DType: string(t.DType), Shape: t.Shape, Chunks: len(t.Chunks),
			ShardedDims: t.ShardedDims(), Bytes: t.ByteSize(),
		}
		if tr.ShardedDims == nil {
			tr.ShardedDims = []int{}
		}
		if p, ok := inView[t.Name]; ok {
			tr.ViewName, tr.ViewFile = p.Name, p.File
		}
		r.Tensors = append(r.Tensors, tr)
	}
	return r
}
