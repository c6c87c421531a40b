package s3

import (
	"context"
	"errors"
	"fmt"
	"io"

	"github.com/aws/aws-sdk-go-v2/aws"
	awshttp "github.com/aws/aws-sdk-go-v2/aws/transport/http"
	awss3 "github.com/aws/aws-sdk-go-v2/service/s3"

	"github.com/ckptfs/ckptfs/layout/source/objstore"
)

// Read is one ranged GET of n bytes at off, If-Match the opened ETag,
// its body copied to w. The SDK retries a request that fails before its
// body; a body cut short or past its deadline is an
// *objstore.AttemptError, resumed by the tree.
func (s *store) Read(ctx context.Context, obj objstore.Object, w io.Writer, off, n int64) (int64, error) {
	out, err := s.client.GetObject(withAttemptBytes(ctx, n), &awss3.GetObjectInput{
		Bucket:  &s.bucket,
		Key:     &obj.Key,
		Range:   aws.String(fmt.Sprintf("bytes=%d-%d", off, off+n-1)),
		IfMatch: aws.String(`"` + obj.Version + `"`),
	})
	if err != nil {
		return 0, s.requestError(err, obj, n)
	}
	defer out.Body.Close()
	if err := verify(out, obj, off, n); err != nil {
		return 0, err
	}
	got, err := objstore.CopyBody(w, out.Body, n)
	switch {
	case err == nil:
		return got, nil
	case errors.Is(err, context.Canceled):
		return got, objstore.RequestFailed(err)
	case errors.Is(err, context.DeadlineExceeded): // the tree's context has none: the attempt's
		return got, &objstore.AttemptError{Cause: fmt.Sprintf("attempt deadline %v passed after %d of %d bytes", s.opts.attemptTimeout(n), got, n)}
	}
	return got, &objstore.AttemptError{Cause: fmt.Sprintf("response body cut: %v", err)}
}

// verify checks a response against the version opened and the range asked
// for: a store may ignore If-Match (or Range) and answer with another
// version's bytes, which must fail the read, not be served or retried into
// a success.
func verify(out *awss3.GetObjectOutput, obj objstore.Object, off, n int64) error {
	want := objstore.ContentRange{First: off, Last: off + n - 1, Size: obj.Size}
	var cause string
	if etag := normalizeETag(aws.ToString(out.ETag)); etag != obj.Version {
		cause = fmt.Sprintf("the store answered with ETag %q, not %q (If-Match ignored: replaced)", etag, obj.Version)
	} else if cr := aws.ToString(out.ContentRange); objstore.ParseContentRange(cr) != want {
		cause = fmt.Sprintf("asked for bytes %d-%d/%d, got Content-Range %q", want.First, want.Last, want.Size, cr)
	} else if cl := aws.ToInt64(out.ContentLength); cl != n {
		cause = fmt.Sprintf("asked for %d bytes at %d, got Content-Length %d", n, off, cl)
	} else {
		return nil
	}
	return &objstore.ChangedError{Cause: cause}
}

// requestError tells a changed object (412: the ETag no longer matches;
// 404: gone) and an attempt past its deadline (resumed like a cut body)
// from a failed request.
func (s *store) requestError(err error, obj objstore.Object, n int64) error {
	var re *awshttp.ResponseError
	if errors.As(err, &re) {
		switch re.HTTPStatusCode() {
		case 412:
			return &objstore.ChangedError{Cause: fmt.Sprintf("its ETag is no longer %q (replaced or rewritten)", obj.Version)}
		case 404:
			return &objstore.ChangedError{Cause: "vanished"}
		}
	}
	if errors.Is(err, context.DeadlineExceeded) {
		return &objstore.AttemptError{Cause: fmt.Sprintf("no response within the attempt deadline %v", s.opts.attemptTimeout(n))}
	}
	return objstore.RequestFailed(classify(err))
}
