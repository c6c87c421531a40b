package objstore

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"sync/atomic"
	"time"

	"github.com/ckptfs/ckptfs/layout/source"
)

// file is an object as it was at open: every read asks for that version.
type file struct {
	t    *Tree
	obj  Object
	url  string
	info source.Info

	// The object's streams (ahead.go), guarded by t.ahead.mu.
	next       int64     // where the last large read or stream ended: the frontier; -1 none yet
	streams    []*stream // fetched or being fetched ahead, held
	tail       bool      // a small read past the first window came before any large one
	spans      []span    // bytes large reads were given, merged (pace.go)
	fillsAhead bool      // its readers come ahead of its streams' bodies (pace.go)
}

func (f *file) Info() source.Info { return f.info }
func (f *file) Close() error      { return nil }

// Check has nothing to do: each response was checked against the version,
// so a read that returned bytes returned the opened version's.
func (f *file) Check() error { return nil }

// ReadAt reads [off, off+len(p)) with ranged reads of the opened version.
// An attempt cut short or past its deadline is resumed from where it
// stopped, with the same pin and checks, so the bytes are all of one
// version or the read fails.
func (f *file) ReadAt(p []byte, off int64) (int, error) {
	if off < 0 {
		return 0, fmt.Errorf("%s: negative offset %d", f.url, off)
	}
	if len(p) == 0 {
		return 0, nil
	}
	if off >= f.info.Size {
		return 0, io.EOF
	}
	want := p[:min(int64(len(p)), f.info.Size-off)]
	n, ok, err := f.t.ahead.read(f, want, off)
	if !ok {
		n, ok, err = f.t.windows.read(f, want, off)
	}
	if !ok {
		n, err = f.read(want, off)
	}
	if err == nil && n < len(p) {
		err = io.EOF
	}
	return n, err
}

func (f *file) read(p []byte, off int64) (int, error) {
	n, err := f.readTo(f.t.requestCtx(), &sliceWriter{p: p}, off, int64(len(p)))
	return int(n), err
}

// readTo writes the n bytes at off to w, in one request unless an attempt
// ends early: the next attempt asks for the rest, with the same pin and
// checks.
func (f *file) readTo(ctx context.Context, w io.Writer, off, n int64) (int64, error) {
	var done int64
	w = countedWriter{w, &f.t.count.Bytes}
	for attempt := 1; ; attempt++ {
		m, err := f.t.store.Read(ctx, f.obj, w, off+done, n-done)
		if m < 0 || m > n-done {
			m, err = 0, &ChangedError{fmt.Sprintf("the store answered %d bytes to a read of %d", m, n-done)}
		}
		done += m
		if err == nil && done < n {
			err = &AttemptError{fmt.Sprintf("the response ended after %d of %d bytes", m, n-done+m)}
		}
		if err == nil {
			return done, nil
		}
		var cut *AttemptError
		if !errors.As(err, &cut) || attempt >= f.t.limits.MaxAttempts || ctx.Err() != nil {
			if ctx.Err() == nil { // not a request ended on purpose: a stream dropped, the tree closed
				f.t.count.Errors.Add(1)
			}
			return done, f.readError(err)
		}
		f.t.count.Retries.Add(1)
		select {
		case <-time.After(resumeBackoff(attempt)):
		case <-ctx.Done():
		}
	}
}

// countedWriter counts the body's bytes in n as they arrive, not as the
// attempt ends: a paced stream's attempt lasts as long as its readers
// (pace.go), and the bytes it read are fetched all the same.
type countedWriter struct {
	w io.Writer
	n *atomic.Int64
}

func (c countedWriter) Write(b []byte) (int, error) {
	k, err := c.w.Write(b)
	c.n.Add(int64(k))
	return k, err
}

// ReadFrom keeps w's own ReadFrom (the body read straight into its
// buffers), counting each read.
func (c countedWriter) ReadFrom(r io.Reader) (int64, error) {
	if rf, ok := c.w.(io.ReaderFrom); ok {
		return rf.ReadFrom(countedReader{r, c.n})
	}
	return io.Copy(writerOnly{c}, r)
}

type countedReader struct {
	r io.Reader
	n *atomic.Int64
}

func (c countedReader) Read(p []byte) (int, error) {
	k, err := c.r.Read(p)
	c.n.Add(int64(k))
	return k, err
}

// writerOnly hides ReadFrom from io.Copy.
type writerOnly struct{ io.Writer }

// sliceWriter is a Store.Read's destination in memory: the body is read
// straight into p.
type sliceWriter struct {
	p []byte
	n int
}

func (w *sliceWriter) Write(b []byte) (int, error) {
	k := copy(w.p[w.n:], b)
	w.n += k
	if k < len(b) {
		return k, io.ErrShortWrite
	}
	return k, nil
}

func (w *sliceWriter) ReadFrom(r io.Reader) (int64, error) {
	k, err := io.ReadFull(r, w.p[w.n:])
	w.n += k
	if err == io.EOF || err == io.ErrUnexpectedEOF {
		err = nil // the caller counts what it got
	}
	return int64(k), err
}

// readError names the object in a read's error.
func (f *file) readError(err error) error {
	var changed *ChangedError
	var cut *AttemptError
	switch {
	case errors.As(err, &changed):
		return fmt.Errorf("%w: %s: %s", source.ErrChanged, f.url, changed.Cause)
	case errors.As(err, &cut):
		return &fs.PathError{Op: "read", Path: f.url, Err: cut}
	}
	return &fs.PathError{Op: "read", Path: f.url, Err: RequestFailed(err)}
}
