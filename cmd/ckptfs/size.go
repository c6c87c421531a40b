package main

import (
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"

	"github.com/dustin/go-humanize"
)

// byteSize is a flag value like "5GB" (5e9), "512MiB" (512<<20) or
// "1048576", parsed by go-humanize. A bare K, M, G, T suffix is binary
// ("4M" = 4 MiB), as ckptfs has always read it and as dd does. Its range,
// 0 included or not, is in limits (checkLimits).
type byteSize struct{ n int64 }

// newByteSize returns a size flag of default n. zeroOK is no longer read:
// the flag's range in limits says whether 0 is allowed.
func newByteSize(n int64, zeroOK bool) *byteSize { return &byteSize{n: n} }

func (b *byteSize) Set(s string) error {
	n, err := parseByteSize(s)
	if err != nil {
		return err
	}
	b.n = n
	return nil
}

func (b *byteSize) String() string { return formatByteSize(b.n) }

func (b *byteSize) Type() string { return "size" }

func (b *byteSize) Int64() int64 { return b.n }

func parseByteSize(s string) (int64, error) {
	t := strings.TrimSpace(s)
	// "4M" means 4 MiB here, while humanize reads a bare "M" as 1e6.
	if i := strings.LastIndexAny(t, "0123456789. "); i >= 0 && len(t)-i == 2 && strings.ContainsAny(t[i+1:], "kKmMgGtTpPeE") {
		t += "i"
	}
	if rest, neg := strings.CutPrefix(t, "-"); neg {
		if _, err := humanize.ParseBytes(rest); err == nil {
			return 0, fmt.Errorf("invalid size %q: negative: %w", s, strconv.ErrRange)
		}
	}
	n, err := humanize.ParseBytes(t)
	if err == nil && n > math.MaxInt64 || err != nil && (errors.Is(err, strconv.ErrRange) || strings.HasPrefix(err.Error(), "too large")) {
		// Wraps ErrRange: the flag's out-of-range error (overflowError).
		return 0, fmt.Errorf("invalid size %q: %w", s, strconv.ErrRange)
	}
	if err != nil {
		return 0, fmt.Errorf("invalid size %q (want e.g. 5GB, 512MiB, 1048576)", s)
	}
	return int64(n), nil
}

// formatByteSize prints n the way a user would write it and parseByteSize
// reads it back exactly: "512 MiB", "5.0 GB", else the plain number.
func formatByteSize(n int64) string {
	for _, s := range []string{humanize.IBytes(uint64(n)), humanize.Bytes(uint64(n))} {
		if back, err := parseByteSize(s); err == nil && back == n {
			return s
		}
	}
	return strconv.FormatInt(n, 10)
}

// human prints a size for people (rounded): "1.5 GiB".
func human(n int64) string { return humanize.IBytes(uint64(max(n, 0))) }
