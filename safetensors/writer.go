package safetensors

import (
	"encoding/binary"
	"fmt"
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
// as serde_json does. With tensors in the reference writer's order (by
// descending dtype alignment, then by name) and at most one metadata key, the result is byte for byte what
// Python's save_file writes.
//
// The tensors must already satisfy the per-entry rules of Header.Validate in
// the given order (contiguous from 0, sizes matching shape and dtype, unique
// names); use Layout to assign offsets.
func EncodeHeader(metadata map[string]string, tensors []TensorInfo) ([]byte, error) {
	if err := validateMetadata(metadata); err != nil {
		return nil, err
	}
	if _, err := validateTensors(tensors, false); err != nil {
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
