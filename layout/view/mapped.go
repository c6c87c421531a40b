package view

import (
	"fmt"

	"github.com/ckptfs/ckptfs/layout/box"
	"github.com/ckptfs/ckptfs/layout/ckpt"
	"github.com/ckptfs/ckptfs/layout/convert"
	"github.com/ckptfs/ckptfs/layout/mapping"
	"github.com/ckptfs/ckptfs/safetensors"
)

// mapped is the content of a view tensor made by a mapping: pieces of
// checkpoint tensors one after the other, optionally converted to another
// floating type on the way out.
type mapped struct {
	t        *mapping.Tensor
	from, to safetensors.DType
	bytes    int64
	pieces   []mappedPiece
}

// mappedPiece is one piece: a box of a source tensor, at view bytes
// [start, end).
type mappedPiece struct {
	src        *geometry
	box        *box.Geometry
	rows       []int64
	rowLen     int64 // source bytes per row, when rows are permuted
	start, end int64
}

// geometries builds each source tensor's gather geometry once.
type geometries map[*ckpt.Tensor]*geometry

func (gs geometries) of(t *ckpt.Tensor) (*geometry, error) {
	if g, ok := gs[t]; ok {
		return g, nil
	}
	g, err := newGeometry(t)
	if err != nil {
		return nil, err
	}
	gs[t] = g
	return g, nil
}

func newMapped(t *mapping.Tensor, gs geometries) (*mapped, error) {
	if err := t.Check(); err != nil {
		return nil, err
	}
	m := &mapped{t: t, from: t.SourceType(), to: t.ViewType()}
	if m.from != m.to && (!convert.Floating(m.from) || !convert.Floating(m.to)) {
		return nil, fmt.Errorf("layout: %s: cannot convert %s to %s", t.Name, m.from, m.to)
	}
	es, out := int64(m.from.Size()), int64(m.to.Size())
	for _, p := range t.Pieces {
		g, err := gs.of(p.Source)
		if err != nil {
			return nil, err
		}
		b, err := box.New(p.Source.Shape, es, box.Box{Offsets: p.Offsets, Sizes: p.Sizes})
		if err != nil {
			return nil, fmt.Errorf("layout: %s: %w", t.Name, err)
		}
		mp := mappedPiece{src: g, box: b, rows: p.Rows, start: m.bytes}
		if len(p.Rows) > 0 {
			mp.rowLen = b.Bytes() / int64(len(p.Rows))
		}
		m.bytes += p.Elements() * out
		mp.end = m.bytes
		m.pieces = append(m.pieces, mp)
	}
	return m, nil
}

func (m *mapped) dtype() safetensors.DType { return m.to }
func (m *mapped) shape() []int64           { return m.t.Shape }
func (m *mapped) size() int64              { return m.bytes }

func (m *mapped) origin() Origin {
	o := Origin{Transform: m.t.Transform}
	seen := map[string]bool{}
	for _, p := range m.t.Pieces {
		if !seen[p.Source.Name] {
			seen[p.Source.Name] = true
			o.Sources = append(o.Sources, p.Source.Name)
		}
	}
	if m.from != m.to {
		if o.Transform != "" {
			o.Transform += ", "
		}
		o.Transform += fmt.Sprintf("%s to %s", m.from, m.to)
	}
	return o
}

func (m *mapped) backing(s *sourceSet) {
	for i, p := range m.t.Pieces {
		s.box(m.pieces[i].src, p.Offsets, p.Sizes)
	}
}

// plan adds the reads of view bytes from pos: for each piece in the
// window, its source bytes, converted once read when the types differ.
func (m *mapped) plan(p *readPlan, dst []byte, pos int64) error {
	end := pos + int64(len(dst))
	if pos < 0 || end > m.bytes {
		return fmt.Errorf("layout: tensor %q: range [%d, %d) outside %d bytes", m.t.Name, pos, end, m.bytes)
	}
	for i := range m.pieces {
		mp := &m.pieces[i]
		if mp.end <= pos || mp.start >= end {
			continue
		}
		a, b := max(pos, mp.start)-mp.start, min(end, mp.end)-mp.start
		out := dst[mp.start+a-pos : mp.start+b-pos]
		if m.from == m.to {
			if err := mp.plan(p, out, a); err != nil {
				return err
			}
			continue
		}
		if err := m.planConverted(p, mp, out, a, b); err != nil {
			return err
		}
	}
	return nil
}

// planConverted fills out with the piece's view bytes [a, b): the source
// elements that cover them are read into scratch and converted.
func (m *mapped) planConverted(p *readPlan, mp *mappedPiece, out []byte, a, b int64) error {
	in, size := int64(m.from.Size()), int64(m.to.Size())
	e0, e1 := a/size, (b+size-1)/size
	src, conv := p.buf((e1-e0)*in), p.buf((e1-e0)*size)
	if err := mp.plan(p, src, e0*in); err != nil {
		return err
	}
	p.then(func() error {
		if err := convert.Convert(conv, m.to, src, m.from); err != nil {
			return fmt.Errorf("layout: tensor %q: %w", m.t.Name, err)
		}
		copy(out, conv[a-e0*size:])
		return nil
	})
	return nil
}

// plan adds the reads of the piece's source bytes from pos (in the piece's
// own C order, rows permuted) into dst: one extent per permuted row, which
// the plan merges with its neighbours in the source.
func (mp *mappedPiece) plan(p *readPlan, dst []byte, pos int64) error {
	if mp.rows == nil || len(dst) == 0 {
		return mp.spans(p, dst, pos)
	}
	var err error
	mp.eachRow(pos, pos+int64(len(dst)), func(at, from, n int64) {
		if err == nil {
			err = mp.spans(p, dst[at-pos:at-pos+n], from)
		}
	})
	return err
}

// eachRow calls f for each permuted row in the piece's bytes [pos, end):
// where it lands (at), where its bytes start in the box (from), how many.
func (mp *mappedPiece) eachRow(pos, end int64, f func(at, from, n int64)) {
	for off := pos; off < end; {
		r, within := off/mp.rowLen, off%mp.rowLen
		n := min(mp.rowLen-within, end-off)
		f(off, mp.rows[r]*mp.rowLen+within, n)
		off += n
	}
}

// spans adds the reads of the box bytes [l0, l0+len(dst)) of the source
// tensor: its tensor's reads for each contiguous span.
func (mp *mappedPiece) spans(p *readPlan, dst []byte, l0 int64) error {
	return mp.box.Spans(l0, l0+int64(len(dst)), func(at, local, n int64) error {
		return mp.src.plan(p, dst[local-l0:local-l0+n], at)
	})
}

// castTo converts every floating tensor to the type to on read; other
// tensors (integers, bool) stay as they are.
func castTo(ts []viewTensor, to safetensors.DType) ([]viewTensor, error) {
	gs := geometries{}
	out := make([]viewTensor, len(ts))
	for i, t := range ts {
		out[i] = t
		if !convert.Floating(t.content.dtype()) || t.content.dtype() == to {
			continue
		}
		var mt *mapping.Tensor
		switch c := t.content.(type) {
		case *geometry:
			mt = &mapping.Tensor{Name: t.name, Shape: c.tensor.Shape, Pieces: []mapping.Piece{mapping.Whole(c.tensor)}}
		case *mapped:
			copied := *c.t
			mt = &copied
		default:
			return nil, fmt.Errorf("layout: %s: cannot convert %T", t.name, c)
		}
		mt.DType = to
		m, err := newMapped(mt, gs)
		if err != nil {
			return nil, err
		}
		out[i].content = m
	}
	return out, nil
}
