package objstore

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"time"

	"github.com/ckptfs/ckptfs/layout/source"
)

// file is an object as it was at open: every read asks for that version.
type file struct {
	t    *Tree
	obj  Object
	url  string
	info source.Info

	// The object's read-ahead (ahead.go), guarded by t.ahead.mu.
	next  int64   // where the last large read ended: the frontier; -1 none yet
	spans []*span // fetched ahead, held
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
	done := 0
	ctx := f.t.requestCtx()
	for attempt := 1; ; attempt++ {
		n, err := f.t.store.Read(ctx, f.obj, p[done:], off+int64(done))
		if n < 0 || n > len(p)-done {
			n, err = 0, &ChangedError{fmt.Sprintf("the store answered %d bytes to a read of %d", n, len(p)-done)}
		}
		f.t.count.Bytes.Add(int64(n))
		done += n
		if err == nil && done < len(p) {
			err = &AttemptError{fmt.Sprintf("the response ended after %d of %d bytes", n, len(p)-done+n)}
		}
		if err == nil {
			return done, nil
		}
		var cut *AttemptError
		if !errors.As(err, &cut) || attempt >= f.t.limits.MaxAttempts || ctx.Err() != nil {
			f.t.count.Errors.Add(1)
			return done, f.readError(err)
		}
		f.t.count.Retries.Add(1)
		select {
		case <-time.After(resumeBackoff(attempt)):
		case <-ctx.Done():
		}
	}
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
