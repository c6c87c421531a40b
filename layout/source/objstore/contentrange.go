package objstore

import (
	"errors"
	"strconv"
	"strings"
)

// ContentRange is a parsed Content-Range: "bytes FIRST-LAST/SIZE".
type ContentRange struct{ First, Last, Size int64 }

// ParseContentRange parses cr; anything else (an unknown size "*", no
// header at all) is the zero ContentRange, which no request asks for.
func ParseContentRange(cr string) ContentRange {
	var r ContentRange
	rest, ok := strings.CutPrefix(cr, "bytes ")
	first, rest, ok1 := strings.Cut(rest, "-")
	last, size, ok2 := strings.Cut(rest, "/")
	if !ok || !ok1 || !ok2 {
		return ContentRange{}
	}
	var err [3]error
	r.First, err[0] = strconv.ParseInt(first, 10, 64)
	r.Last, err[1] = strconv.ParseInt(last, 10, 64)
	r.Size, err[2] = strconv.ParseInt(size, 10, 64)
	if errors.Join(err[:]...) != nil {
		return ContentRange{}
	}
	return r
}
