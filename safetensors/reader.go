package safetensors

import (
	"encoding/binary"
	"fmt"
	"io"
	"slices"
	"sync"
)

const metadataKey = "__metadata__"

// ReadHeader reads the header of a safetensors file of size bytes: the 8-byte
// little-endian length N, then N bytes of JSON. It never reads the data
// buffer. The returned header has its tensors in data order and has passed
// Validate(size). Every format problem is a *HeaderError wrapping
// ErrInvalidHeader; I/O errors from r are returned wrapped, with context.
//
// Besides the rules of Validate, the JSON must: have N <= MaxHeaderSize and
// 8+N <= size; be valid UTF-8 with no unpaired \uD800-\uDFFF escapes; start
// with '{' and hold one object, followed only by spaces (0x20); have no
// duplicate key in the header, an entry or __metadata__; give each entry
// exactly "dtype" (a known DType string), "shape" (an array of integers) and
// "data_offsets" (two integers), integers being plain non-negative JSON
// integers below 2^63; and make __metadata__, if present, an object of
// strings.
//
// Where the Rust crate (0.8.0) is laxer, ReadHeader rejects what it accepts:
// a header not starting with '{', trailing tabs or newlines, duplicate
// tensor or metadata keys (serde keeps the last), unknown entry fields
// (serde ignores them), "__metadata__": null, and dimensions of 2^63 or more.
func ReadHeader(r io.ReaderAt, size int64) (*Header, error) {
	if size < 8 {
		return nil, &HeaderError{
			Reason: fmt.Sprintf("file is %d bytes, too short for the 8-byte header length", size),
			Err:    io.ErrUnexpectedEOF,
		}
	}
	sr := io.NewSectionReader(r, 0, size)
	var prefix [8]byte
	if _, err := io.ReadFull(sr, prefix[:]); err != nil {
		return nil, fmt.Errorf("safetensors: reading header length: %w", err)
	}
	n := binary.LittleEndian.Uint64(prefix[:])
	if n > MaxHeaderSize {
		return nil, &HeaderError{
			Reason: fmt.Sprintf("header length %d exceeds MaxHeaderSize %d", n, MaxHeaderSize),
			Err:    ErrHeaderTooLarge,
		}
	}
	if int64(n) > size-8 {
		return nil, &HeaderError{
			Reason: fmt.Sprintf("header length %d runs past the end of the %d-byte file", n, size),
			Err:    io.ErrUnexpectedEOF,
		}
	}
	sc := getScratch(int(n))
	defer putScratch(sc)
	if _, err := io.ReadFull(sr, sc.buf); err != nil {
		return nil, fmt.Errorf("safetensors: reading %d-byte header: %w", n, err)
	}
	h, err := parseHeader(sc.buf, &sc.tmp)
	if err != nil {
		return nil, err
	}
	h.DataStart = 8 + int64(n)
	// Data order, as the Rust crate sorts (by the (begin, end) pair); stable so
	// that zero-size entries at the same offset keep their JSON order. Writers
	// list entries in data order or by name; the check saves the sort.
	cmp := func(a, b TensorInfo) int {
		if c := cmpInt64(a.Begin, b.Begin); c != 0 {
			return c
		}
		return cmpInt64(a.End, b.End)
	}
	if !slices.IsSortedFunc(h.Tensors, cmp) {
		slices.SortStableFunc(h.Tensors, cmp)
		for i, t := range h.Tensors {
			h.index[t.Name] = i
		}
	}
	// The parser refused duplicate names and built the index.
	if err := h.validate(size, true); err != nil {
		return nil, err
	}
	return h, nil
}

// scratches recycles the buffers a header is read and unescaped into: a
// checkpoint of a thousand shards reads a thousand headers of ~0.1 MB, and
// nothing parsed refers to them (names and metadata are copied out).
// Larger buffers are not kept.
var scratches sync.Pool

type scratch struct{ buf, tmp []byte }

const maxPooledHeader = 1 << 20

func getScratch(n int) *scratch {
	sc, _ := scratches.Get().(*scratch)
	if sc == nil {
		sc = &scratch{}
	}
	if cap(sc.buf) < n {
		sc.buf = make([]byte, n)
	}
	sc.buf = sc.buf[:n]
	return sc
}

func putScratch(sc *scratch) {
	if cap(sc.buf) <= maxPooledHeader && cap(sc.tmp) <= maxPooledHeader {
		scratches.Put(sc)
	}
}

func cmpInt64(a, b int64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}
