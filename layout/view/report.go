package view

import (
	"github.com/ckptfs/ckptfs/layout/ckpt"
)

// Report is what `ckptfs inspect` prints: the checkpoint as found and the
// view planned from it. It marshals to stable JSON.
type Report struct {
	Dir      string         `json:"dir"`
	Format   ckpt.Format    `json:"format"`
	Tensors  []TensorReport `json:"tensors"`
	Objects  []ckpt.Object  `json:"objects,omitempty"`
	Skipped  []ckpt.Skipped `json:"skipped,omitempty"`
	Files    []FileReport   `json:"view_files"`
	Selected int            `json:"tensors_in_view"`
	// Mapping names the mapping that made the view's tensors.
	Mapping string `json:"mapping,omitempty"`
	// View lists the view's tensors and what each is made of.
	View []ViewTensorReport `json:"view_tensors,omitempty"`
	// Omitted lists every tensor left out of the view, and why.
	Omitted []Omission `json:"left_out,omitempty"`
	// Note says why a view holds no tensors (optimizer state only).
	Note string `json:"note,omitempty"`
	// Warnings say what the view could not do or had to assume.
	Warnings []string `json:"warnings,omitempty"`
	// Verified says what inspect --verify checked.
	Verified string `json:"verified,omitempty"`
}

// TensorReport describes one stored tensor.
type TensorReport struct {
	Name string `json:"name"`
	// ViewName and ViewFile place a tensor shown as it is stored; empty
	// when it is left out, or used by a mapping (see ViewTensors).
	ViewName    string  `json:"view_name,omitempty"`
	ViewFile    string  `json:"view_file,omitempty"`
	DType       string  `json:"dtype"`
	Shape       []int64 `json:"shape"`
	Chunks      int     `json:"chunks"`
	ShardedDims []int   `json:"sharded_dims"`
	Bytes       int64   `json:"bytes"`
	// Mapped counts the view tensors a mapping makes from this one.
	Mapped int `json:"mapped_into,omitempty"`
}

// ViewTensorReport describes one tensor of the view.
type ViewTensorReport struct {
	Name  string  `json:"name"`
	File  string  `json:"file"`
	DType string  `json:"dtype"`
	Shape []int64 `json:"shape"`
	Origin
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
	r := Report{Dir: c.Dir, Format: c.Format, Objects: c.Objects, Skipped: c.Skipped, Warnings: c.Warnings}
	inView := map[string]Placement{}
	mapped := map[string]int{}
	if v != nil {
		for _, p := range v.Tensors {
			o := p.Origin()
			if len(o.Sources) == 1 && o.Transform == "" {
				inView[o.Sources[0]] = p
			}
			for _, src := range o.Sources {
				mapped[src]++
			}
			r.View = append(r.View, ViewTensorReport{Name: p.Name, File: p.File, DType: string(p.content.dtype()),
				Shape: p.content.shape(), Origin: o})
		}
		for _, f := range v.Files {
			r.Files = append(r.Files, FileReport{Name: f.Name, Size: f.Size, Tensors: len(f.placements), Source: f.Path})
		}
		r.Selected = len(v.Tensors)
		r.Mapping, r.Omitted, r.Note, r.Warnings = v.Mapping, v.Omitted, v.Note, v.Warnings
	}
	for _, t := range c.Tensors {
		tr := TensorReport{
			Name: t.Name, DType: string(t.DType), Shape: t.Shape, Chunks: t.Chunks.Len(),
			ShardedDims: t.ShardedDims(), Bytes: t.ByteSize(),
		}
		if tr.ShardedDims == nil {
			tr.ShardedDims = []int{}
		}
		if p, ok := inView[t.Name]; ok {
			tr.ViewName, tr.ViewFile = p.Name, p.File
		} else {
			tr.Mapped = mapped[t.Name]
		}
		r.Tensors = append(r.Tensors, tr)
	}
	for _, t := range c.Left {
		tr := TensorReport{Name: t.Name, DType: string(t.DType), Shape: t.Shape,
			Chunks: t.Chunks, ShardedDims: t.ShardedDims, Bytes: t.Bytes}
		if tr.ShardedDims == nil {
			tr.ShardedDims = []int{}
		}
		r.Tensors = append(r.Tensors, tr)
	}
	return r
}
