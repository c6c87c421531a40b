package main

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/pflag"

	"github.com/ckptfs/ckptfs/cache"
)

// limit is the range of a numeric flag, inclusive. Values outside it are
// refused before anything is built from them: a cache or queue sized by a
// hostile value takes the memory it asks for, or never answers a read.
type limit struct {
	min, max int64
	kind     limitKind
	note     string // a further bound, for --help
}

type limitKind int

const (
	sizeLimit limitKind = iota // a byteSize, in bytes
	intLimit
	durationLimit // nanoseconds
)

// limits has every numeric flag of every command (source.go's too), by name.
// TestEveryNumericFlagHasALimit keeps it complete.
var limits = map[string]limit{
	"cache-size":      {1 << 20, 16 << 40, sizeLimit, fmt.Sprintf("at most %d blocks of --block-size", cache.MaxBlocks)},
	"metadata-budget": {16 << 20, 1 << 40, sizeLimit, ""},
	"block-size":      {4 << 10, 64 << 20, sizeLimit, ""},
	"prefetch":        {0, cache.MaxReadAhead, intLimit, ""},
	"read-ahead":      {0, 1 << 30, sizeLimit, ""},
	"max-shard-size":  {1 << 10, 1 << 50, sizeLimit, ""},
	"cache-dir-size":  {64 << 20, 1 << 50, sizeLimit, ""},
	"max-attempts":    {1, 100, intLimit, ""},
	"read-timeout":    {int64(time.Second), int64(time.Hour), durationLimit, ""},
	"min-rate":        {1 << 10, 1 << 30, sizeLimit, ""},
	"world-size":      {1, 1 << 16, intLimit, ""},
	"workers":         {1, 256, intLimit, ""},
}

// documentLimits appends each limited flag's range to its --help text.
func documentLimits(fs *pflag.FlagSet) {
	fs.VisitAll(func(f *pflag.Flag) {
		if l, ok := limits[f.Name]; ok {
			if l.note != "" {
				f.Usage += " (range " + l.String() + "; " + l.note + ")"
			} else {
				f.Usage += " (range " + l.String() + ")"
			}
		}
	})
}

// checkLimits is the one check of numeric flags, run once the flags and -o
// options are parsed and before anything is built from them.
func checkLimits(fs *pflag.FlagSet) error {
	var err error
	fs.VisitAll(func(f *pflag.Flag) {
		l, ok := limits[f.Name]
		if !ok || err != nil {
			return
		}
		if n := l.value(f); n < l.min || n > l.max {
			err = &usageError{fmt.Errorf("--%s %s out of range %s", f.Name, l.format(n), l)}
		}
	})
	if err != nil {
		return err
	}
	// The cache's blocks are what ristretto counts: a small block in a big
	// cache is many of them (s3:// mounts pick larger blocks: fewer).
	if c, b := fs.Lookup("cache-size"), fs.Lookup("block-size"); c != nil && b != nil {
		size, block := c.Value.(*byteSize).Int64(), b.Value.(*byteSize).Int64()
		if size/block > cache.MaxBlocks {
			return &usageError{fmt.Errorf("--cache-size %s is %d blocks of --block-size %s: at most %d",
				formatByteSize(size), size/block, formatByteSize(block), cache.MaxBlocks)}
		}
	}
	return nil
}

// overflowError turns a flag value too large to parse (2^63, 99999999EiB)
// into the out-of-range error of its flag, or returns nil.
func overflowError(err error) error {
	var inv *pflag.InvalidValueError
	if !errors.As(err, &inv) || !errors.Is(err, strconv.ErrRange) {
		return nil
	}
	name := inv.GetFlag().Name
	l, ok := limits[name]
	if !ok {
		return nil
	}
	return &usageError{fmt.Errorf("--%s %s out of range %s", name, inv.GetValue(), l)}
}

// value reads the flag's value in the limit's unit.
func (l limit) value(f *pflag.Flag) int64 {
	switch l.kind {
	case sizeLimit:
		return f.Value.(*byteSize).Int64()
	case durationLimit:
		d, _ := time.ParseDuration(f.Value.String())
		return int64(d)
	}
	n, _ := strconv.ParseInt(f.Value.String(), 0, 64)
	return n
}

func (l limit) format(n int64) string {
	switch l.kind {
	case sizeLimit:
		return formatByteSize(n)
	case durationLimit:
		// "1h", not "1h0m0s"
		d := time.Duration(n).String()
		if strings.HasSuffix(d, "m0s") {
			d = strings.TrimSuffix(d, "0s")
		}
		if strings.HasSuffix(d, "h0m") {
			d = strings.TrimSuffix(d, "0m")
		}
		return d
	}
	return strconv.FormatInt(n, 10)
}

// String is the range as --help and errors print it: "[4 KiB, 64 MiB]".
func (l limit) String() string {
	if l.kind == sizeLimit {
		return "[" + exactSize(l.min) + ", " + exactSize(l.max) + "]"
	}
	return "[" + l.format(l.min) + ", " + l.format(l.max) + "]"
}

// exactSize prints n in the largest binary unit that divides it: "64 MiB".
func exactSize(n int64) string {
	units := []string{"B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"}
	i := 0
	for ; i < len(units)-1 && n != 0 && n%1024 == 0; i++ {
		n /= 1024
	}
	return strconv.FormatInt(n, 10) + " " + units[i]
}
