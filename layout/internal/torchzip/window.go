package torchzip

import (
	"io"
	"sync"
)

// Windows a record's zip structures are read through: a torch.save
// archive's local headers, data.pkl and byteorder sit at its head, its
// central directory and end record at its tail, each a few hundred bytes.
// Read through archive/zip they are a dozen small reads, each waiting on
// the disk when cold (BENCHMARKS.md, run Z-records); read as two windows
// they are two reads, and one for an archive no larger than both. A
// record's structures take about a kilobyte at each end; the windows are
// small enough that an object store takes them as the small reads it serves
// from its own aligned windows and streams (objstore's smallRead, 16 KiB):
// as 64 KiB reads they started streams of their own and a cold read of a
// view cost 6 requests instead of 4 (e2e test_view_read_in_few_requests).
const (
	headWindow = 4 << 10
	tailWindow = 4 << 10
)

// Windowed returns a reader of r (size bytes) that reads the archive's head
// and tail windows each in one read, on the first read inside it, and
// serves reads inside them from memory; an archive no larger than both
// windows is one window. A read not inside a window goes to r as it is;
// one inside a window whose read failed gets that read's error, r's, not
// asked again (an object store's read that timed out is not waited for
// twice). Not safe for
// concurrent use: it is for one locating of one archive, after which
// Release hands its memory back (a DCP view locates a record per chunk).
func Windowed(r io.ReaderAt, size int64) *Windows {
	w := &Windows{r: r}
	if size <= headWindow+tailWindow {
		w.wins[0] = window{off: 0, n: size}
	} else {
		w.wins[0] = window{off: 0, n: headWindow}
		w.wins[1] = window{off: size - tailWindow, n: tailWindow}
	}
	return w
}

// Windows is Windowed's reader.
type Windows struct {
	r    io.ReaderAt
	wins [2]window
}

// windowBufs recycles the windows' memory.
var windowBufs = sync.Pool{New: func() any { b := make([]byte, headWindow+tailWindow); return &b }}

// window is bytes [off, off+n) of the archive, read once (tried).
type window struct {
	off, n int64
	tried  bool
	buf    []byte // nil until read, or when the read failed
	err    error  // the failed read's
	pooled *[]byte
}

// Release hands the windows' memory back; nothing read through w may be
// used after it, nor w itself.
func (w *Windows) Release() {
	for i := range w.wins {
		if b := w.wins[i].pooled; b != nil {
			windowBufs.Put(b)
		}
		w.wins[i] = window{}
	}
}

func (w *Windows) ReadAt(p []byte, off int64) (int, error) {
	win, err := w.window(off, int64(len(p)))
	if win == nil {
		return w.r.ReadAt(p, off)
	}
	if err != nil {
		return 0, err
	}
	return copy(p, win.buf[off-win.off:]), nil
}

// window is the window holding [off, off+n), read on first use, or nil.
func (w *Windows) window(off, n int64) (*window, error) {
	end := off + n
	for i := range w.wins {
		win := &w.wins[i]
		if win.n == 0 || off < win.off || end > win.off+win.n || n < 0 {
			continue
		}
		if !win.tried {
			win.tried = true
			win.pooled = windowBufs.Get().(*[]byte)
			buf := (*win.pooled)[:win.n]
			n, err := w.r.ReadAt(buf, win.off)
			switch {
			case n == len(buf) && (err == nil || err == io.EOF):
				win.buf = buf
			case err == nil || err == io.EOF:
				win.err = io.ErrUnexpectedEOF // r is shorter than its size
			default:
				win.err = err
			}
		}
		if win.buf == nil {
			return win, win.err
		}
		return win, nil
	}
	return nil, nil
}

// bytes is [off, off+n) of the archive: the window's own memory where a
// window holds it (valid until Release, not to be written), else read into
// new memory. A read that ends early is io.ErrUnexpectedEOF.
func (w *Windows) bytes(off, n int64) ([]byte, error) {
	win, err := w.window(off, n)
	if err != nil {
		return nil, err
	}
	if win != nil {
		return win.buf[off-win.off : off-win.off+n : off-win.off+n], nil
	}
	b := make([]byte, n)
	m, err := w.r.ReadAt(b, off)
	if m == len(b) {
		return b, nil
	}
	if err == nil || err == io.EOF {
		err = io.ErrUnexpectedEOF
	}
	return nil, err
}

// Held is [off, off+n) of the archive where a window already read holds it
// whole (the window's own memory: valid until Release, not to be written),
// else nil. It reads nothing: a locator hands on the bytes it read anyway.
func (w *Windows) Held(off, n int64) []byte {
	for i := range w.wins {
		win := &w.wins[i]
		if win.buf == nil || n < 0 || off < win.off || off-win.off > win.n-n {
			continue
		}
		return win.buf[off-win.off : off-win.off+n : off-win.off+n]
	}
	return nil
}
