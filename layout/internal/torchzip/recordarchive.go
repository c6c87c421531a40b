package torchzip

import (
	"archive/zip"
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"strings"
)

// A DCP chunk record is a small torch.save archive, one per chunk, opened on
// every chunk's first read: through archive/zip that cost an end-record
// search buffer, a buffered reader and a File per entry (about 22 KB
// allocated and most of the CPU of locating a chunk; BENCHMARKS.md, run
// AA-records). OpenRecord reads the same structures straight out of the
// record's windows. It accepts less than archive/zip (no directory away from
// where the end record says, nothing between the directory's headers, a
// directory within a bound) and, what it accepts, reads as archive/zip does
// (FuzzOpenRecord compares them); the checks of Open follow, the same code.

// Zip record signatures and fixed lengths (APPNOTE.TXT 4.3).
const (
	sigLocal = 0x04034b50
	sigDir   = 0x02014b50
	sigEnd   = 0x06054b50
	sigEnd64 = 0x06064b50
	sigLoc64 = 0x07064b50
	sigDesc  = 0x08074b50

	localLen = 30
	dirLen   = 46
	endLen   = 22
	loc64Len = 20
	end64Len = 56
)

// maxRecordDir bounds a record's central directory (the directory is read
// whole; torch writes about 80 bytes per entry, a record holds a handful).
const maxRecordDir = 32 << 20

// RecordArchive is a torch.save archive opened by OpenRecord: valid until
// its Windows are released.
type RecordArchive struct {
	w       *Windows
	size    int64
	Prefix  string
	entries []RecordEntry
	small   [8]RecordEntry // entries' memory for a record's handful
}

// RecordEntry is an entry of a RecordArchive's directory.
type RecordEntry struct {
	name         []byte // the directory's bytes
	Flags        uint16
	Method       uint16
	CRC32        uint32
	Compressed   uint64
	Uncompressed uint64
	headerOffset int64
}

// Name is the entry's name.
func (e *RecordEntry) Name() string { return string(e.name) }

// OpenRecord reads and checks the directory of the torch.save archive that
// w windows (size bytes), as Open does.
func OpenRecord(w *Windows, size int64) (*RecordArchive, error) {
	if size < 0 {
		return nil, fmt.Errorf("archive of %d bytes", size)
	}
	a := &RecordArchive{w: w, size: size}
	a.entries = a.small[:0]
	if err := a.readDir(); err != nil {
		return nil, directoryError(err)
	}
	if len(a.entries) == 0 {
		return nil, errors.New("torch.save archive has no entries")
	}
	prefix, _, ok := strings.Cut(string(a.entries[0].name), "/")
	if !ok {
		return nil, fmt.Errorf("torch.save archive entry %q has no top-level folder", a.entries[0].name)
	}
	a.Prefix = prefix
	var c entryChecker
	for i := range a.entries {
		e := &a.entries[i]
		if err := c.add(e.name, e.Method, e.Compressed, e.Uncompressed, size, len(a.entries)); err != nil {
			return nil, err
		}
	}
	if bo, _ := a.Entry("byteorder"); bo != nil {
		b, err := a.ReadEntry(bo, 16)
		if err != nil {
			return nil, err
		}
		if string(b) != "little" {
			return nil, fmt.Errorf("byteorder %q is not supported", b)
		}
	}
	return a, nil
}

// readDir reads the end record (or its zip64 record) and the directory.
// Its errors wrap zip.ErrFormat or are the reads'.
func (a *RecordArchive) readDir() error {
	endOff, end, err := a.findEnd()
	if err != nil {
		return err
	}
	count := uint64(binary.LittleEndian.Uint16(end[10:]))
	dirSize := uint64(binary.LittleEndian.Uint32(end[12:]))
	dirOff := uint64(binary.LittleEndian.Uint32(end[16:]))
	// archive/zip's zip64 test, 0xffff for the directory's size included.
	if count == 0xffff || dirSize == 0xffff || dirOff == 0xffffffff {
		if endOff >= loc64Len {
			loc, err := a.w.bytes(endOff-loc64Len, loc64Len)
			if err != nil {
				return err
			}
			le := binary.LittleEndian
			if le.Uint32(loc) == sigLoc64 {
				// archive/zip ignores a locator of another disk; such
				// an archive is no torch.save record.
				if le.Uint32(loc[4:]) != 0 || le.Uint32(loc[16:]) != 1 {
					return formatError("zip64 locator of a multi-disk archive")
				}
				p := le.Uint64(loc[8:])
				if p > uint64(a.size) || uint64(a.size)-p < end64Len {
					return formatError("zip64 end record at %d is outside the %d-byte file", p, a.size)
				}
				rec, err := a.w.bytes(int64(p), end64Len)
				if err != nil {
					return err
				}
				if le.Uint32(rec) != sigEnd64 {
					return formatError("bad zip64 end of central directory record")
				}
				endOff = int64(p)
				count, dirSize, dirOff = le.Uint64(rec[32:]), le.Uint64(rec[40:]), le.Uint64(rec[48:])
			}
		}
	}
	if count > MaxEntries {
		return fmt.Errorf("zip directory claims %d entries, more than the %d allowed", count, MaxEntries)
	}
	// torch writes a zip64 end record and locator between the directory
	// and a 32-bit end record: archive/zip then finds the directory where
	// the end record says (its base offset 0), and so does this.
	if dirOff > uint64(endOff) || dirSize > uint64(endOff)-dirOff {
		return formatError("directory [%d, +%d) runs past the end record at %d", dirOff, dirSize, endOff)
	}
	if dirSize > maxRecordDir {
		return formatError("directory of %d bytes, more than the %d allowed for a record", dirSize, maxRecordDir)
	}
	if count > dirSize/dirLen {
		return formatError("directory of %d bytes cannot hold %d entries", dirSize, count)
	}
	dir, err := a.w.bytes(int64(dirOff), int64(dirSize))
	if err != nil {
		return err
	}
	for range count {
		n, err := a.readDirEntry(dir)
		if err != nil {
			return err
		}
		dir = dir[n:]
	}
	if len(dir) != 0 {
		return formatError("%d bytes after the directory's %d entries", len(dir), count)
	}
	// archive/zip reads directory headers for as long as there are: one
	// after the last would be an entry more to it.
	if next := int64(dirOff + dirSize); next <= a.size-4 {
		b, err := a.w.bytes(next, 4)
		if err != nil {
			return err
		}
		if binary.LittleEndian.Uint32(b) == sigDir {
			return formatError("a directory header after the directory's %d entries", count)
		}
	}
	return nil
}

