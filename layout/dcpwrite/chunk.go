package dcpwrite

// Cutting a chunk out of a tensor: its box copied from the source into a
// torch.save record, with one ReadAt per buffer-full, never one per run.

import (
	"errors"
	"fmt"
	"io"

	"github.com/ckptfs/ckptfs/layout/box"
	"github.com/ckptfs/ckptfs/layout/source"
	"github.com/ckptfs/ckptfs/layout/torchdcp"
)

// writeChunk writes one chunk of a tensor whose bytes start at base in src
// as a torch.save record. It waits for the source a buffer-full at a time,
// so that the chunk of a file being written is written as it arrives and
// little is left when the file is closed.
func writeChunk(w torchdcp.PosWriter, src Source, base int64, p *planned, c RankChunk, buf []byte) error {
	rec, err := torchdcp.NewRecordWriter(w, p.torch, p.es, c.Sizes)
	if err != nil {
		return err
	}
	if err := copyBox(rec, src, base, p.info.Shape, c.Offsets, c.Sizes, p.es, buf); err != nil {
		return err
	}
	return rec.Close()
}

// copyBox writes the box (offsets, sizes) of a C-order tensor of the given
// shape and element size, stored at base in src, to w in C order. The box
// is a sequence of equal runs that are contiguous in the source (one run
// for a dim-0 box, one per row for a dim-1 box of a matrix); runs are
// gathered with one ReadAt per buffer-full of source span, never one per
// run.
func copyBox(w io.Writer, src Source, base int64, shape, offsets, sizes []int64, es int64, buf []byte) error {
	g, err := box.New(shape, es, box.Box{Offsets: offsets, Sizes: sizes})
	if err != nil || g.Bytes() == 0 {
		return err
	}
	runLen, runs, bufLen := g.RunLen(), g.Runs(), int64(len(buf))
	for r := int64(0); r < runs; {
		first := g.RunStart(r)
		if runLen > bufLen {
			if err := copyRange(w, src, base+first, runLen, buf); err != nil {
				return err
			}
			r++
			continue
		}
		// Runs r..k-1: those whose span from first fits in buf.
		k := r + 1
		for k < runs && g.RunStart(k)+runLen-first <= bufLen {
			k++
		}
		if err := readFull(src, buf[:g.RunStart(k-1)+runLen-first], base+first); err != nil {
			return err
		}
		for i := r; i < k; i++ {
			at := g.RunStart(i) - first
			if _, err := w.Write(buf[at : at+runLen]); err != nil {
				return err
			}
		}
		r = k
	}
	return nil
}

// copyRange writes length bytes of src at off to w, a buffer at a time.
func copyRange(w io.Writer, src Source, off, length int64, buf []byte) error {
	for length > 0 {
		m := min(length, int64(len(buf)))
		if err := readFull(src, buf[:m], off); err != nil {
			return err
		}
		if _, err := w.Write(buf[:m]); err != nil {
			return err
		}
		off += m
		length -= m
	}
	return nil
}

// errShortSource is returned when the source ends before a chunk's bytes.
var errShortSource = errors.New("dcpwrite: source shorter than its header says")

// readFull reads p at off once the source holds it.
func readFull(src Source, p []byte, off int64) error {
	if err := src.Wait(off + int64(len(p))); err != nil {
		return err
	}
	err := source.ReadFullAt(src, p, off)
	if errors.Is(err, io.ErrUnexpectedEOF) {
		return fmt.Errorf("%w: %w", errShortSource, err)
	}
	return err
}
