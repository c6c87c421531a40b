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

// Check has nothing to do: each response was checked against the ETag, so
// a read that returned bytes returned the opened version's.
func (f *file) Check() error { return nil }

// ReadAt reads [off, off+len(p)) with ranged GETs on the opened ETag. The
// SDK retries a request that fails before its body; an attempt cut short
// or past its deadline is resumed from where it stopped, with the same
// condition and checks, so the bytes are all of one version or the read
// fails.
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
	ctx := f.t.requestCtx()
	for attempt := 1; ; attempt++ {
		n, err := f.get(ctx, p[done:], off+int64(done))
		done += n
		if err == nil {
			return done, nil
		}
		var cut *attemptError
		if !errors.As(err, &cut) || attempt >= f.t.opts.MaxAttempts || ctx.Err() != nil {
			f.t.count.errors.Add(1)
			return done, err
		}
		f.t.count.retries.Add(1)
		select {
		case <-time.After(backoff(attempt)):
		case <-ctx.Done():
		}
	}
}

// backoff is the delay before resuming an attempt: jittered exponential,
// as the SDK's retryer spaces its attempts.
func backoff(attempt int) time.Duration {
	d := min(50*time.Millisecond<<min(attempt-1, 10), 20*time.Second)
	return d/2 + rand.N(d/2+1)
}

// attemptError is an attempt that ended before its range did: its body was
// cut, or it passed its deadline. Like requestFailed, it keeps the cause as
// text only: a network errno deep in it (ECONNRESET) must not become the
// errno a reader of the mount gets, nor a deadline EINTR.
type attemptError struct{ cause string }

func (e *attemptError) Error() string        { return fmt.Sprintf("%v: %s", ErrRequest, e.cause) }
func (e *attemptError) Is(target error) bool { return target == ErrRequest }

// get is one ranged GET of len(p) bytes at off, If-Match the opened ETag.
func (f *file) get(ctx context.Context, p []byte, off int64) (int, error) {
	n := int64(len(p))
	out, err := f.t.client.GetObject(withAttemptBytes(ctx, n), &awss3.GetObjectInput{
		Bucket:  &f.t.loc.Bucket,
		Key:     &f.key,
		Range:   aws.String(fmt.Sprintf("bytes=%d-%d", off, off+n-1)),
		IfMatch: aws.String(`"` + f.info.Version + `"`),
	})
	if err != nil {
		return 0, f.requestError(err, n)
	}
	defer out.Body.Close()
	if err := f.verify(out, off, n); err != nil {
		return 0, err
	}
	got, err := io.ReadFull(out.Body, p)
	f.t.count.bytes.Add(int64(got))
	switch {
	case err == nil:
		return got, nil
	case errors.Is(err, context.Canceled):
		return got, fmt.Errorf("s3: %s: %w", f.url, err)
	case errors.Is(err, context.DeadlineExceeded): // the tree's context has none: the attempt's
		err = fmt.Errorf("attempt deadline %v passed after %d of %d bytes", f.t.opts.attemptTimeout(n), got, n)
	default:
		err = fmt.Errorf("response body cut: %v", err)
	}
	return got, &fs.PathError{Op: "read", Path: f.url, Err: &attemptError{err.Error()}}
}

// verify checks a response against the version opened and the range asked
// for: a store may ignore If-Match (or Range) and answer with another
// version's bytes, which must fail the read, not be served or retried into
// a success. One line names the object and what differed.
func (f *file) verify(out *awss3.GetObjectOutput, off, n int64) error {
	want := contentRange{off, off + n - 1, f.info.Size}
	var cause string
	if etag := normalizeETag(aws.ToString(out.ETag)); etag != f.info.Version {
		cause = fmt.Sprintf("the store answered with ETag %q, not %q (If-Match ignored: replaced)", etag, f.info.Version)
	} else if cr := aws.ToString(out.ContentRange); parseContentRange(cr) != want {
		cause = fmt.Sprintf("asked for bytes %d-%d/%d, got Content-Range %q", want.first, want.last, want.size, cr)
	} else if cl := aws.ToInt64(out.ContentLength); cl != n {
		cause = fmt.Sprintf("asked for %d bytes at %d, got Content-Length %d", n, off, cl)
	} else {
		return nil
	}
	return fmt.Errorf("%w: %s: %s", source.ErrChanged, f.url, cause)
}

// requestError names the object and tells a changed object (412: the ETag
// no longer matches; 404: gone) and an attempt past its deadline (resumed
// like a cut body) from a failed request.
func (f *file) requestError(err error, n int64) error {
	var re *awshttp.ResponseError
	if errors.As(err, &re) {
		switch re.HTTPStatusCode() {
		case 412:
			return fmt.Errorf("%w: %s: its ETag is no longer %q (replaced or rewritten)", source.ErrChanged, f.url, f.info.Version)
		case 404:
			return fmt.Errorf("%w: %s vanished", source.ErrChanged, f.url)
		}
	}
	if errors.Is(err, context.DeadlineExceeded) {
		cause := fmt.Sprintf("no response within the attempt deadline %v", f.t.opts.attemptTimeout(n))
		return &fs.PathError{Op: "read", Path: f.url, Err: &attemptError{cause}}
	}
	return &fs.PathError{Op: "read", Path: f.url, Err: requestFailed(err)}
}

// contentRange is a parsed Content-Range: "bytes FIRST-LAST/SIZE".
type contentRange struct{ first, last, size int64 }

// parseContentRange parses cr; anything else (an unknown size "*", no
// header at all) is the zero contentRange, which no request asks for.
func parseContentRange(cr string) contentRange {
	var r contentRange
	rest, ok := strings.CutPrefix(cr, "bytes ")
	first, rest, ok1 := strings.Cut(rest, "-")
	last, size, ok2 := strings.Cut(rest, "/")
	if !ok || !ok1 || !ok2 {
		return contentRange{}
	}
	var err [3]error
	r.first, err[0] = strconv.ParseInt(first, 10, 64)
	r.last, err[1] = strconv.ParseInt(last, 10, 64)
	r.size, err[2] = strconv.ParseInt(size, 10, 64)
	if errors.Join(err[:]...) != nil {
		return contentRange{}
	}
	return r
}
