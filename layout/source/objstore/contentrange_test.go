package objstore

import (
	"fmt"
	"testing"
)

// FuzzParseContentRange: any header parses without a panic; a well-formed
// one parses back to its numbers; anything else is the zero ContentRange
// or numbers it spells.
func FuzzParseContentRange(f *testing.F) {
	for _, s := range []string{"bytes 0-9/10", "bytes */10", "bytes 5-4/3", "", "bytes -1-2/3", "bytes 1-2/", "bytes 9223372036854775807-9223372036854775808/1"} {
		f.Add(s, int64(0), int64(9), int64(10))
	}
	f.Fuzz(func(t *testing.T, header string, first, last, size int64) {
		ParseContentRange(header)
		if first < 0 || last < 0 || size < 0 {
			return
		}
		want := ContentRange{first, last, size}
		if got := ParseContentRange(fmt.Sprintf("bytes %d-%d/%d", first, last, size)); got != want {
			t.Fatalf("got %+v, want %+v", got, want)
		}
	})
}
