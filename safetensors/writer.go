package safetensors

import (
	"encoding/binary"
	"fmt"
	"io"
	"slices"
	"strconv"
)

// EncodeHeader returns the 8-byte little-endian length prefix followed by the
// JSON header for tensors, padded with spaces so that the data buffer starts
// at a multiple of 8.
//
// The JSON is compact and deterministic: "__metadata__" first (keys sorted)
// when metadata is non-nil, then the tensors in the given order, each as
// {"dtype":"F32","shape":[2,3],"data_offsets":[0,24]}, with strings escaped
// as serde_json does. With tensors in the reference writer's order (see
// SortForWrite) and at most one metadata key, the result is byte for byte what
// Python's save_file writes.
//
// The tensors must already satisfy the per-entry rules of Header.Validate in
// the given order (contiguous from 0, sizes matching shape and dtype, unique
// names); use Layout to assign offsets.
func EncodeHeader(metadata map[string]string, tensors []TensorInfo) ([]byte, error) {
	if err := validateMetadata(metadata); err != nil {
		return nil, err
	}
	if _, err := validateTensors(tensors); err != nil {
		return nil, err
	}
	b := make([]byte, 8, 8+64*len(tensors)+16)
	b = append(b, '{')
	sep := false
	if metadata != nil {
		b = appendString(b, metadataKey)
		b = append(b, ':', '{')
		keys := make([]string, 0, len(metadata))
		for k := range metadata {
			keys = append(keys, k)
		}
		slices.Sort(keys)
		for i, k := range keys {
			if i > 0 {
				b = append(b, ',')
			}
			b = appendString(b, k)
			b = append(b, ':')
			b = appendString(b, metadata[k])
		}
		b = append(b, '}')
		sep = true
	}
	for _, t := range tensors {
		if sep {
			b = append(b, ',')
		}
		sep = true
		b = appendString(b, t.Name)
		b = append(b, `:{"dtype":`...)
		b = appendString(b, string(t.DType))
		b = append(b, `,"shape":`...)
		b = append(b, fmtShape(t.Shape)...)
		b = append(b, `,"data_offsets":[`...)
		b = strconv.AppendInt(b, t.Begin, 10)
		b = append(b, ',')
		b = strconv.AppendInt(b, t.End, 10)
		b = append(b, ']', '}')
	}
	b = append(b, '}')
	for len(b)%8 != 0 {
		b = append(b, ' ')
	}
	n := len(b) - 8
	if n > MaxHeaderSize {
		return nil, &HeaderError{
			Reason: fmt.Sprintf("header length %d exceeds MaxHeaderSize %d", n, MaxHeaderSize),
			Err:    ErrHeaderTooLarge,
		}
	}
	binary.LittleEndian.PutUint64(b[:8], uint64(n))
	return b, nil
}

// appendString appends s as a JSON string escaped like serde_json: '"', '\\'
// and control characters only; \b \t \n \f \r by name, the rest as \u00xx.
// s must be valid UTF-8.
func appendString(b []byte, s string) []byte {
	const hex = "0123456789abcdef"
	b = append(b, '"')
	start := 0
	for i := 0; i < len(s); i++ {
		c := s[i]
		var esc string
		switch c {
		case '"':
			esc = `\"`
		case '\\':
			esc = `\\`
		case '\b':
			esc = `\b`
		case '\t':
			esc = `\t`
		case '\n':
			esc = `\n`
		case '\f':
			esc = `\f`
		case '\r':
			esc = `\r`
		default:
			if c >= 0x20 {
				continue
			}
			esc = string([]byte{'\\', 'u', '0', '0', hex[c>>4], hex[c&0xf]})
		}
		b = append(b, s[start:i]...)
		b = append(b, esc...)
		start = i + 1
	}
	b = append(b, s[start:]...)
	return append(b, '"')
}

// Writer streams a safetensors file: header first, then each tensor's bytes
// in header order. It does not close the underlying writer.
type Writer struct {
	w         io.Writer
	remaining int64 // data bytes still to write
	err       error // sticky error from w
	closed    bool
	closeErr  error // what Close returned
}

// NewWriter encodes the header for metadata and tensors (see EncodeHeader)
// and writes it to w immediately. The caller then writes the data buffer,
// whose length is the last tensor's End, and calls Close.
func NewWriter(w io.Writer, metadata map[string]string, tensors []TensorInfo) (*Writer, error) {
	hdr, err := EncodeHeader(metadata, tensors)
	if err != nil {
		return nil, err
	}
	if _, err := w.Write(hdr); err != nil {
		return nil, fmt.Errorf("safetensors: writing header: %w", err)
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
