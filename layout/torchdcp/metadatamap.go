package torchdcp

import (
	"errors"
	"fmt"
	"os"
	"runtime/debug"
	"sync"

	"golang.org/x/sys/unix"

	"github.com/ckptfs/ckptfs/internal/memlimit"
	"github.com/ckptfs/ckptfs/layout/source"
)

// A .metadata of a large checkpoint is hundreds of MB. Read into the heap
// it is as large as everything decoded from it, and the collector lets the
// heap grow to twice that; a local file is mapped instead (its pages are
// the page cache's), and unmapped once decoded: nothing decoded points
// into it (the pickle VM copies every string and bytes value). While it is
// mapped, a mount's Go memory limit is lower by its size (memlimit).

// errTruncated is a mapped .metadata that shrank while it was decoded.
var errTruncated = fmt.Errorf("%w: it shrank while it was read", source.ErrChanged)

// withMetadata calls decode with the bytes of dir's .metadata (at most
// limit), mapped when the source is a local file; then release (else nil)
// drops the pages of b[lo:hi] from the process (pickle.Options.Release).
func withMetadata(dir source.Tree, limit int64, decode func(b []byte, release func(lo, hi int)) error) error {
	f, err := dir.Open(MetadataFile)
	if err != nil {
		return fmt.Errorf("torchdcp: %w", err)
	}
	defer f.Close()
	size := f.Info().Size
	if size > limit {
		return fmt.Errorf("torchdcp: %w: %s is %d bytes (limit %d)", source.ErrTooLarge, dir.Path(MetadataFile), size, limit)
	}
	d, ok := f.(source.Descriptor)
	if !ok || size == 0 {
		b, err := source.ReadFile(dir, MetadataFile, limit)
		if err != nil {
			return fmt.Errorf("torchdcp: %w", err)
		}
		return decode(b, nil)
	}
	b, err := unix.Mmap(int(d.Fd()), 0, int(size), unix.PROT_READ, unix.MAP_SHARED)
	if err != nil {
		return fmt.Errorf("torchdcp: mapping %s: %w", dir.Path(MetadataFile), err)
	}
	defer unix.Munmap(b)
	// Its pages count in the process's memory as they are read: the Go
	// limit leaves room for them.
	held := memlimit.Outside(size)
	defer held.Release()
	// Once, as the window does not change: a later Hold of the same n
	// would return at once (memlimit sets the limit only where the count
	// changes, and only in a mount). A cost once blamed on a Hold at each
	// drop was not reproduced (BENCHMARKS.md, run AB-small).
	var once sync.Once
	dropped := func() { once.Do(func() { held.Hold(min(size, heldWindow)) }) }
	if err := decodeMapped(b, func(b []byte) error { return decode(b, releaser(b, dropped)) }); err != nil {
		if errors.Is(err, errTruncated) {
			return fmt.Errorf("torchdcp: %s: %w", dir.Path(MetadataFile), err)
		}
		return err
	}
	// Changed in place: what was decoded is not the file.
	if err := f.Check(); err != nil {
		return fmt.Errorf("torchdcp: %w", err)
	}
	return nil
}

// heldWindow bounds what of a mapped .metadata the decoder holds once it
// tells of the pages behind it (pickle.Options.Release): what it reads
// between two such calls, an 8 MiB part on each of up to 4 cores while it
// scans, then the VM's 8 MiB step and 1 MiB lag. (An opcode longer than
// that, a string of many MB, is held while it is read: the heap holds its
// copy too.)
const heldWindow = 48 << 20

// releaser drops pages of the mapping b once decoded: read, they count in
// the process's memory (a 300 MB .metadata on top of what was decoded from
// it); dropped, they stay in the page cache, and a page read again is a
// minor fault (or, if the file shrank meanwhile, the fault decodeMapped
// takes). An error leaves the pages where they are: it is advice. Then
// dropped (nil: none) is called.
func releaser(b []byte, dropped func()) func(lo, hi int) {
	pg := os.Getpagesize()
	return func(lo, hi int) {
		if lo, hi = pagesIn(lo, hi, len(b), pg); lo < hi {
			_ = unix.Madvise(b[lo:hi], unix.MADV_DONTNEED)
		}
		if dropped != nil {
			dropped()
		}
	}
}

// pagesIn is the whole pages of pg bytes in [lo, hi) of a mapping of n
// bytes (which starts at a page; its last page ends at n).
func pagesIn(lo, hi, n, pg int) (int, int) {
	lo = (lo + pg - 1) / pg * pg
	if hi < n {
		hi = hi / pg * pg
	}
	return lo, hi
}

// decodeMapped runs decode on mapped bytes: a page past the end of a file
// truncated meanwhile faults (SIGBUS), which is then this error, not the
// end of the process.
func decodeMapped(b []byte, decode func([]byte) error) (err error) {
	defer debug.SetPanicOnFault(debug.SetPanicOnFault(true))
	defer func() {
		if r := recover(); r != nil {
			if re, ok := r.(interface{ Addr() uintptr }); ok && re != nil {
				err = errTruncated
				return
			}
			panic(r)
		}
	}()
	return decode(b)
}