// findEnd finds the end record as archive/zip does: in the last KiB, then
// as far back as a comment can reach; the comment must fit.
func (a *RecordArchive) findEnd() (int64, []byte, error) {
	for i, n := range []int64{1024, eocdSearch} {
		n = min(n, a.size)
		buf, err := a.w.bytes(a.size-n, n)
		if err != nil {
			return 0, nil, err
		}
		for p := len(buf) - endLen; p >= 0; p-- {
			if binary.LittleEndian.Uint32(buf[p:]) != sigEnd {
				continue
			}
			if int(binary.LittleEndian.Uint16(buf[p+endLen-2:]))+endLen+p > len(buf) {
				return 0, nil, formatError("the end record's comment is truncated")
			}
			return a.size - n + int64(p), buf[p : p+endLen], nil
		}
		if i == 1 || n == a.size {
			break
		}
	}
	return 0, nil, formatError("no end of central directory record")
}

// readDirEntry appends the directory header at the start of dir to a.entries
// and returns its length.
func (a *RecordArchive) readDirEntry(dir []byte) (int, error) {
	le := binary.LittleEndian
	if len(dir) < dirLen || le.Uint32(dir) != sigDir {
		return 0, formatError("bad directory header")
	}
	nameLen, extraLen, commentLen := int(le.Uint16(dir[28:])), int(le.Uint16(dir[30:])), int(le.Uint16(dir[32:]))
	n := dirLen + nameLen + extraLen + commentLen
	if len(dir) < n {
		return 0, formatError("directory header past the directory's end")
	}
	e := RecordEntry{
		name:         dir[dirLen : dirLen+nameLen],
		Flags:        le.Uint16(dir[8:]),
		Method:       le.Uint16(dir[10:]),
		CRC32:        le.Uint32(dir[16:]),
		Compressed:   uint64(le.Uint32(dir[20:])),
		Uncompressed: uint64(le.Uint32(dir[24:])),
		headerOffset: int64(le.Uint32(dir[42:])),
	}
	// The zip64 extra field, consulted for what is maxed out, in
	// archive/zip's order.
	needU, needC, needOff := e.Uncompressed == 0xffffffff, e.Compressed == 0xffffffff, e.headerOffset == 0xffffffff
	for extra := dir[dirLen+nameLen : dirLen+nameLen+extraLen]; len(extra) >= 4; {
		tag, size := le.Uint16(extra), int(le.Uint16(extra[2:]))
		extra = extra[4:]
		if len(extra) < size {
			break
		}
		field := extra[:size]
		extra = extra[size:]
		if tag != 0x0001 {
			continue
		}
		for _, need := range []struct {
			on *bool
			u  *uint64
			i  *int64
		}{{&needU, &e.Uncompressed, nil}, {&needC, &e.Compressed, nil}, {&needOff, nil, &e.headerOffset}} {
			if !*need.on {
				continue
			}
			*need.on = false
			if len(field) < 8 {
				return 0, formatError("short zip64 extra field")
			}
			if need.u != nil {
				*need.u = le.Uint64(field)
			} else {
				*need.i = int64(le.Uint64(field))
			}
			field = field[8:]
		}
	}
	if needC || needOff {
		return 0, formatError("entry %q: sizes or offset maxed out without a zip64 field", e.name)
	}
	a.entries = append(a.entries, e)
	return n, nil
}

