package view

import (
	"fmt"
	"io"
	"sort"
	"sync"
	"time"

	"github.com/ckptfs/ckptfs/internal/par"
	"github.com/ckptfs/ckptfs/layout/ckpt"
	"github.com/ckptfs/ckptfs/layout/source"
	"github.com/ckptfs/ckptfs/safetensors"
)

// FileKind says where a view file's bytes come from.
type FileKind int

const (
	// KindSafetensors files are a generated header plus tensor bytes gathered
	// from the shards.
	KindSafetensors FileKind = iota
	// KindGenerated files are small documents built at plan time (the index).
	KindGenerated
	// KindPassthrough files are real files shown as they are: sidecars
	// (config.json, tokenizer files) and the weights of a plain HF directory.
	KindPassthrough
)

// File is one file of a view. It is an io.ReaderAt over immutable bytes of a
// size known at plan time.
type File struct {
	Name    string
	Size    int64
	ModTime time.Time
	Kind    FileKind
	// Path names the backing file of a passthrough file.
	Path string

	header     []byte      // safetensors: the encoded header (with length prefix)
	placements []Placement // safetensors: sorted by Offset
	data       []byte      // generated files
	src        *ckpt.File  // passthrough files

	sourcesOnce sync.Once
	sources     []*ckpt.File // Sources, computed once: a mount asks several times
}

// Placement is where one tensor's bytes sit in a view file.
type Placement struct {
	Name    string // name in the view
	File    string
	Offset  int64 // absolute offset in the file
	Size    int64
	content content
}

// Origin says which checkpoint tensors the placement's bytes come from.
func (p Placement) Origin() Origin { return p.content.origin() }

// Sources lists the checkpoint files the view file's bytes come from (a
// slice shared by every call: read-only).
func (f *File) Sources() []*ckpt.File {
	f.sourcesOnce.Do(func() { f.sources = f.findSources() })
	return f.sources
}

// FindSources computes every file's Sources on up to sourceWorkers cores:
// a mount asks for them all as it first shows a view, and a view at scale
// has hundreds of files and a million chunks.
func (v *View) FindSources() {
	par.Each(len(v.Files), sourceWorkers, func(_, i int) bool {
		v.Files[i].Sources()
		return true
	})
}

// sourceWorkers is how many cores FindSources uses at most.
var sourceWorkers = par.Cores()

func (f *File) findSources() []*ckpt.File {
	if f.src != nil {
		return []*ckpt.File{f.src}
	}
	s := newSourceSet()
	for _, p := range f.placements {
		p.content.backing(s)
	}
	return s.files()
}

// CheckFresh reports whether every file the view file's bytes come from is
// still the one seen when the checkpoint was opened (ckpt.ErrSourceChanged
// if not): a stat per file, cheap enough to run at each open.
func (f *File) CheckFresh() error {
	for _, s := range f.Sources() {
		if err := s.CheckFresh(); err != nil {
			return fmt.Errorf("layout: %s: %w", f.Name, err)
		}
	}
	return nil
}

// DataOffset is where a safetensors view file's tensor data starts (the
// length of its generated header); 0 for other files.
func (f *File) DataOffset() int64 { return int64(len(f.header)) }

// Placements lists the tensors of a safetensors view file in file order.
func (f *File) Placements() []Placement { return f.placements }

func newTensorFile(name string, ts []viewTensor, mtime time.Time) (*File, error) {
	infos := make([]safetensors.TensorInfo, len(ts))
	for i, t := range ts {
		infos[i] = safetensors.TensorInfo{Name: t.name, DType: t.content.dtype(), Shape: t.content.shape()}
	}
	infos = safetensors.Layout(infos)
	header, err := safetensors.EncodeHeader(map[string]string{"format": "pt"}, infos)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	f := &File{Name: name, ModTime: mtime, Kind: KindSafetensors, header: header}
	base := int64(len(header))
	for i, info := range infos {
		f.placements = append(f.placements, Placement{
			Name: info.Name, File: name, Offset: base + info.Begin, Size: info.End - info.Begin, content: ts[i].content,
		})
	}
	f.Size = base
	if n := len(infos); n > 0 {
		f.Size = base + infos[n-1].End
	}
	return f, nil
}

func newBytesFile(name string, data []byte, mtime time.Time) *File {
	return &File{Name: name, Size: int64(len(data)), ModTime: mtime, Kind: KindGenerated, data: data}
}

func newPassthroughFile(name string, src *ckpt.File) *File {
	return &File{Name: name, Size: src.Size(), ModTime: src.ModTime(), Kind: KindPassthrough, Path: src.Path, src: src}
}

// ReadAt reads view bytes. Like os.File, it returns io.EOF when the read
// reaches past the end. Errors name the view file, the tensor and the source.
func (f *File) ReadAt(p []byte, off int64) (int, error) {
	if off < 0 {
		return 0, fmt.Errorf("layout: %s: negative offset %d", f.Name, off)
	}
	if off >= f.Size {
		return 0, io.EOF
	}
	want := p
	if rem := f.Size - off; int64(len(want)) > rem {
		want = want[:rem]
	}
	var err error
	switch f.Kind {
	case KindGenerated:
		copy(want, f.data[off:])
	case KindPassthrough:
		err = source.ReadFullAt(f.src, want, off)
	case KindSafetensors:
		err = f.readTensors(want, off)
	}
	if err != nil {
		return 0, fmt.Errorf("layout: %s [%d, %d): %w", f.Name, off, off+int64(len(want)), err)
	}
	if len(want) < len(p) {
		return len(want), io.EOF
	}
	return len(want), nil
}

// readTensors reads the window with one plan for all its tensors.
func (f *File) readTensors(p []byte, off int64) error {
	plan := newPlan()
	defer plan.release()
	end := off + int64(len(p))
	if off < int64(len(f.header)) {
		n := copy(p, f.header[off:])
		p, off = p[n:], off+int64(n)
	}
	i := sort.Search(len(f.placements), func(i int) bool {
		pl := f.placements[i]
		return pl.Offset+pl.Size > off
	})
	for ; i < len(f.placements) && off < end; i++ {
		pl := f.placements[i]
		if pl.Size == 0 {
			continue
		}
		lo := off - pl.Offset
		n := min(pl.Size-lo, end-off)
		if err := pl.content.plan(plan, p[:n], lo); err != nil {
			return err
		}
		p, off = p[n:], off+n
	}
	return plan.run()
}
