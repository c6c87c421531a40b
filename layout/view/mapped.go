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

func (m *mapped) backing() []*ckpt.File {
	var out []*ckpt.File
	for _, p := range m.pieces {
		out = append(out, p.src.backing()...)
	}
	return out
}

// readAt fills dst with view bytes from pos: for each piece in the window,
// its source bytes, converted when the types differ.
func (m *mapped) readAt(dst []byte, pos int64) error {
	end := pos + int64(len(dst))
	if pos < 0 || end > m.bytes {
		return fmt.Errorf("layout: tensor %q: range [%d, %d) outside %d bytes", m.t.Name, pos, end, m.bytes)
	}
	for i := range m.pieces {
		p := &m.pieces[i]
		if p.end <= pos || p.start >= end {
			continue
		}
		a, b := max(pos, p.start)-p.start, min(end, p.end)-p.start
		out := dst[p.start+a-pos : p.start+b-pos]
		if m.from == m.to {
			if err := p.read(out, a); err != nil {
				return err
			}
			continue
		}
		if err := m.readConverted(p, out, a, b); err != nil {
			return err
		}
	}
	return nil
}

// readConverted fills out with the piece's view bytes [a, b): the source
// elements that cover them, converted.
func (m *mapped) readConverted(p *mappedPiece, out []byte, a, b int64) error {
	in, size := int64(m.from.Size()), int64(m.to.Size())
	e0, e1 := a/size, (b+size-1)/size
	src, conv := getBuf((e1-e0)*in), getBuf((e1-e0)*size)
	defer putBuf(src)
	defer putBuf(conv)
	if err := p.read(*src, e0*in); err != nil {
		return err
	}
	if err := convert.Convert(*conv, m.to, *src, m.from); err != nil {
		return fmt.Errorf("layout: tensor %q: %w", m.t.Name, err)
	}
	copy(out, (*conv)[a-e0*size:])
	return nil
}

// coalesceSlack is how many source bytes a permuted read may read beyond
// twice its own size to read its rows in one go (a window inside half a
// RoPE head covers every other row of the head's rows it touches).
var coalesceSlack int64 = 256 << 10 // a variable for tests

// read fills dst with the piece's source bytes from pos (in the piece's own
// C order, rows permuted). Permuted rows are read as the one source range
// that holds them all, when that is not much more than they are (a RoPE
// permutation keeps rows within their head), and copied out row by row;
// else one read per row.
func (p *mappedPiece) read(dst []byte, pos int64) error {
	if p.rows == nil || len(dst) == 0 {
		return p.spans(dst, pos)
	}
	end := pos + int64(len(dst))
	r0, r1 := pos/p.rowLen, (end+p.rowLen-1)/p.rowLen
	lo, hi := p.rows[r0], p.rows[r0]
	for _, r := range p.rows[r0:r1] {
		lo, hi = min(lo, r), max(hi, r)
	}
	if span := (hi - lo + 1) * p.rowLen; span <= 2*int64(len(dst))+coalesceSlack {
		bp := getBuf(span)
		defer putBuf(bp)
		if err := p.spans(*bp, lo*p.rowLen); err != nil {
			return err
		}
		p.eachRow(pos, end, func(at, from, n int64) { copy(dst[at-pos:at-pos+n], (*bp)[from-lo*p.rowLen:]) })
		return nil
	}
	var err error
	p.eachRow(pos, end, func(at, from, n int64) {
		if err == nil {
			err = p.spans(dst[at-pos:at-pos+n], from)
		}
	})
	return err
}

// eachRow calls f for each permuted row in the piece's bytes [pos, end):
// where it lands (at), where its bytes start in the box (from), how many.
func (p *mappedPiece) eachRow(pos, end int64, f func(at, from, n int64)) {
	for off := pos; off < end; {
		r, within := off/p.rowLen, off%p.rowLen
		n := min(p.rowLen-within, end-off)
		f(off, p.rows[r]*p.rowLen+within, n)
		off += n
	}
}

// spans reads the box bytes [l0, l0+len(dst)) from the source tensor: one
// gather per contiguous span.
func (p *mappedPiece) spans(dst []byte, l0 int64) error {
	return p.box.Spans(l0, l0+int64(len(dst)), func(at, local, n int64) error {
		return p.src.readAt(dst[local-l0:local-l0+n], at)
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
