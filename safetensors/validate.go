package safetensors

import (
	"math"
	"unicode/utf8"
)

// Validate checks h against the loader rules of the Rust safetensors crate
// (read_metadata and Metadata::validate, used by Python's safe_open) for a
// file of fileSize bytes. ReadHeader calls it; call it yourself on a Header
// you built. The rules:
//
//   - DataStart is 8 plus a header length of at most MaxHeaderSize.
//   - Tensor names are unique, valid UTF-8, and not "__metadata__";
//     Metadata keys and values are valid UTF-8.
//   - Each entry has a known dtype and no negative shape dimension; a 0-rank
//     scalar (empty shape) and zero-size tensors (a 0 dimension) are allowed.
//   - Tensors are in data order: the first begins at 0, each next begins
//     where the previous ends (no holes, no overlaps), and Begin <= End. This
//     is the crate's rule after it sorts entries by (begin, end), which
//     ReadHeader does too.
//   - Each entry's End-Begin equals prod(shape)*bits/8, computed with
//     overflow checks, and prod(shape)*bits is a multiple of 8.
//   - DataStart plus the last End equals fileSize exactly: no trailing bytes.
//
// The JSON-level rules (a header that starts with '{', is right-padded with
// spaces only, and has no duplicate keys; an entry with exactly dtype, shape
// and data_offsets; string-only __metadata__) are checked by ReadHeader,
// since a Header no longer holds the JSON. Every error is a *HeaderError.
func (h *Header) Validate(fileSize int64) error {
	return h.validate(fileSize, false)
}

// validate is Validate; namesUnique skips the duplicate-name check where the
// caller has made it.
func (h *Header) validate(fileSize int64, namesUnique bool) error {
	if h.DataStart < 8 || h.DataStart-8 > MaxHeaderSize {
		return headerErr("data start %d is not 8 plus a header length of at most %d", h.DataStart, MaxHeaderSize)
	}
	if err := validateMetadata(h.Metadata); err != nil {
		return err
	}
	end, err := validateTensors(h.Tensors, namesUnique)
	if err != nil {
		return err
	}
	if h.DataStart > math.MaxInt64-end || h.DataStart+end != fileSize {
		return headerErr("data buffer ends at %d (data start %d + last end %d) but the file is %d bytes",
			uint64(h.DataStart)+uint64(end), h.DataStart, end, fileSize)
	}
	return nil
}

func validateMetadata(m map[string]string) error {
	for k, v := range m {
		if !utf8.ValidString(k) {
			return headerErr("%s key %q is not valid UTF-8", metadataKey, k)
		}
		if !utf8.ValidString(v) {
			return headerErr("%s key %q: value is not valid UTF-8", metadataKey, k)
		}
	}
	return nil
}

// validateTensors checks the per-entry rules and contiguity in slice order,
// and returns the end of the data buffer.
func validateTensors(tensors []TensorInfo, namesUnique bool) (int64, error) {
	var seen map[string]bool
	if !namesUnique {
		seen = make(map[string]bool, len(tensors))
	}
	var end int64
	for _, t := range tensors {
		switch {
		case t.Name == metadataKey:
			return 0, tensorErr(t.Name, "name is reserved for the metadata")
		case !utf8.ValidString(t.Name):
			return 0, tensorErr(t.Name, "name is not valid UTF-8")
		case seen[t.Name]:
			return 0, tensorErr(t.Name, "duplicate tensor name")
		}
		if seen != nil {
			seen[t.Name] = true
		}
		if !t.DType.Known() {
			return 0, tensorErr(t.Name, "unknown dtype %q", string(t.DType))
		}
		for i, d := range t.Shape {
			if d < 0 {
				return 0, tensorErr(t.Name, "shape %s has negative dimension at index %d", fmtShape(t.Shape), i)
			}
		}
		switch {
		case t.Begin < 0:
			return 0, tensorErr(t.Name, "data_offsets [%d,%d] are negative", t.Begin, t.End)
		case t.Begin > t.End:
			return 0, tensorErr(t.Name, "data_offsets [%d,%d] end before they begin", t.Begin, t.End)
		case t.Begin > end:
			return 0, tensorErr(t.Name, "data_offsets [%d,%d] leave a hole: previous data ends at %d", t.Begin, t.End, end)
		case t.Begin < end:
			return 0, tensorErr(t.Name, "data_offsets [%d,%d] overlap: previous data ends at %d", t.Begin, t.End, end)
		}
		n, err := ByteSize(t.DType, t.Shape)
		if err != nil {
			return 0, tensorErr(t.Name, "%v", err)
		}
		if t.End-t.Begin != n {
			return 0, tensorErr(t.Name, "data_offsets [%d,%d] hold %d bytes, shape %s %s needs %d",
				t.Begin, t.End, t.End-t.Begin, fmtShape(t.Shape), t.DType, n)
		}
		end = t.End
	}
	return end, nil
}
