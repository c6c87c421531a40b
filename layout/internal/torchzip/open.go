package torchzip

import (
	"archive/zip"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
)

// MaxEntries bounds the entries of one archive (one per storage).
const MaxEntries = 1 << 18

// eocdSearch is how far from the end the zip end record may be.
const eocdSearch = 22 + 1<<16

// NewReader reads the zip directory of a torch.save archive of size bytes.
// A file that is no zip is "not a torch.save zip archive"; a read that
// failed (a refused connection, EIO) is reported as itself, not as a format
// error that would send whoever reads the log looking at the file.
// zip.ErrInsecurePath is no error here: names are checked by the callers.
func NewReader(r io.ReaderAt, size int64) (*zip.Reader, error) {
	count, err := entryCount(r, size)
	if err != nil {
		return nil, directoryError(err)
	}
	if count > MaxEntries {
		return nil, fmt.Errorf("zip directory claims %d entries, more than the %d allowed", count, MaxEntries)
	}
	zr, err := zip.NewReader(r, size)
	if err == nil || errors.Is(err, zip.ErrInsecurePath) {
		return zr, nil
	}
	return nil, directoryError(err)
}

// directoryError words an error reading a zip directory: the file's fault
// (no zip, truncated) or the read's.
func directoryError(err error) error {
	switch {
	case errors.Is(err, zip.ErrFormat), errors.Is(err, zip.ErrAlgorithm), errors.Is(err, zip.ErrChecksum),
		errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF): // a directory past the end: truncated
		return fmt.Errorf("not a torch.save zip archive: %w", err)
	}
	return fmt.Errorf("reading the zip directory: %w", err)
}

// entryCount reads the number of entries the zip end record (or its zip64
// record) claims, so that a directory claiming millions is refused before
// anything is allocated for it.
func entryCount(r io.ReaderAt, size int64) (uint64, error) {
	// The end record is 22 bytes plus a comment torch never writes: look
	// in the last KiB first, as archive/zip does, then as far as a comment
	// can reach. (A DCP checkpoint opens one archive per chunk.)
	var buf []byte
	at := -1
	for _, window := range []int64{1024, eocdSearch} {
		n := min(size, window)
		buf = make([]byte, n)
		if _, err := r.ReadAt(buf, size-n); err != nil && err != io.EOF {
			return 0, err
		}
		for i := len(buf) - 22; i >= 0; i-- {
			if binary.LittleEndian.Uint32(buf[i:]) == 0x06054b50 {
				at = i
				break
			}
		}
		if at >= 0 || n == size {
			break
		}
	}
	if at < 0 {
		return 0, fmt.Errorf("%w: no end of central directory record", zip.ErrFormat)
	}
	count := uint64(binary.LittleEndian.Uint16(buf[at+10:]))
	if count != 0xffff || at < 20 || binary.LittleEndian.Uint32(buf[at-20:]) != 0x07064b50 {
		return count, nil
	}
	// zip64: the locator before the end record gives the zip64 end record.
	off := int64(binary.LittleEndian.Uint64(buf[at-20+8:]))
	if off < 0 || off > size-56 {
		return 0, fmt.Errorf("%w: zip64 end record at %d is outside the %d-byte file", zip.ErrFormat, off, size)
	}
	rec := make([]byte, 56)
	if _, err := r.ReadAt(rec, off); err != nil {
		return 0, err
	}
	if binary.LittleEndian.Uint32(rec) != 0x06064b50 {
		return 0, fmt.Errorf("%w: bad zip64 end of central directory record", zip.ErrFormat)
	}
	return binary.LittleEndian.Uint64(rec[32:]), nil
}
