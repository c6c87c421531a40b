// Package safetensors reads and writes the header of HuggingFace
// safetensors files.
//
// A safetensors file is an 8-byte little-endian header length N, N bytes of
// JSON header, then the data buffer. The header maps each tensor name to its
// dtype, shape and [begin, end) byte offsets relative to the data buffer, plus
// an optional "__metadata__" string-to-string map.
//
// The package is shaped like archive/zip: [ReadHeader] parses and validates
// a header from an [io.ReaderAt] without touching the data buffer, and
// [EncodeHeader] writes one deterministically (the data buffer follows it;
// whole files for tests come from internal/stwrite). Validation follows the Rust
// safetensors crate (read_metadata and Metadata::validate), which the Python
// safe_open uses, and is stricter where that crate is lax; see
// [Header.Validate].
package safetensors

import (
	"errors"
	"fmt"
	"io"
	"math"
	"strconv"
)

// MaxHeaderSize is the largest JSON header accepted, in bytes, as in the
// Rust crate (MAX_HEADER_SIZE).
const MaxHeaderSize = 100_000_000

var (
	// ErrInvalidHeader is wrapped by every error that reports a malformed or
	// inconsistent header (*HeaderError).
	ErrInvalidHeader = errors.New("safetensors: invalid header")
	// ErrHeaderTooLarge is wrapped, with ErrInvalidHeader, when the header
	// length exceeds MaxHeaderSize.
	ErrHeaderTooLarge = errors.New("safetensors: header too large")
)

// A HeaderError describes why a header is invalid. It wraps ErrInvalidHeader
// and, when set, Err.
type HeaderError struct {
	Tensor string // offending tensor name, if the problem is one tensor's
	Reason string // the broken rule in words, starting with `tensor "name": ` when there is one
	Err    error  // underlying cause (ErrHeaderTooLarge, io.ErrUnexpectedEOF, a JSON error); may be nil
}

func (e *HeaderError) Error() string { return ErrInvalidHeader.Error() + ": " + e.Reason }

// Unwrap returns ErrInvalidHeader and Err.
func (e *HeaderError) Unwrap() []error {
	if e.Err == nil {
		return []error{ErrInvalidHeader}
	}
	return []error{ErrInvalidHeader, e.Err}
}

func headerErr(format string, args ...any) error {
	return &HeaderError{Reason: fmt.Sprintf(format, args...)}
}

func tensorErr(name, format string, args ...any) error {
	return &HeaderError{Tensor: name, Reason: fmt.Sprintf("tensor %q: ", name) + fmt.Sprintf(format, args...)}
}

// TensorInfo is one header entry. Begin/End are offsets relative to the data
// buffer (End exclusive). Shape is empty, not nil, for a 0-rank scalar when
// read from a header.
type TensorInfo struct {
	Name  string
	DType DType
	Shape []int64
	Begin int64
	End   int64
}

// Size is the number of data bytes the entry covers, End-Begin.
func (t TensorInfo) Size() int64 { return t.End - t.Begin }

// Header is a parsed, validated header.
type Header struct {
	Metadata  map[string]string // __metadata__, nil if absent
	Tensors   []TensorInfo      // sorted by Begin (then End): data order
	DataStart int64             // 8 + header length: absolute offset of the data buffer

	index map[string]int // name -> index into Tensors; built by ReadHeader
}

// Lookup returns the entry named name.
func (h *Header) Lookup(name string) (TensorInfo, bool) {
	if i, ok := h.index[name]; ok && i < len(h.Tensors) && h.Tensors[i].Name == name {
		return h.Tensors[i], true
	}
	// No index, or Tensors was changed after ReadHeader: scan.
	for _, t := range h.Tensors {
		if t.Name == name {
			return t, true
		}
	}
	return TensorInfo{}, false
}

// Section returns a reader for t's bytes in the file r whose header h is.
func (h *Header) Section(r io.ReaderAt, t TensorInfo) *io.SectionReader {
	return io.NewSectionReader(r, h.DataStart+t.Begin, t.Size())
}

// DataSize is the number of data bytes the last entry ends at: the length of
// the data buffer of a valid file.
func (h *Header) DataSize() int64 {
	if len(h.Tensors) == 0 {
		return 0
	}
	return h.Tensors[len(h.Tensors)-1].End
}

// ByteSize returns the number of bytes a tensor of the given dtype and shape
// occupies: prod(shape) * bits / 8. It fails for an unknown dtype, a negative
// dimension, an overflow of int64 in any partial product (left to right, like
// the Rust crate's checked_mul fold), or a bit count that is not a whole
// number of bytes.
func ByteSize(dtype DType, shape []int64) (int64, error) {
	if !dtype.Known() {
		return 0, fmt.Errorf("unknown dtype %q", string(dtype))
	}
	numel := int64(1)
	for i, d := range shape {
		if d < 0 {
			return 0, fmt.Errorf("shape %s has negative dimension %d at index %d", fmtShape(shape), d, i)
		}
		if d != 0 && numel > math.MaxInt64/d {
			return 0, fmt.Errorf("shape %s: element count overflows int64", fmtShape(shape))
		}
		numel *= d
	}
	bits := int64(dtype.Bits())
	if numel > math.MaxInt64/bits {
		return 0, fmt.Errorf("shape %s %s: bit count overflows int64", fmtShape(shape), dtype)
	}
	nbits := numel * bits
	if nbits%8 != 0 {
		return 0, fmt.Errorf("shape %s %s holds %d bits, not a whole number of bytes", fmtShape(shape), dtype, nbits)
	}
	return nbits / 8, nil
}

// Layout returns a copy of tensors with Begin and End assigned contiguously
// from 0 in the given order, each sized from its Shape and DType. Shape
// slices are shared with the input. An entry whose size cannot be computed
// (see ByteSize) gets End == Begin; EncodeHeader then reports it.
func Layout(tensors []TensorInfo) []TensorInfo {
	if tensors == nil {
		return nil
	}
	out := make([]TensorInfo, len(tensors))
	var off int64
	for i, t := range tensors {
		n, err := ByteSize(t.DType, t.Shape)
		if err != nil || off > math.MaxInt64-n {
			n = 0
		}
		t.Begin, t.End = off, off+n
		off = t.End
		out[i] = t
	}
	return out
}

// fmtShape formats a shape like the JSON header does: [2,3].
func fmtShape(shape []int64) string {
	b := []byte{'['}
	for i, d := range shape {
		if i > 0 {
			b = append(b, ',')
		}
		b = strconv.AppendInt(b, d, 10)
	}
	return string(append(b, ']'))
}
