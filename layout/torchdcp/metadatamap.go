package torchdcp

import (
	"errors"
	"fmt"
	"runtime/debug"

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
// limit), mapped when the source is a local file.
func withMetadata(dir source.Tree, limit int64, decode func([]byte) error) error {
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
		return decode(b)
	}
	b, err := unix.Mmap(int(d.Fd()), 0, int(size), unix.PROT_READ, unix.MAP_SHARED)
	if err != nil {
		return fmt.Errorf("torchdcp: mapping %s: %w", dir.Path(MetadataFile), err)
	}
	defer unix.Munmap(b)
	// Its pages count in the process's memory as they are read: the Go
	// limit leaves room for them.
	defer memlimit.Outside(size)()
	if err := decodeMapped(b, decode); err != nil {
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
