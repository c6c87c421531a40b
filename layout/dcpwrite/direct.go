package dcpwrite

import (
	"errors"
	"fmt"
	"os"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Shard files are written with O_DIRECT where the filesystem supports it.
// Their bytes then go from an aligned buffer to the disk, instead of being
// copied into the page cache and written back later: that copy (and the
// delayed allocation behind it) was about a third of the mount's CPU while
// cp wrote into it, and the fsync at the end finds nothing left to write.
// Nothing is lost by bypassing the cache: the shards are read again only
// when a view is read, long after.
//
// O_DIRECT needs the offset, the length and the memory of every write
// aligned. A shard is a stream of records written front to back, so a
// directFile keeps the unaligned end of what it was given (less than one
// alignment unit) and writes every whole unit through its worker's
// aligned staging buffer. Patches of bytes already written (a record's CRC, known
// once its data is written) and the last unaligned bytes are ordinary
// buffered writes, with O_DIRECT cleared on the descriptor for them.

// stagingSize is the size of a direct write: large enough that the disk,
// not the syscall rate, limits it.
const stagingSize = 1 << 20

// alignedBuffer returns a page-aligned buffer of n bytes.
func alignedBuffer(n int) []byte {
	page := os.Getpagesize()
	b := make([]byte, n+page)
	skip := (page - int(uintptr(unsafe.Pointer(&b[0]))%uintptr(page))) % page
	return b[skip : skip+n]
}

// shareStaging gives the direct files of one worker one staging buffer: a
// worker writes one file at a time, so memory stays a buffer per worker
// whatever the number of ranks.
func shareStaging(files map[int]*rankOut) {
	var buf []byte
	for _, o := range files {
		if d, ok := o.f.(*directFile); ok {
			if buf == nil {
				buf = alignedBuffer(stagingSize)
			}
			d.staging = buf
		}
	}
}

// directFile is a shard file written front to back with O_DIRECT.
type directFile struct {
	f      *os.File
	align  int    // of offsets and lengths: a multiple of the page size
	direct bool   // O_DIRECT is set on f
	base   int64  // file offset of tail[0]; a multiple of align while streaming
	tail   []byte // written to the file but not yet to disk; len < align
	// staging is where whole units are gathered for a direct write; shared
	// by the files of one worker (shareStaging), else allocated on first use.
	staging []byte
	ended   bool // the tail went to disk (Sync, Close): later writes are buffered
	refused bool // the filesystem refused a direct write: every write is buffered
}

// directOut returns f wrapped to write with O_DIRECT, or f itself when its
// filesystem does not support it.
func directOut(f *os.File) outFile {
	var st unix.Statx_t
	fd := int(f.Fd())
	if err := unix.Statx(fd, "", unix.AT_EMPTY_PATH, unix.STATX_DIOALIGN, &st); err != nil ||
		st.Mask&unix.STATX_DIOALIGN == 0 || st.Dio_offset_align == 0 {
		return f
	}
	page := os.Getpagesize()
	// Whole pages, so that a buffered patch never shares a page with a
	// later direct write.
	align := max(int(st.Dio_offset_align), int(st.Dio_mem_align), page)
	if align%page != 0 || align > stagingSize {
		return f
	}
	d := &directFile{f: f, align: align, tail: make([]byte, 0, align)}
	if d.setDirect(true) != nil {
		return f
	}
	return d
}

func (d *directFile) setDirect(on bool) error {
	if d.direct == on {
		return nil
	}
	fd := int(d.f.Fd())
	flags, err := unix.FcntlInt(uintptr(fd), unix.F_GETFL, 0)
	if err == nil {
		if on {
			flags |= unix.O_DIRECT
		} else {
			flags &^= unix.O_DIRECT
		}
		_, err = unix.FcntlInt(uintptr(fd), unix.F_SETFL, flags)
	}
	if err != nil {
		return fmt.Errorf("setting O_DIRECT: %w", err)
	}
	d.direct = on
	return nil
}

func (d *directFile) end() int64 { return d.base + int64(len(d.tail)) }

// Write appends p: whole alignment units go to disk now, the rest waits in
// the tail for the next write.
func (d *directFile) Write(p []byte) (int, error) {
	if d.ended {
		n, err := d.buffered(p, d.base)
		d.base += int64(n)
		return n, err
	}
	if len(d.tail)+len(p) < d.align {
		d.tail = append(d.tail, p...)
		return len(p), nil
	}
	if d.staging == nil {
		d.staging = alignedBuffer(stagingSize)
	}
	buf, done := d.staging, 0
	for len(d.tail)+len(p)-done >= d.align {
		n := copy(buf, d.tail)
		m := copy(buf[n:], p[done:])
		whole := (n + m) / d.align * d.align
		if err := d.writeDirect(buf[:whole], d.base); err != nil {
			return done, err
		}
		d.base += int64(whole)
		d.tail = append(d.tail[:0], buf[whole:n+m]...)
		done += m
	}
	d.tail = append(d.tail, p[done:]...)
	return len(p), nil
}

// writeDirect writes aligned bytes at an aligned offset. A filesystem that
// refuses the direct write (EINVAL, though statx promised it) gets it and
// everything after it buffered.
func (d *directFile) writeDirect(b []byte, off int64) error {
	if d.direct {
		_, err := d.f.WriteAt(b, off)
		if !errors.Is(err, unix.EINVAL) {
			return err
		}
		d.refused = true
	}
	_, err := d.buffered(b, off)
	return err
}

// buffered writes through the page cache.
func (d *directFile) buffered(b []byte, off int64) (int, error) {
	if err := d.setDirect(false); err != nil {
		return 0, err
	}
	return d.f.WriteAt(b, off)
}

// WriteAt patches bytes already written: in the tail, or on disk.
func (d *directFile) WriteAt(p []byte, off int64) (int, error) {
	if off < 0 || off+int64(len(p)) > d.end() {
		return 0, fmt.Errorf("dcpwrite: %s: patch of [%d, %d) past the end %d", d.f.Name(), off, off+int64(len(p)), d.end())
	}
	total := len(p)
	if in := max(d.base-off, 0); in < int64(len(p)) {
		copy(d.tail[off+in-d.base:], p[in:])
		p = p[:in]
	}
	if len(p) == 0 {
		return total, nil
	}
	if _, err := d.buffered(p, off); err != nil {
		return 0, err
	}
	if !d.ended && !d.refused {
		if err := d.setDirect(true); err != nil {
			return 0, err
		}
	}
	return total, nil
}

// flushTail ends the stream: the tail goes to disk, buffered.
func (d *directFile) flushTail() error {
	if d.ended {
		return nil
	}
	d.ended = true
	n, err := d.buffered(d.tail, d.base)
	d.base += int64(n)
	d.tail = d.tail[:0]
	return err
}

// Sync writes the tail and fsyncs: the data and the file's size are durable.
func (d *directFile) Sync() error {
	if err := d.flushTail(); err != nil {
		return err
	}
	return d.f.Sync()
}

// Close writes the tail, so that no byte written is lost, and closes.
func (d *directFile) Close() error {
	err := d.flushTail()
	if cerr := d.f.Close(); err == nil {
		err = cerr
	}
	return err
}
