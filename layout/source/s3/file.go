package s3

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"math/rand/v2"
	"strconv"
	"strings"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	awshttp "github.com/aws/aws-sdk-go-v2/aws/transport/http"
	awss3 "github.com/aws/aws-sdk-go-v2/service/s3"

	"github.com/ckptfs/ckptfs/layout/source"
)

// file is an object as it was at open: every read asks for that ETag.
type file struct {
	t    *Tree
	key  string
	url  string
	info source.Info
}

func (f *file) Info() source.Info { return f.info }
func (f *file) Close() error      { return nil }

// Check has nothing to do: each read was conditional on the ETag, so a
// read that returned bytes returned the opened version's.
func (f *file) Check() error { return nil }

// ReadAt reads [off, off+len(p)) with ranged GETs on the opened ETag. The
// SDK retries a request that fails before its body; a body cut short is
// resumed from where it stopped, with the same condition, so the bytes are
// all of one version or the read fails.
func (f *file) ReadAt(p []byte, off int64) (int, error) {
	if off < 0 {
		return 0, fmt.Errorf("s3: %s: negative offset %d", f.url, off)
	}
	if len(p) == 0 {
		return 0, nil
	}
	if off >= f.info.Size {
		return 0, io.EOF
	}
	want := p[:min(int64(len(p)), f.info.Size-off)]
	n, small, err := f.t.windows.read(f, want, off)
	if !small {
		n, err = f.read(want, off)
	}
	if err == nil && n < len(p) {
		err = io.EOF
	}
	return n, err
}

func (f *file) read(p []byte, off int64) (int, error) {
	done := 0
	for attempt := 1; ; attempt++ {
		n, err := f.get(p[done:], off+int64(done))
		done += n
		if err == nil {
			return done, nil
		}
		var cut *bodyError
		if !errors.As(err, &cut) || attempt >= f.t.opts.MaxAttempts || f.t.ctx.Err() != nil {
			f.t.count.errors.Add(1)
			return done, err
		}
		f.t.count.retries.Add(1)
		select {
		case <-time.After(backoff(attempt)):
		case <-f.t.ctx.Done():
		}
	}
}

// backoff is the delay before resuming a cut body: jittered exponential,
// as the SDK's retryer spaces its attempts.
func backoff(attempt int) time.Duration {
	d := min(50*time.Millisecond<<min(attempt-1, 10), 20*time.Second)
	return d/2 + rand.N(d/2+1)
}

// bodyError is a response body that ended before its range did. Like
// requestFailed, it keeps the cause as text only: a network errno deep in it
// (ECONNRESET) must not become the errno a reader of the mount gets.
type bodyError struct{ cause string }

func (e *bodyError) Error() string {
	return fmt.Sprintf("%v: response body cut: %s", ErrRequest, e.cause)
}
func (e *bodyError) Is(target error) bool { return target == ErrRequest }

// get is one ranged GET of len(p) bytes at off, If-Match the opened ETag.
func (f *file) get(p []byte, off int64) (int, error) {
	end := off + int64(len(p)) - 1
	out, err := f.t.client.GetObject(f.t.ctx, &awss3.GetObjectInput{
		Bucket:  &f.t.loc.Bucket,
		Key:     &f.key,
		Range:   aws.String(fmt.Sprintf("bytes=%d-%d", off, end)),
		IfMatch: aws.String(`"` + f.info.Version + `"`),
	})
	if err != nil {
		return 0, f.requestError(err)
	}
	defer out.Body.Close()
	if start, ok := rangeStart(aws.ToString(out.ContentRange)); !ok || start != off || aws.ToInt64(out.ContentLength) != int64(len(p)) {
		return 0, fmt.Errorf("s3: %s: asked for bytes %d-%d, got %q (%d bytes)", f.url, off, end,
			aws.ToString(out.ContentRange), aws.ToInt64(out.ContentLength))
	}
	n, err := io.ReadFull(out.Body, p)
	f.t.count.bytes.Add(int64(n))
	if err != nil {
		if errors.Is(err, context.Canceled) {
			return n, fmt.Errorf("s3: %s: %w", f.url, err)
		}
		return n, &fs.PathError{Op: "read", Path: f.url, Err: &bodyError{err.Error()}}
	}
	return n, nil
}

// requestError names the object and tells a changed object (412: the ETag
// no longer matches; 404: gone) from a failed request.
func (f *file) requestError(err error) error {
	var re *awshttp.ResponseError
	if errors.As(err, &re) {
		switch re.HTTPStatusCode() {
		case 412:
			return fmt.Errorf("%w: %s: its ETag is no longer %q (replaced or rewritten)", source.ErrChanged, f.url, f.info.Version)
		case 404:
			return fmt.Errorf("%w: %s vanished", source.ErrChanged, f.url)
		}
	}
	return &fs.PathError{Op: "read", Path: f.url, Err: requestFailed(err)}
}

// rangeStart parses the first byte of a Content-Range: "bytes 0-99/1000".
func rangeStart(cr string) (int64, bool) {
	rest, ok := strings.CutPrefix(cr, "bytes ")
	if !ok {
		return 0, false
	}
	first, _, ok := strings.Cut(rest, "-")
	if !ok {
		return 0, false
	}
	n, err := strconv.ParseInt(first, 10, 64)
	return n, err == nil
}
