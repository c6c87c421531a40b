// Package stwrite writes safetensors files as the reference writer lays
// them out, for tests and fixtures: a streaming Writer (header first, then
// the data buffer) and SortForWrite, the reference tensor order. The product
// never writes a safetensors file whole; it encodes headers with
// safetensors.EncodeHeader.
package stwrite

import (
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"

	"github.com/ckptfs/ckptfs/safetensors"
)

var (
	// ErrWriteTooLong is returned by Writer.Write when more data bytes are
	// written than the header declares.
	ErrWriteTooLong = errors.New("stwrite: write too long")
	// ErrShortData is wrapped by Writer.Close when fewer data bytes were
	// written than the header declares.
	ErrShortData = errors.New("stwrite: fewer data bytes than the header declares")
	// ErrWriterClosed is returned by Writer.Write after Close.
	ErrWriterClosed = errors.New("stwrite: write to closed Writer")
)

// Writer streams a safetensors file: header first, then each tensor's bytes
// in header order. It does not close the underlying writer.
type Writer struct {
	w         io.Writer
	remaining int64 // data bytes still to write
	err       error // sticky error from w
	closed    bool
	closeErr  error // what Close returned
}

// NewWriter encodes the header for metadata and tensors (see safetensors.EncodeHeader)
// and writes it to w immediately. The caller then writes the data buffer,
// whose length is the last tensor's End, and calls Close.
func NewWriter(w io.Writer, metadata map[string]string, tensors []safetensors.TensorInfo) (*Writer, error) {
	hdr, err := safetensors.EncodeHeader(metadata, tensors)
	if err != nil {
		return nil, err
	}
	if _, err := w.Write(hdr); err != nil {
		return nil, fmt.Errorf("stwrite: writing header: %w", err)
	}
	var size int64
	if len(tensors) > 0 {
		size = tensors[len(tensors)-1].End
	}
	return &Writer{w: w, remaining: size}, nil
}

// Remaining is the number of data bytes still to be written.
func (w *Writer) Remaining() int64 { return w.remaining }

// Write writes data bytes, in header order. Past the declared data size it
// writes what fits and returns ErrWriteTooLong.
func (w *Writer) Write(p []byte) (int, error) {
	if w.closed {
		return 0, ErrWriterClosed
	}
	if w.err != nil {
		return 0, w.err
	}
	tooLong := int64(len(p)) > w.remaining
	if tooLong {
		p = p[:w.remaining]
	}
	n, err := w.w.Write(p)
	w.remaining -= int64(n)
	if err != nil {
		w.err = err
		return n, err
	}
	if tooLong {
		return n, ErrWriteTooLong
	}
	return n, nil
}

// Close checks that the whole data buffer was written. It returns an error
// wrapping ErrShortData if fewer bytes were written than declared, or the
// first error from the underlying writer. Later calls return the same.
func (w *Writer) Close() error {
	if w.closed {
		return w.closeErr
	}
	w.closed = true
	switch {
	case w.err != nil:
		w.closeErr = w.err
	case w.remaining > 0:
		w.closeErr = fmt.Errorf("%w: %d bytes missing", ErrShortData, w.remaining)
	}
	return w.closeErr
}

// SortForWrite sorts tensors in place into the order the reference writer
// (Rust serialize, Python save_file) lays them out: by descending dtype
// alignment rank, then by name. Follow it with safetensors.Layout to get a file whose
// header safetensors.EncodeHeader writes byte for byte as Python would (given at most one
// metadata key: the reference writes metadata in hash-map order).
func SortForWrite(tensors []safetensors.TensorInfo) {
	slices.SortStableFunc(tensors, func(a, b safetensors.TensorInfo) int {
		if c := rank(b.DType) - rank(a.DType); c != 0 {
			return c
		}
		return strings.Compare(a.Name, b.Name)
	})
}

// refOrder lists the dtypes in the order of the reference crate's Dtype enum
// ("increasing alignment"); its writer lays tensors out by descending rank.
// Checked against safetensors 0.8.0 (see TestSortForWrite).
var refOrder = []safetensors.DType{
	safetensors.BOOL, safetensors.F4, safetensors.F6_E2M3, safetensors.F6_E3M2, safetensors.U8, safetensors.I8, safetensors.F8_E5M2, safetensors.F8_E4M3, safetensors.F8_E8M0, safetensors.F8_E4M3FNUZ, safetensors.F8_E5M2FNUZ,
	safetensors.I16, safetensors.U16, safetensors.F16, safetensors.BF16, safetensors.I32, safetensors.U32, safetensors.F32, safetensors.C64, safetensors.F64, safetensors.I64, safetensors.U64,
}

var refRank = func() map[safetensors.DType]int {
	m := make(map[safetensors.DType]int, len(refOrder))
	for i, d := range refOrder {
		m[d] = i + 1
	}
	return m
}()

// rank is d's position in the reference crate's Dtype enum, from 1; 0 for an
// unknown dtype.
func rank(d safetensors.DType) int { return refRank[d] }