// Entry returns the entry name under the archive's folder ("data.pkl",
// "data/0").
func (a *RecordArchive) Entry(name string) (*RecordEntry, error) {
	for i := range a.entries {
		e := &a.entries[i]
		n := e.name
		if len(n) == len(a.Prefix)+1+len(name) && string(n[:len(a.Prefix)]) == a.Prefix && n[len(a.Prefix)] == '/' && string(n[len(a.Prefix)+1:]) == name {
			return e, nil
		}
	}
	return nil, fmt.Errorf("torch.save archive has no %s/%s", a.Prefix, name)
}

// DataOffset is where e's bytes start: after its local header.
func (a *RecordArchive) DataOffset(e *RecordEntry) (int64, error) {
	if e.headerOffset < 0 || e.headerOffset > a.size-localLen {
		return 0, fmt.Errorf("local header at %d is outside the %d-byte archive", e.headerOffset, a.size)
	}
	h, err := a.w.bytes(e.headerOffset, localLen)
	if err != nil {
		return 0, err
	}
	if binary.LittleEndian.Uint32(h) != sigLocal {
		return 0, formatError("bad local file header")
	}
	return e.headerOffset + localLen + int64(binary.LittleEndian.Uint16(h[26:])) + int64(binary.LittleEndian.Uint16(h[28:])), nil
}

// ReadEntry reads a small stored entry whole, refusing one larger than
// limit, and checks its CRC32 (and its data descriptor's) as archive/zip
// does. The bytes may be the windows' own: valid until they are released,
// not to be written.
func (a *RecordArchive) ReadEntry(e *RecordEntry, limit int64) ([]byte, error) {
	if e.Uncompressed > uint64(limit) {
		return nil, fmt.Errorf("%s is %d bytes, more than the %d allowed", e.name, e.Uncompressed, limit)
	}
	if bytes.HasSuffix(e.name, []byte("/")) { // archive/zip reads a folder as nothing, or refuses it
		return nil, fmt.Errorf("%s is a folder", e.name)
	}
	b, err := a.readEntry(e)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", e.name, err)
	}
	return b, nil
}

func (a *RecordArchive) readEntry(e *RecordEntry) ([]byte, error) {
	off, err := a.DataOffset(e)
	if err != nil {
		return nil, err
	}
	n := int64(e.Uncompressed) // Open checked it stored, within the archive
	if off > a.size || n > a.size-off {
		return nil, errUnexpectedEOF
	}
	b, err := a.w.bytes(off, n)
	if err != nil {
		return nil, err
	}
	sum := crc32.ChecksumIEEE(b)
	if e.Flags&0x8 != 0 { // a data descriptor follows: its CRC32 must be the directory's
		// archive/zip reads it whole: 12 bytes, 16 with its signature.
		end := off + n
		if end > a.size-12 {
			return nil, errUnexpectedEOF
		}
		d, err := a.w.bytes(end, 12)
		if err != nil {
			return nil, err
		}
		if binary.LittleEndian.Uint32(d) == sigDesc {
			if end > a.size-16 {
				return nil, errUnexpectedEOF
			}
			if d, err = a.w.bytes(end+4, 12); err != nil {
				return nil, err
			}
		}
		if binary.LittleEndian.Uint32(d) != e.CRC32 || sum != e.CRC32 {
			return nil, errChecksum
		}
		return b, nil
	}
	if e.CRC32 != 0 && sum != e.CRC32 {
		return nil, errChecksum
	}
	return b, nil
}

var (
	errUnexpectedEOF = io.ErrUnexpectedEOF // archive/zip's word for an entry past the end
	errChecksum      = zip.ErrChecksum
)

// formatError is a record that is no zip, worded by directoryError.
func formatError(format string, args ...any) error {
	return fmt.Errorf("%w: "+format, append([]any{zip.ErrFormat}, args...)...)
}

// entryChecker is Open's check of each entry, for both ways in: each name
// once, stored uncompressed within the archive, the entries together no
// larger than it (so none can be read twice over: no overlapping or huge
// entries).
type entryChecker struct {
	total uint64
	seen  map[string]struct{}
	names [16][]byte // the first names, compared in place (a record's)
	n     int
}

// add checks an entry of an archive of size bytes and count entries.
func (c *entryChecker) add(name []byte, method uint16, csize, usize uint64, size int64, count int) error {
	if count <= len(c.names) {
		for _, p := range c.names[:c.n] {
			if bytes.Equal(p, name) {
				return fmt.Errorf("entry %s appears twice", name)
			}
		}
		c.names[c.n] = name
		c.n++
	} else {
		if c.seen == nil {
			c.seen = make(map[string]struct{}, count)
		}
		if _, dup := c.seen[string(name)]; dup {
			return fmt.Errorf("entry %s appears twice", name)
		}
		c.seen[string(name)] = struct{}{}
	}
	if method != zip.Store {
		return fmt.Errorf("entry %s is compressed (method %d): torch.save stores records uncompressed, and only those can be read in place", name, method)
	}
	if csize != usize || usize > uint64(size) {
		return fmt.Errorf("entry %s: sizes %d/%d past end of file (%d bytes)", name, csize, usize, size)
	}
	c.total += usize
	if c.total > uint64(size) {
		return fmt.Errorf("entries claim more than the archive's %d bytes (overlapping or huge entries, up to %s)", size, name)
	}
	return nil
}
